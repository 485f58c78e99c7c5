"""Shared fixtures. Hardware tests carry @pytest.mark.neuron and skip without a Neuron device."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
# Example models double as test models: the examples are what users run, so parity is checked on them.
sys.path.insert(0, str(ROOT / "examples"))


def _has_neuron_device() -> bool:
    return shutil.which("neuron-ls") is not None or os.path.exists("/dev/neuron0")


def pytest_collection_modifyitems(config, items):
    if _has_neuron_device():
        return
    skip = pytest.mark.skip(reason="needs a Trainium device and the Neuron SDK")
    for item in items:
        if "neuron" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_dynamo(tmp_path_factory, monkeypatch):
    """Every test starts with an empty Dynamo cache, disk cache and metrics, so compile counts
    are its own and nothing is written under ~/.cache. (The in-process executable LRU is kept:
    it only saves XLA compiles of identical graphs.)"""
    import neuron_compile

    monkeypatch.setenv("NEURON_COMPILE_CACHE_DIR", str(tmp_path_factory.mktemp("nc-cache")))
    # torch's caches too: the AOTAutogradCache entries of neuron_compile/aot_cache.py live there.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.mktemp("torch-cache")))
    torch._dynamo.reset()
    neuron_compile.reset_metrics()
    yield
    torch._dynamo.reset()
