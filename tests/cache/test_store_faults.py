"""Fault tests of the disk cache with real processes and real files (no filesystem mocks)."""

from __future__ import annotations

import fcntl
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from neuron_compile.cache.store import DiskCache

from .procs import Child, WarningCounter, cache, digest, key_of, payload, wait_for

COMPONENTS = {"neuronx-cc": "2.28.1", "flags": "[]"}
SIGKILL_TRIALS = 60


def _racer(root: str, key: str, counter: str, go: str) -> list[str]:
    def create() -> dict[str, bytes]:
        with open(counter, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(0.3)
        return payload(key, parts=3, size=50_000)

    wait_for(Path(go))
    files, source = cache(Path(root)).get_or_create(
        key, create, graph_name="race", components=COMPONENTS
    )
    return [digest(files), source]


def test_eight_processes_race_one_key_compile_once(tmp_path):
    key, counter, go = key_of("race"), tmp_path / "compiles.txt", tmp_path / "go"
    children = [Child(_racer, str(tmp_path / "c"), key, str(counter), str(go)) for _ in range(8)]
    go.touch()
    results = [c.result() for c in children]
    assert len(counter.read_text().splitlines()) == 1, "exactly one process compiled"
    assert {d for d, _s in results} == {digest(payload(key, parts=3, size=50_000))}
    assert sorted(s for _d, s in results) == ["compiled"] + ["disk"] * 7


def _slow_compile(root: str, key: str) -> float:
    start = time.monotonic()
    cache(Path(root)).get_or_create(
        key, lambda: time.sleep(1.0) or {"a": b"x"}, graph_name="g", components={}
    )
    return time.monotonic() - start


def test_different_keys_compile_in_parallel(tmp_path):
    start = time.monotonic()
    kids = [Child(_slow_compile, str(tmp_path), key_of(str(i))) for i in range(2)]
    assert all(c.result() >= 1.0 for c in kids)
    assert time.monotonic() - start < 1.8  # serialised would take >= 2.0 s


def _writer_loop(root: str, trial: int) -> None:
    c = cache(Path(root), max_bytes=600_000)  # small cap: kills also land inside eviction
    for j in range(1000):
        key = key_of(f"{trial}/{j}")
        c.put(key, payload(key, parts=4, size=40_000), graph_name="w", components={"j": str(j)})


def test_sigkill_during_put_never_serves_partial_entry(tmp_path):
    root, rng = tmp_path / "c", random.Random(8)
    reader = DiskCache(root, max_bytes=600_000)
    mid_write = complete_seen = 0
    for trial in range(SIGKILL_TRIALS):
        child = Child(_writer_loop, str(root), trial)
        time.sleep(rng.uniform(0.0, 0.04))
        child.kill()
        if any(p.name.startswith("w-") for p in (root / "tmp").iterdir()):
            mid_write += 1  # killed between staging and rename: the dangerous window
        for j in range(40):
            key = key_of(f"{trial}/{j}")
            entry = reader.get(key)
            if entry is not None:  # whole and verified, or nothing
                assert entry.files() == payload(key, parts=4, size=40_000)
                complete_seen += 1
        assert reader.verify() == []
        assert reader.stats()["quarantined"] == 0
    key = key_of("after")
    assert reader.put(key, payload(key), graph_name="w", components={}) is not None
    assert reader.get(key).files() == payload(key)
    assert not any(p.name.startswith("w-") for p in (root / "tmp").iterdir()), "stale tmp cleaned"
    print(f"\nSIGKILL trials: {SIGKILL_TRIALS}, killed mid-write: {mid_write}, ", end="")
    print(f"complete entries read back: {complete_seen}")
    assert SIGKILL_TRIALS >= 50 and mid_write > 0 and complete_seen > 0


@pytest.mark.parametrize("damage", ["bitflip", "truncate", "manifest", "extra_file"])
def test_corrupt_entry_is_quarantined_and_recompiled(tmp_path, damage, caplog):
    c, key = DiskCache(tmp_path), key_of(damage)
    entry = c.put(key, payload(key), graph_name="g", components=COMPONENTS)
    target = entry.path / ("manifest.json" if damage == "manifest" else "part1.bin")
    data = bytearray(target.read_bytes())
    if damage == "truncate":
        target.write_bytes(data[: len(data) // 2])
    elif damage == "extra_file":
        (entry.path / "stray.bin").write_bytes(b"?")
    else:
        data[len(data) // 3] ^= 0x10
        target.write_bytes(bytes(data))
    assert c.get(key) is None
    assert c.stats()["quarantined"] == 1
    assert [p.name.split(".")[0] for p in (tmp_path / "quarantine").iterdir()] == [key]
    assert "corrupt cache entry" in caplog.text
    calls = []
    files, source = c.get_or_create(
        key, lambda: calls.append(1) or payload(key), graph_name="g", components=COMPONENTS
    )
    assert (source, calls, files) == ("compiled", [1], payload(key))
    assert c.get(key).files() == payload(key)


def _hold_lock_then_hang(root: str, key: str, ready: str, leak_fd: bool) -> None:
    def create() -> dict[str, bytes]:
        if leak_fd:  # a leftover compiler child inherits the locked descriptor and outlives us
            lock = os.path.realpath(Path(root) / "locks" / f"{key}.lock")
            fd = next(int(f) for f in os.listdir("/proc/self/fd") if _fd_path(f) == lock)
            proc = subprocess.Popen(["sleep", "30"], pass_fds=[fd])
            Path(ready).with_suffix(".pid").write_text(str(proc.pid))
        Path(ready).touch()
        time.sleep(60)
        return {}

    cache(Path(root)).get_or_create(key, create, graph_name="g", components={})


def _fd_path(fd: str) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


@pytest.mark.parametrize("leak_fd", [False, True], ids=["holder-killed", "fd-inherited"])
def test_stale_lock_from_killed_holder_recovers_fast(tmp_path, leak_fd):
    root, key, ready = tmp_path / "c", key_of("stale"), tmp_path / "ready"
    holder = Child(_hold_lock_then_hang, str(root), key, str(ready), leak_fd)
    wait_for(ready)
    holder.kill()
    leftover = int(ready.with_suffix(".pid").read_text()) if leak_fd else None
    try:
        if leak_fd:  # prove the lock really is still held by the dead holder's descriptor
            fd = os.open(root / "locks" / f"{key}.lock", os.O_RDWR)
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.close(fd)
        start = time.monotonic()
        files, source = DiskCache(root, lock_timeout=600).get_or_create(
            key, lambda: {"a": b"ok"}, graph_name="g", components={}
        )
        elapsed = time.monotonic() - start
    finally:
        if leftover:
            os.kill(leftover, signal.SIGKILL)
    assert (files, source) == ({"a": b"ok"}, "compiled")
    assert elapsed < 5.0, f"took {elapsed:.1f}s with lock_timeout=600"


def _uncached_run(root: str, drop_to_uid: int | None, fsize_limit: int | None) -> dict:
    if drop_to_uid is not None:
        os.setgid(drop_to_uid)
        os.setuid(drop_to_uid)
    if fsize_limit is not None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # so writes fail with EFBIG, not a kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize_limit, resource.RLIM_INFINITY))
    warnings = WarningCounter()
    calls = []
    c = DiskCache(Path(root))
    key = key_of("uncached")
    files, source = c.get_or_create(
        key, lambda: calls.append(1) or {"big": b"x" * 1_000_000}, graph_name="g", components={}
    )
    files2, source2 = c.get_or_create(
        key, lambda: calls.append(2) or {"big": b"x" * 1_000_000}, graph_name="g", components={}
    )
    return {
        "sources": [source, source2],
        "ok": files == files2 == {"big": b"x" * 1_000_000},
        "calls": calls,
        "warnings": warnings.messages,
        "tmp_left": os.listdir(Path(root) / "tmp") if (Path(root) / "tmp").is_dir() else [],
    }


def _check_uncached(out: dict, needle: str) -> None:
    assert out["sources"] == ["uncached", "uncached"] and out["ok"] and out["calls"] == [1, 2]
    assert len(out["warnings"]) == 1, out["warnings"]
    assert needle in out["warnings"][0]
    assert out["tmp_left"] == []


def test_read_only_cache_dir_runs_uncached_with_one_warning(tmp_path):
    if os.geteuid() == 0:
        # root ignores mode bits, so the child drops to 'nobody' in a dir that user owns.
        base = Path(tempfile.mkdtemp(prefix="nc-ro-"))
        base.chmod(0o755)
        root = base / "cache"
        root.mkdir(mode=0o500)
        os.chown(root, 65534, 65534)
        uid = 65534
    else:
        root, uid = tmp_path / "cache", None
        root.mkdir(mode=0o500)
    try:
        _check_uncached(Child(_uncached_run, str(root), uid, None).result(), "not writable")
    finally:
        root.chmod(0o700)
        if uid is not None:
            shutil.rmtree(root.parent)


def test_cache_root_is_a_file_runs_uncached_with_one_warning(tmp_path):
    root = tmp_path / "cache"
    root.write_text("not a directory")
    _check_uncached(Child(_uncached_run, str(root), None, None).result(), "not a directory")


def test_full_disk_rlimit_fsize_runs_uncached_with_one_warning(tmp_path):
    out = Child(_uncached_run, str(tmp_path / "c"), None, 200_000).result()
    _check_uncached(out, "File too large")
    assert not list((tmp_path / "c" / "entries").rglob("manifest.json"))


_STANDALONE = """
import sys, types
from pathlib import Path
pkg = Path(sys.argv[1])
for name, path in (("neuron_compile", pkg), ("neuron_compile.cache", pkg / "cache")):
    mod = types.ModuleType(name)
    mod.__path__ = [str(path)]
    sys.modules[name] = mod
from neuron_compile.cache.store import DiskCache
c = DiskCache(Path(sys.argv[2]))
files, source = c.get_or_create("ab" * 32, lambda: {"a": b"1"}, graph_name="g", components={})
assert (files, source) == ({"a": b"1"}, "compiled"), source
assert c.get("ab" * 32).files() == {"a": b"1"}
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "jax", "jaxlib", "numpy"))
assert not heavy, heavy
print("ok")
"""


def test_store_runs_without_torch_or_jax(tmp_path):
    pkg = Path(__file__).resolve().parents[2] / "neuron_compile"
    out = subprocess.run(
        [sys.executable, "-c", _STANDALONE, str(pkg), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
