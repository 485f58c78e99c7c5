"""Unsafe cache directories are refused (warn once, run uncached); symlinks are never followed."""

from __future__ import annotations

import logging
import os

import pytest

from neuron_compile.cache.manifest import entry_path
from neuron_compile.cache.store import DiskCache

from .procs import key_of, payload


def _run(c: DiskCache) -> str:
    key = key_of("sec")
    return c.get_or_create(key, lambda: payload(key), graph_name="g", components={})[1]


@pytest.mark.parametrize("mode", [0o770, 0o707])
def test_group_or_other_writable_root_is_refused_unless_allowed(tmp_path, caplog, mode):
    root = tmp_path / "shared"
    root.mkdir()
    root.chmod(mode)
    caplog.set_level(logging.WARNING, logger="neuron_compile.cache")
    c = DiskCache(root)
    assert not c.enabled and _run(c) == "uncached" and _run(c) == "uncached"
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "[NC404]" in warnings[0].getMessage()
    assert "writable by group or others" in warnings[0].getMessage()
    assert not (root / "entries").exists()
    assert _run(DiskCache(root, allow_shared_writable=True)) == "compiled"


def test_root_owned_by_another_user_is_refused(tmp_path, caplog, monkeypatch):
    root = tmp_path / "theirs"
    root.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(root, 65534, 65534)
    else:
        pytest.skip("needs root to create a directory owned by another user")
    assert not DiskCache(root).enabled and "owned by uid 65534" in caplog.text
    monkeypatch.setenv("NEURON_COMPILE_CACHE_DIR", str(root))
    monkeypatch.setenv("NEURON_COMPILE_CACHE_ALLOW_SHARED", "1")
    assert DiskCache.from_env().enabled


def test_remote_writable_by_others_is_refused(tmp_path, caplog):
    remote = tmp_path / "remote"
    remote.mkdir()
    remote.chmod(0o777)
    c = DiskCache(tmp_path / "local", remote=remote)
    assert c.enabled and not c.remote_enabled and "not using remote cache" in caplog.text


def test_symlinked_entry_dir_is_rejected_and_quarantined(tmp_path):
    outside = DiskCache(tmp_path / "outside")
    key = key_of("link")
    real = outside.put(key, payload(key), graph_name="g", components={})
    c = DiskCache(tmp_path / "c")
    link = tmp_path / "c" / "entries" / key[:2] / key
    link.parent.mkdir(parents=True)
    os.symlink(real.path, link)
    assert c.get(key) is None
    assert not link.is_symlink() and real.path.is_dir()  # the link moved away, target untouched
    assert c.stats()["quarantined"] == 1


@pytest.mark.parametrize("what", ["artifact", "manifest", "extra"])
def test_symlink_inside_entry_is_rejected(tmp_path, what):
    c, key = DiskCache(tmp_path / "c"), key_of(what)
    entry = c.put(key, payload(key), graph_name="g", components={})
    secret = tmp_path / "secret"
    secret.write_bytes(payload(key)["part0.bin"])  # same bytes: only the symlink is wrong
    name = {"artifact": "part0.bin", "manifest": "manifest.json", "extra": "more.bin"}[what]
    if what == "manifest":
        secret.write_bytes((entry.path / name).read_bytes())
    if (entry.path / name).exists():
        (entry.path / name).unlink()
    os.symlink(secret, entry.path / name)
    assert c.get(key) is None and c.stats()["quarantined"] == 1
    assert secret.exists()


def test_removing_a_symlinked_entry_never_touches_its_target(tmp_path):
    outside = DiskCache(tmp_path / "outside")
    key = key_of("evict-link")
    real = outside.put(key, payload(key), graph_name="g", components={})
    c = DiskCache(tmp_path / "c")
    link = tmp_path / "c" / "entries" / key[:2] / key
    link.parent.mkdir(parents=True)
    os.symlink(real.path, link)
    c.clear()
    assert not link.is_symlink() and outside.get(key).files() == payload(key)
    assert list((tmp_path / "c" / "tmp").iterdir()) == []


def _hand_over(path, how: str) -> None:
    """Make ``path`` another user's to write: chown it away (as root), or open its mode."""
    if how == "other owner" and os.geteuid() == 0:
        os.chown(path, 65534, 65534)
    else:
        path.chmod(0o777 if path.is_dir() else 0o666)


def _remote_with_entry(tmp_path):
    remote = tmp_path / "remote"
    key = key_of("remote")
    DiskCache(remote).put(key, payload(key), graph_name="g", components={})
    remote.chmod(0o755)  # a shared tier readable by the team: only its owner writes
    return remote, key


@pytest.mark.parametrize("how", ["other owner", "open mode"])
def test_remote_subdirectory_another_user_may_write_disables_the_tier(tmp_path, caplog, how):
    remote, key = _remote_with_entry(tmp_path)
    _hand_over(remote / "entries", how)
    caplog.set_level(logging.WARNING, logger="neuron_compile.cache")
    c = DiskCache(tmp_path / "local", remote=remote)
    assert c.enabled and not c.remote_enabled and c.get(key) is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "[NC404]" in warnings[0] and "entries/" in warnings[0]
    assert DiskCache(tmp_path / "l2", remote=remote, allow_shared_writable=True).get(key)


@pytest.mark.parametrize("level", ["shard", "entry", "file"])
@pytest.mark.parametrize("how", ["other owner", "open mode"])
def test_remote_entry_another_user_may_write_is_refused_and_left_alone(tmp_path, level, how):
    remote, key = _remote_with_entry(tmp_path)
    entry = entry_path(remote, key)
    _hand_over({"shard": entry.parent, "entry": entry, "file": entry / "part0.bin"}[level], how)
    c = DiskCache(tmp_path / "local", remote=remote)
    assert c.remote_enabled and c.get(key) is None  # a miss: neither served nor copied
    assert not entry_path(tmp_path / "local", key).exists() and entry.exists()


@pytest.mark.parametrize("how", ["other owner", "open mode"])
def test_local_subdirectory_another_user_may_write_disables_the_cache(tmp_path, caplog, how):
    root = tmp_path / "c"
    key = key_of("local")
    DiskCache(root).put(key, payload(key), graph_name="g", components={})
    _hand_over(root / "entries", how)
    caplog.set_level(logging.WARNING, logger="neuron_compile.cache")
    c = DiskCache(root)
    assert not c.enabled and _run(c) == "uncached"
    assert "[NC404]" in caplog.text and "entries/" in caplog.text


def test_entries_written_under_a_group_writable_umask_are_still_ours(tmp_path):
    """Ownership checks refuse group-writable entry files: the store must never write one,
    whatever the umask (002 is common where every user has a private group)."""
    key = key_of("umask")
    files = {**payload(key), "nki/kernels/k.py": b"pass\n"}
    old = os.umask(0o002)
    try:
        c = DiskCache(tmp_path / "c")
        c.put(key, files, graph_name="g", components={})
    finally:
        os.umask(old)
    assert DiskCache(tmp_path / "c").get(key).files() == files
    assert DiskCache(tmp_path / "c").verify() == []
