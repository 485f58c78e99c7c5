"""A big cache must not make every compile slower: puts and miss explanations stay O(1)-ish."""

from __future__ import annotations

from neuron_compile.cache import maintenance, store
from neuron_compile.cache.store import DiskCache

from .procs import key_of, payload


def _count_calls(monkeypatch, module, name):
    calls = [0]
    real = getattr(module, name)

    def counting(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counting)
    return calls


def test_puts_walk_the_cache_only_when_the_estimate_passes_the_cap(tmp_path, monkeypatch):
    walks = _count_calls(monkeypatch, maintenance, "tree_size")
    c = DiskCache(tmp_path, max_bytes=40 * 3 * 4096)
    for i in range(10):
        c.put(key_of(f"s{i}"), payload(key_of(f"s{i}")), graph_name="g", components={})
    first_walk = walks[0]
    assert first_walk <= 1  # one walk, at the first put, over the (then single) entry
    for i in range(10, 30):  # still under the cap: no walk
        c.put(key_of(f"s{i}"), payload(key_of(f"s{i}")), graph_name="g", components={})
    assert walks[0] == first_walk
    for i in range(30, 45):  # past the cap: walks and evicts down to it
        c.put(key_of(f"s{i}"), payload(key_of(f"s{i}")), graph_name="g", components={})
    assert walks[0] > first_walk
    assert c.du() <= c.max_bytes


def test_explaining_a_miss_reads_only_that_graphs_manifests(tmp_path, monkeypatch):
    c = DiskCache(tmp_path)
    for i in range(40):
        c.put(
            key_of(f"a{i}"), payload(key_of(f"a{i}"), 1), graph_name="a", components={"v": str(i)}
        )
    c.put(key_of("b"), payload(key_of("b"), 1), graph_name="b", components={"v": "1"})
    reads = _count_calls(monkeypatch, store, "parse_manifest")
    assert c.explain_miss("b", {"v": "2"}) == ["v: 1 → 2"]
    assert reads[0] == 1
    c.clear()
    assert c.explain_miss("b", {"v": "2"}) == []  # markers of cleared entries go too
