"""``neuron_compile.reset()`` forgets every piece of process state; the warn-once and versions
helpers every module shares."""

from __future__ import annotations

import warnings

import pytest
import torch

import neuron_compile
from neuron_compile import shapes
from neuron_compile.cache import key as key_mod
from neuron_compile.cache import settings
from neuron_compile.cache.memory import executable_cache
from neuron_compile.cache.tiers import cache_stats
from neuron_compile.lowering import reference
from neuron_compile.metrics import record_bucket_hit
from neuron_compile.trainium import neff
from neuron_compile.trainium.kernels import nki as nki_mod
from neuron_compile.versions import dist_version, toolchain_versions, versions
from neuron_compile.warn_once import first_time, once_set, reset_warn_once, warn_once
from tests.custom_ops import CPU_SCAN, cpu_scan


def _fill() -> None:
    """Compile and run a model with a CPU fallback twice (a recompile), record a bucket hit and
    show every warn-once warning of the modules we can reach."""
    torch._dynamo.reset()

    def fn(x):
        return torch.tanh(cpu_scan(x * 2)) + 1

    compiled = torch.compile(fn, backend="neuron")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled(torch.randn(4, 3))
        compiled(torch.randn(5, 3))  # a new shape: recompile
        nki_mod.warn_fallback("resettest::op", "testing")
        neff._say_once("reset-test", "testing")
    record_bucket_hit("test", 8, 5, 8)
    settings._warn_once("NEURON_COMPILE_TEST", "x", "bad", "good", "default")
    nki_mod._CONFIGS["resettest::op"] = object()  # type: ignore[assignment]
    toolchain_versions()


def test_reset_empties_every_piece_of_state():
    neuron_compile.reset()
    _fill()
    assert neuron_compile.metrics() and neuron_compile.bucket_metrics()
    assert neuron_compile.get_fallback_ops() == {CPU_SCAN: 2}
    assert neuron_compile.recompiles()
    assert len(executable_cache) and executable_cache.misses
    assert "resettest::op" in nki_mod._WARNED and "reset-test" in neff._said
    assert settings._warned and nki_mod._CONFIGS
    assert toolchain_versions.cache_info().currsize == 1

    neuron_compile.reset()

    assert list(neuron_compile.metrics()) == [] and neuron_compile.bucket_metrics() == []
    assert neuron_compile.get_fallback_ops() == {}
    assert neuron_compile.recompiles() == []
    assert not shapes._frames and not shapes._graph_counter and not shapes._warmup["done"]
    assert len(executable_cache) == 0
    stats = cache_stats()
    assert stats["memory_hits"] == stats["memory_misses"] == 0
    assert not reference._TRACES
    assert not nki_mod._WARNED and not neff._said and not settings._warned
    assert not nki_mod._CONFIGS
    assert toolchain_versions.cache_info().currsize == 0
    assert key_mod.package_source_hash.cache_info().currsize == 0


def test_after_reset_warnings_show_again_once():
    neuron_compile.reset()
    for _ in range(2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            nki_mod.warn_fallback("resettest::again", "testing")
            nki_mod.warn_fallback("resettest::again", "testing")
        assert len(caught) == 1 and "resettest::again" in str(caught[0].message)
        neuron_compile.reset()


def test_warn_once_helper():
    seen = once_set()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert warn_once(seen, "k", "first", RuntimeWarning) is True
        assert warn_once(seen, "k", "second", RuntimeWarning) is False
    assert [(w.category, str(w.message)) for w in caught] == [(RuntimeWarning, "first")]
    assert caught[0].filename == __file__  # stacklevel counts from the caller
    assert first_time(seen, "other") and not first_time(seen, "other")
    reset_warn_once()
    assert not seen and first_time(seen, "k")


def test_versions_are_collected_in_one_place():
    assert dist_version("no-such-distribution-xyz") == "absent"
    assert dist_version("torch") != "absent"
    v = versions()
    assert v["neuron_compile"] == neuron_compile.__version__
    assert {k: v[k] for k in toolchain_versions()} == toolchain_versions()
    assert key_mod.toolchain_versions is toolchain_versions  # the cache key's components


@pytest.fixture(autouse=True)
def _clean():
    yield
    neuron_compile.reset()
