"""Unsafe cache directories are refused (warn once, run uncached); symlinks are never followed."""

from __future__ import annotations

import logging
import os

import pytest

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
