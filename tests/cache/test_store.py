"""DiskCache API: entries and manifests, tiers, stats, env config, negative entries, strict mode."""

from __future__ import annotations

import json
import os
import pickle
import threading
import time
from pathlib import Path

import pytest

from neuron_compile.cache.store import DEFAULT_MAX_BYTES, DiskCache
from neuron_compile.errors import CachedCompileFailure, CacheMissError

from .procs import Child, key_of, payload, wait_for

OLD = {"neuronx-cc": "2.28.1", "jaxlib": "0.10.2", "flags": '["--auto-cast"]', "module": "a" * 64}


def test_put_get_round_trip_and_manifest(tmp_path):
    c, key = DiskCache(tmp_path), key_of("k")
    files = {**payload(key), "nki/kernel.py": b"def k(): pass\n"}
    entry = c.put(key, files, graph_name="g", components=OLD, compile_seconds=12.5, meta={"x": 1})
    assert entry.path == tmp_path / "entries" / key[:2] / key
    manifest = json.loads((entry.path / "manifest.json").read_text())  # JSON, never pickle
    assert manifest["key"] == key and manifest["schema"] == 1 and manifest["graph_name"] == "g"
    assert manifest["components"] == OLD and manifest["compile_seconds"] == 12.5
    assert manifest["files"]["part0.bin"]["size"] == 4096 and manifest["meta"] == {"x": 1}
    got = DiskCache(tmp_path).get(key)
    assert got.files() == files and got.read("nki/kernel.py") == files["nki/kernel.py"]
    assert DiskCache(tmp_path).get(key_of("other")) is None


def test_bad_keys_and_names_are_caller_errors(tmp_path):
    c = DiskCache(tmp_path)
    with pytest.raises(ValueError):
        c.get("ABC")
    for name in ("../x", "/abs", "a/../b", ".hidden", "manifest.json", ""):
        with pytest.raises(ValueError):
            c.put(key_of("n"), {name: b"1"}, graph_name="g", components={})


def test_get_or_create_sources_stats_and_compile_seconds(tmp_path):
    c, key = DiskCache(tmp_path), key_of("s")
    files, source = c.get_or_create(
        key, lambda: time.sleep(0.05) or payload(key), graph_name="g", components=OLD
    )
    assert source == "compiled" and files == payload(key)
    assert c.get(key).manifest["compile_seconds"] >= 0.05
    fresh = DiskCache(tmp_path)
    assert fresh.get_or_create(key, lambda: 1 / 0, graph_name="g", components=OLD)[1] == "disk"
    stats = fresh.stats()
    assert stats["disk_hits"] == 1 and stats["disk_misses"] == 0
    assert stats["compile_seconds_saved"] >= 0.05 and stats["bytes_read"] == 3 * 4096
    assert stats["entries"] == 1 and stats["total_bytes"] == fresh.du() > 3 * 4096
    assert c.stats()["compiles"] == 1 and c.stats()["bytes_written"] == 3 * 4096


def test_remote_tier_read_through_and_promote(tmp_path):
    remote = tmp_path / "remote"
    remote.mkdir(mode=0o700)
    a, key = DiskCache(tmp_path / "a", remote=remote), key_of("r")
    a.put(key, payload(key), graph_name="g", components=OLD)
    assert a.promote() == 1 and a.promote() == 0  # already there
    b = DiskCache(tmp_path / "b", remote=remote)
    files, source = b.get_or_create(key, lambda: 1 / 0, graph_name="g", components=OLD)
    assert (files, source) == (payload(key), "remote")
    assert b.stats()["remote_hits"] == 1 and b.stats()["disk_misses"] == 1
    assert b.get_or_create(key, lambda: 1 / 0, graph_name="g", components=OLD)[1] == "disk"
    # a corrupt remote entry is never served
    other = key_of("r2")
    a.put(other, payload(other), graph_name="g", components=OLD)
    a.promote([other])
    (remote / "entries" / other[:2] / other / "part0.bin").write_bytes(b"junk")
    assert DiskCache(tmp_path / "c", remote=remote).get(other) is None


def test_lru_eviction_keeps_total_under_cap(tmp_path):
    c = DiskCache(tmp_path, max_bytes=40_000)
    keys = [key_of(f"e{i}") for i in range(3)]
    for k in keys:  # each entry ~12.5 KB on disk
        c.put(k, payload(k), graph_name="g", components={})
        time.sleep(0.01)
    c.get(keys[0])  # touch: keys[1] is now least recently accessed
    new = key_of("e3")
    c.put(new, payload(new), graph_name="g", components={})
    assert {e.key for e in c.entries()} == {keys[0], keys[2], new}
    assert c.du() <= 40_000 and c.stats()["evicted"] == 1
    assert c.put(key_of("huge"), {"x": b"0" * 50_000}, graph_name="g", components={}) is None


def _hold_entry(root: str, key: str, ready: str, release: str) -> bool:
    with DiskCache(Path(root)).hold(key) as entry:
        Path(ready).touch()
        wait_for(Path(release), timeout=30)
        return entry is not None and entry.files() == payload(key)


def test_eviction_never_deletes_an_entry_held_by_a_reader(tmp_path):
    c = DiskCache(tmp_path / "c", max_bytes=30_000)
    held, second = key_of("held"), key_of("second")
    for k in (held, second):
        c.put(k, payload(k), graph_name="g", components={})
        time.sleep(0.01)
    ready, release = tmp_path / "ready", tmp_path / "release"
    reader = Child(_hold_entry, str(tmp_path / "c"), held, str(ready), str(release))
    wait_for(ready)
    os.utime(c.get(held).path / "last_access", (1, 1))  # make the held entry the LRU victim
    third = key_of("third")
    c.put(third, payload(third), graph_name="g", components={})
    assert {e.key for e in c.entries()} == {held, third}, "the held LRU entry was skipped"
    release.touch()
    assert reader.result() is True  # the reader read intact files throughout
    fourth = key_of("fourth")
    c.put(fourth, payload(fourth), graph_name="g", components={})
    assert held not in {e.key for e in c.entries()}  # evictable once released
    assert c.prune(older_than=0.0) and c.entries() == []


def _put_in_turns(root: str, name: str, turns: str, mine: list[list[int]]) -> int:
    """Put ``len(batch)`` entries at each of this writer's turns (``go<t>`` .. ``done<t>``)."""
    c = DiskCache(Path(root), max_bytes=100_000)
    for turn, batch in mine:
        wait_for(Path(turns) / f"go{turn}", timeout=30)
        for i in batch:
            k = key_of(f"{name}{i}")
            c.put(k, payload(k), graph_name=name, components={})
        (Path(turns) / f"done{turn}").touch()
    return int(c.stats(scan=False)["evicted"])


def test_two_writers_at_once_keep_the_cap(tmp_path):
    """Each writer used to add only its own puts to the size it last walked, so two processes
    writing in turns each saw half the growth: 14 entries of ~12.5 KB under a 100 KB cap, none
    evicted. The ledger they share walks as soon as the sum passes the cap."""
    root, turns = tmp_path / "c", tmp_path / "turns"
    turns.mkdir()
    a = Child(_put_in_turns, str(root), "a", str(turns), [(0, [0]), (2, list(range(1, 7)))])
    b = Child(_put_in_turns, str(root), "b", str(turns), [(1, [0]), (3, list(range(1, 7)))])
    for turn in range(4):
        (turns / f"go{turn}").touch()
        wait_for(turns / f"done{turn}", timeout=30)
    evicted = a.result() + b.result()
    cache = DiskCache(root)
    assert cache.du() <= 100_000, f"{cache.du()} bytes on disk, {evicted} evicted"
    assert evicted >= 6 and len(cache.entries()) >= 6  # the newest entries stay


def test_negative_entries_ttl_and_retry(tmp_path, monkeypatch):
    key, calls = key_of("fail"), []

    def boom():
        calls.append(1)
        raise RuntimeError("neuronx-cc crashed: NCC_EVRF065\ndetails...")

    c = DiskCache(tmp_path, failure_ttl=3600)
    with pytest.raises(RuntimeError, match="NCC_EVRF065"):  # the original error first
        c.get_or_create(key, boom, graph_name="g", components=OLD)
    record = c.failure(key)
    assert record["error_type"] == "builtins.RuntimeError" and len(record["fingerprint"]) == 64
    assert "details" in record["message"]
    with pytest.raises(CachedCompileFailure) as info:
        c.get_or_create(key, boom, graph_name="g", components=OLD)
    err = info.value
    assert err.code == "NC402" and calls == [1] and "RETRY_FAILED=1" in str(err)
    assert "retried automatically after" in str(err)
    assert pickle.loads(pickle.dumps(err)).fingerprint == record["fingerprint"]
    with pytest.raises(RuntimeError):  # retry_failed forces a new attempt
        DiskCache(tmp_path, retry_failed=True).get_or_create(
            key, boom, graph_name="g", components=OLD
        )
    monkeypatch.setenv("NEURON_COMPILE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("NEURON_COMPILE_CACHE_RETRY_FAILED", "1")
    env_cache = DiskCache.from_env()
    assert env_cache.get_or_create(key, lambda: {"a": b"1"}, graph_name="g", components=OLD)[1] == (
        "compiled"
    )
    assert c.failure(key) is None and calls == [1, 1]  # success clears the record
    other = key_of("fail2")
    with pytest.raises(RuntimeError):
        c.get_or_create(other, boom, graph_name="g", components=OLD)
    record = json.loads(c._failure_path(other).read_text())  # age the record past the TTL
    c._failure_path(other).write_text(json.dumps({**record, "created": time.time() - 3601}))
    with pytest.raises(RuntimeError):  # retried automatically, not a CachedCompileFailure
        c.get_or_create(other, boom, graph_name="g", components=OLD)
    assert calls == [1, 1, 1, 1]  # boom ran again: not a CachedCompileFailure
    assert c.get_or_create(key_of("ok"), lambda: {"a": b"1"}, graph_name="g", components=OLD)


def test_strict_mode_miss_lists_components_and_explains(tmp_path, monkeypatch):
    DiskCache(tmp_path).put(key_of("old"), {"a": b"1"}, graph_name="g", components=OLD)
    new = {**OLD, "neuronx-cc": "2.28.7", "flags": '["--auto-cast", "--other-flag-that-is-long"]'}
    monkeypatch.setenv("NEURON_COMPILE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("NEURON_COMPILE_CACHE_ONLY", "1")
    strict = DiskCache.from_env()
    with pytest.raises(CacheMissError) as info:
        strict.get_or_create(key_of("new"), lambda: 1 / 0, graph_name="g", components=new)
    text = str(info.value)
    assert (
        info.value.code == "NC401" and "neuronx-cc = 2.28.7" in text and "jaxlib = 0.10.2" in text
    )
    assert "neuronx-cc: 2.28.1 → 2.28.7" in text
    assert info.value.explanation == ["flags: changed", "neuronx-cc: 2.28.1 → 2.28.7"]
    assert strict.explain_miss("other-graph", new) == []
    assert strict.explain_miss("g", {**OLD, "module": "b" * 64}) == ["module: changed"]


def test_from_env(tmp_path, monkeypatch):
    for off in ("off", "0", ""):
        monkeypatch.setenv("NEURON_COMPILE_CACHE_DIR", off)
        assert DiskCache.from_env() is None
    monkeypatch.delenv("NEURON_COMPILE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    c = DiskCache.from_env()
    assert c.root == tmp_path / "xdg" / "neuron-compile" and c.max_bytes == DEFAULT_MAX_BYTES
    monkeypatch.setenv("NEURON_COMPILE_CACHE_MAX_BYTES", "2G")
    monkeypatch.setenv("NEURON_COMPILE_REMOTE_CACHE", str(tmp_path))
    monkeypatch.setenv("NEURON_COMPILE_CACHE_FAILURE_TTL", "60")
    c = DiskCache.from_env()
    assert (c.max_bytes, c.remote, c.failure_ttl) == (2 * 2**30, tmp_path, 60.0)


def test_prune_by_component_and_clear(tmp_path):
    c = DiskCache(tmp_path)
    old, new, other = key_of("p-old"), key_of("p-new"), key_of("p-other")
    c.put(old, {"a": b"1"}, graph_name="g", components=OLD)
    c.put(new, {"a": b"1"}, graph_name="g", components={**OLD, "neuronx-cc": "2.28.7"})
    c.put(other, {"a": b"1"}, graph_name="g", components={"jaxlib": "0.10.2"})
    cpu_only = key_of("p-cpu")  # made without neuronx-cc: not an old version of it
    c.put(cpu_only, {"a": b"1"}, graph_name="g", components={**OLD, "neuronx-cc": "absent"})
    assert c.prune(keep_component={"neuronx-cc": "2.28.7"}) == [old]
    assert c.clear() == 3
    assert c.prune(older_than=3600) == []
    c.put(new, {"a": b"1"}, graph_name="g", components={**OLD, "neuronx-cc": "2.28.7"})
    with pytest.raises(ValueError, match=">= 0"):
        c.prune(older_than=-5 * 86400)  # a negative age matched every entry
    assert {e.key for e in c.entries()} == {new} and c.clear() == 1 and c.du() == 0


def test_threads_of_one_process_compile_once(tmp_path):
    c, key, calls, sources = DiskCache(tmp_path), key_of("threads"), [], []

    def create():
        calls.append(1)
        time.sleep(0.2)
        return payload(key)

    def run():
        sources.append(c.get_or_create(key, create, graph_name="g", components={})[1])

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [1] and sorted(sources) == ["compiled", "disk", "disk", "disk"]


def test_local_only_entries_are_not_promoted(tmp_path):
    remote = tmp_path / "remote"
    remote.mkdir(mode=0o700)
    c, key = DiskCache(tmp_path / "c", remote=remote), key_of("exe")
    c.put(key, {"executable.xla_cpu": b"x"}, graph_name="g", components={}, meta={"local_only": 1})
    assert c.promote() == 0 and DiskCache(remote).entries() == []


def test_one_miss_is_counted_once(tmp_path):
    c, key = DiskCache(tmp_path), key_of("count")
    c.get_or_create(key, lambda: {"a": b"1"}, graph_name="g", components={})
    assert (c.stats()["disk_misses"], c.stats()["disk_hits"], c.stats()["compiles"]) == (1, 0, 1)
