"""Fixtures for the Trainium tests: the neuronx-cc *test double* on PATH.

``doubles/neuronx-cc`` is a test double, not AWS's compiler (see ``doubles/neuronx_cc_double.py``):
it validates argv against the documented CLI, parses the input with jaxlib, and writes a NEFF
placeholder, fails with a documented-format ``NCC_`` line, or sleeps, as the env vars set here
ask.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

DOUBLES = Path(__file__).parent / "doubles"


class Double:
    """Controls for the neuronx-cc double of one test."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, log: Path) -> None:
        self._mp = monkeypatch
        self.log = log
        self.path = str(DOUBLES / "neuronx-cc")

    def mode(self, mode: str, **env: str) -> None:
        self._mp.setenv("NEURONX_CC_DOUBLE_MODE", mode)
        for k, v in env.items():
            self._mp.setenv(f"NEURONX_CC_DOUBLE_{k.upper()}", v)

    def calls(self) -> list[list[str]]:
        """argv of every ``compile`` invocation so far."""
        if not self.log.exists():
            return []
        rows = [json.loads(line)["argv"] for line in self.log.read_text().splitlines()]
        return [r for r in rows if r[:1] == ["compile"]]


@pytest.fixture
def double(monkeypatch, tmp_path) -> Double:
    from neuron_compile.trainium import neff, neuronx_cc

    monkeypatch.setenv("PATH", f"{DOUBLES}:{__import__('os').environ.get('PATH', '')}")
    monkeypatch.setenv("NEURONX_CC_DOUBLE_PYTHON", sys.executable)
    monkeypatch.setenv("NEURONX_CC_DOUBLE_LOG", str(tmp_path / "double.log"))
    monkeypatch.delenv("NEURON_COMPILE_NEURONX_CC", raising=False)
    monkeypatch.delenv("NEURON_CC_FLAGS", raising=False)
    monkeypatch.setenv("NEURONX_CC_DOUBLE_MODE", "ok")
    neuronx_cc._version.cache_clear()
    neff._said.clear()
    return Double(monkeypatch, tmp_path / "double.log")


@pytest.fixture
def no_neuronx_cc(monkeypatch):
    """No compiler anywhere: PATH without neuronx-cc and the env override unset."""
    from neuron_compile.trainium import neff

    monkeypatch.setenv("NEURON_COMPILE_NEURONX_CC", "/nonexistent/neuronx-cc")
    neff._said.clear()
