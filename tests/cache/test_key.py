"""Cache keys and the in-process executable cache."""

from __future__ import annotations

import torch

from neuron_compile.cache import ExecutableCache, artifact_key


def test_equal_artifacts_give_equal_keys():
    assert artifact_key(b"abc", "xla_cpu").digest() == artifact_key(b"abc", "xla_cpu").digest()


def test_each_component_changes_the_key_and_is_explained():
    base = artifact_key(b"abc", "xla_cpu")
    assert base.explain(artifact_key(b"abd", "xla_cpu")) == ["artifact"]
    assert base.explain(artifact_key(b"abc", "neuronx_cc")) == ["executor"]
    assert base.digest() != artifact_key(b"abd", "xla_cpu").digest()


def test_lru_reuses_and_evicts():
    cache = ExecutableCache(capacity=2)
    made = []

    def make(tag):
        made.append(tag)
        return tag

    assert cache.get_or_create(artifact_key(b"1", "x"), lambda: make(1)) == (1, False)
    assert cache.get_or_create(artifact_key(b"1", "x"), lambda: make(99)) == (1, True)
    cache.get_or_create(artifact_key(b"2", "x"), lambda: make(2))
    cache.get_or_create(artifact_key(b"3", "x"), lambda: make(3))  # evicts 1
    assert cache.get_or_create(artifact_key(b"1", "x"), lambda: make(1))[1] is False
    assert made == [1, 2, 3, 1] and len(cache) == 2


def test_identical_graph_recompile_reuses_executable():
    import neuron_compile
    from neuron_compile.cache import executable_cache

    executable_cache.clear()
    for _ in range(2):
        torch._dynamo.reset()
        torch.compile(lambda x: x * 7 - 1, backend="neuron")(torch.ones(11))
    hits = [r.executor_cache_hit for r in neuron_compile.metrics()]
    assert hits == [False, True]
