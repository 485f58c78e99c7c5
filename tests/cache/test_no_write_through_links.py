"""No write ever goes through a symlink under the cache root, readers never write to the remote
tier, and read-only commands create nothing. Real files, real links, real CLI processes."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys

import pytest

from neuron_compile.cache.store import DiskCache

from .procs import key_of, payload


def _tree(path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def _cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "neuron_compile", "cache", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture
def outside(tmp_path):
    d = tmp_path / "outside"
    d.mkdir()
    return d


def test_symlinked_shard_is_refused_and_reported(tmp_path, outside, caplog):
    c = DiskCache(tmp_path / "c")
    key = key_of("shard")
    os.symlink(outside, c.root / "entries" / key[:2])
    with caplog.at_level(logging.WARNING):
        assert c.put(key, payload(key), graph_name="g", components={}) is None  # uncached
        assert c.put(key, payload(key), graph_name="g", components={}) is None
    assert _tree(outside) == []  # nothing published into the link's target
    assert len([r for r in caplog.records if "symlink" in r.getMessage()]) == 1  # warned once
    assert c.get(key) is None
    problems = c.verify()
    assert problems == [{"key": f"entries/{key[:2]}", "problem": problems[0]["problem"]}]
    assert "symlink" in problems[0]["problem"]


def test_symlinked_name_dir_gets_no_marker(tmp_path, outside):
    c = DiskCache(tmp_path / "c")
    name_dir = c._name_dir(c.root, "g")
    os.symlink(outside, name_dir)
    key = key_of("name")
    assert c.put(key, payload(key), graph_name="g", components={}) is not None  # only the hint
    assert _tree(outside) == [] and c.get(key).files() == payload(key)
    assert [p["key"] for p in c.verify()] == [f"names/{name_dir.name}"]


@pytest.mark.parametrize("sub", ["quarantine", "tmp", "names", "failures", "entries", "locks"])
def test_symlinked_subdir_planted_after_open_is_never_written_through(tmp_path, outside, sub):
    c = DiskCache(tmp_path / "c")
    key = key_of("sub")
    c.put(key, payload(key), graph_name="g", components={})
    if sub == "entries":  # the attacker keeps the entry readable, behind the link
        shutil.copytree(c.root / sub, outside, dirs_exist_ok=True, symlinks=True)
    shutil.rmtree(c.root / sub)
    decoy = outside / f"{key_of('decoy')}.json"  # looks like a failure record: must survive
    decoy.write_text("{}")
    before = _tree(outside)
    os.symlink(outside, c.root / sub)
    if sub != "entries":
        (c.get(key).path / "part0.bin").write_bytes(b"corrupt")  # a reader quarantines this
        assert c.get(key) is None
    other = key_of("other")
    c.put(other, payload(other), graph_name="g", components={})
    with pytest.raises(RuntimeError):
        c.get_or_create(key_of("fails"), _fail, graph_name="g", components={})
    c.prune(older_than=0.0)
    c.clear()
    assert _tree(outside) == before
    assert [p["key"] for p in c.verify()][:1] == [sub]
    assert DiskCache(tmp_path / "c").enabled is False  # a fresh open refuses the whole root


def _fail() -> dict[str, bytes]:
    raise RuntimeError("compile failed")


def test_corrupt_remote_entry_is_a_local_miss_and_the_remote_is_untouched(tmp_path):
    remote = DiskCache(tmp_path / "remote")
    key = key_of("remote")
    entry = remote.put(key, payload(key), graph_name="g", components={})
    (entry.path / "part1.bin").write_bytes(b"bit rot")
    before = {
        str(p.relative_to(remote.root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in remote.root.rglob("*")
        if p.is_file()
    }
    reader = DiskCache(tmp_path / "local", remote=tmp_path / "remote")
    assert reader.get(key) is None and reader.get(key) is None
    after = {
        str(p.relative_to(remote.root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in remote.root.rglob("*")
        if p.is_file()
    }
    assert after == before and _tree(remote.root / "quarantine") == []
    assert reader.entries() == [] and reader.stats()["quarantined"] == 0


def test_read_only_commands_create_nothing_and_verify_of_a_typo_fails(tmp_path):
    missing, env_root = tmp_path / "typo", tmp_path / "env-root"
    env = {"NEURON_COMPILE_CACHE_DIR": str(env_root)}
    for cmd in ("ls", "du"):
        out = _cli(cmd, "--json", "--dir", str(missing), env=env)
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
        assert json.loads(out.stdout)["root"] == str(missing)
    out = _cli("verify", "--dir", str(missing), env=env)
    assert out.returncode != 0 and "NC404" in out.stderr and "does not exist" in out.stderr
    assert "Traceback" not in out.stderr and "ok" not in out.stdout
    out = _cli("ls", env=env)  # the default root, from the environment
    assert out.returncode == 0, out.stderr
    assert not missing.exists() and not env_root.exists()

    existing = tmp_path / "empty"
    existing.mkdir(mode=0o700)
    for cmd in ("ls", "du", "verify"):
        assert _cli(cmd, "--dir", str(existing)).returncode == 0
    assert _tree(existing) == []


def test_cli_verify_reports_a_symlinked_shard(tmp_path, outside):
    c = DiskCache(tmp_path / "c")
    key = key_of("cli")
    c.put(key, payload(key), graph_name="g", components={})
    os.symlink(outside, c.root / "entries" / "zz")
    out = _cli("verify", "--dir", str(c.root))
    assert out.returncode == 1 and "entries/zz" in out.stdout and "symlink" in out.stdout
    assert "Traceback" not in out.stderr
    out = _cli("import", str(tmp_path / "nope.tar"), "--dir", str(c.root))
    assert out.returncode == 2 and "NC403" in out.stderr and "Traceback" not in out.stderr
