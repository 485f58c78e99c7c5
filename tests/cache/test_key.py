"""Cache keys and the in-process executable cache."""

from __future__ import annotations

import torch

from neuron_compile.cache import CacheKey, ExecutableCache


def _key(**parts: str) -> CacheKey:
    return CacheKey(tuple(sorted(parts.items())))


def test_each_component_changes_the_key_and_is_explained():
    base = _key(artifact="abc", executor="xla_cpu")
    assert base.digest() == _key(executor="xla_cpu", artifact="abc").digest()
    assert base.explain(_key(artifact="abd", executor="xla_cpu")) == ["artifact"]
    assert base.explain(_key(artifact="abc", executor="neuronx_cc")) == ["executor"]
    assert base.digest() != _key(artifact="abd", executor="xla_cpu").digest()


def test_lru_reuses_and_evicts():
    cache = ExecutableCache(capacity=2)
    made = []

    def make(tag):
        made.append(tag)
        return tag

    assert cache.get_or_create(_key(artifact="1"), lambda: make(1)) == (1, False)
    assert cache.get_or_create(_key(artifact="1"), lambda: make(99)) == (1, True)
    cache.get_or_create(_key(artifact="2"), lambda: make(2))
    cache.get_or_create(_key(artifact="3"), lambda: make(3))  # evicts 1
    assert cache.get_or_create(_key(artifact="1"), lambda: make(1))[1] is False
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
