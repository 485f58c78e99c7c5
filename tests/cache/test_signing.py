"""Signed shared tiers (cache/signing.py), seen from real processes, files and the CLI.

What binding cannot catch, a team key does: an FX index entry that is consistent with itself
but was written for another graph. A's writer signs and promotes its entries to a remote tier;
an attacker who can write that tier plants B's whole index entry under A's index key, resealed
so every checksum and every binding holds. A reader with the team key refuses it and computes A's
own loss; unsigned entries, entries signed with another key and bundles without the team's
signature are refused too, and a key file that cannot be used fails closed, never open.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from neuron_compile.cache import settings
from neuron_compile.cache.manifest import MANIFEST, entry_path
from neuron_compile.cache.signing import ENV_SIGNED_TIERS, ENV_SIGNING_KEY, write_new_key
from neuron_compile.cache.store import DiskCache
from neuron_compile.errors import CacheBundleError
from tests.helpers import REPO_ROOT, run_child

from .forgery import MODEL, A, B, assert_own_result, cold_pair, entries, files_of, plant
from .procs import key_of, payload

REMOTE = "NEURON_COMPILE_REMOTE_CACHE"


@pytest.fixture(scope="module")
def team_key(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "team.key"
    write_new_key(path)
    return path


@pytest.fixture(scope="module")
def signed(tmp_path_factory, team_key) -> dict[str, tuple[Path, dict]]:
    """A's and B's cold caches, written by holders of the team key (their entries are signed)."""
    return cold_pair(tmp_path_factory, **{ENV_SIGNING_KEY: str(team_key)})


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "neuron_compile", "cache", *args, "--json"],
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _promote(cold: Path, remote: Path, **env: str) -> dict:
    remote.mkdir(mode=0o755, exist_ok=True)
    out = _cli("promote", "--dir", str(cold / "neuron"), "--remote", str(remote), **env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _reader(local: Path, remote: Path, key: Path | None) -> tuple[dict, str]:
    env = {REMOTE: str(remote), **({ENV_SIGNING_KEY: str(key)} if key else {})}
    result, log = run_child(MODEL, local, A, NEURON_COMPILE_AOT_CACHE="0", **env)
    return result, log


def test_signed_entries_are_served_from_the_remote_tier(signed, team_key, tmp_path):
    remote = tmp_path / "remote"
    assert _promote(signed[A][0], remote, **{ENV_SIGNING_KEY: str(team_key)})["promoted"] == 2
    for manifest in remote.glob(f"entries/*/*/{MANIFEST}"):
        assert json.loads(manifest.read_bytes())["signature"]["alg"] == "hmac-sha256"
    warm, _log = _reader(tmp_path / "local", remote, team_key)
    assert_own_result(signed, warm)
    assert warm["sources"] == ["remote"]  # index and graph from the remote tier, signed


def test_a_self_consistent_index_entry_for_another_graph_is_refused(signed, team_key, tmp_path):
    remote = tmp_path / "remote"
    key_env = {ENV_SIGNING_KEY: str(team_key)}
    _promote(signed[A][0], remote, **key_env)
    _promote(signed[B][0], remote, **key_env)  # B's genuine, signed graph entry is there too
    a, b, bbase = entries(signed[A][0]), entries(signed[B][0]), signed[B][0] / "neuron"
    (ki, _mi), (kbi, mbi) = a["index"], b["index"]
    # B's whole index entry (payload and components) under A's index key: every checksum and
    # binding holds, only the signature (the attacker has no key) is missing.
    plant(remote, ki, files_of(bbase, kbi, mbi), mbi)
    warm, log = _reader(tmp_path / "local", remote, team_key)
    assert_own_result(signed, warm)
    assert "unsigned" in log
    assert (entry_path(remote, ki) / "index.json").exists()  # readers never write to the remote


@pytest.mark.parametrize("writer", ["unsigned", "another key"])
def test_remote_entries_not_signed_by_the_team_key_are_refused(signed, team_key, tmp_path, writer):
    remote = tmp_path / "remote"
    env = {}
    if writer == "another key":
        other = tmp_path / "other.key"
        write_new_key(other)
        env = {ENV_SIGNING_KEY: str(other)}
    _promote(signed[A][0], remote, **env)
    warm, log = _reader(tmp_path / "local", remote, team_key)
    assert_own_result(signed, warm)
    assert warm["sources"] == ["compiled"]
    assert ("unsigned" if writer == "unsigned" else "another key") in log


def test_a_bundle_must_carry_the_team_signature_when_imports_are_covered(
    signed, team_key, tmp_path
):
    cold = DiskCache(signed[A][0] / "neuron")
    key = entries(signed[A][0])["graph"][0]
    unsigned = DiskCache(signed[A][0] / "neuron").export([key], tmp_path / "plain.tar")
    signer = settings.from_environ({ENV_SIGNING_KEY: str(team_key)}).signer
    target = DiskCache(tmp_path / "target", signer=signer)
    with pytest.raises(CacheBundleError, match="not signed by the team key"):
        target.import_bundle(unsigned)
    assert target.get(key) is None
    sealed = DiskCache(signed[A][0] / "neuron", signer=signer).export([key], tmp_path / "s.tar")
    assert target.import_bundle(sealed) == [key]
    assert target.get(key).files() == cold.get(key).files()


def test_signed_tiers_all_refuses_unsigned_local_entries(tmp_path, team_key):
    plain = DiskCache(tmp_path / "c")
    key = key_of("local")
    plain.put(key, payload(key), graph_name="g", components={"x": "1"})
    signer = settings.from_environ({ENV_SIGNING_KEY: str(team_key), ENV_SIGNED_TIERS: "all"}).signer
    strict = DiskCache(tmp_path / "c", signer=signer)
    assert strict.get(key) is None  # unsigned: refused and quarantined
    assert len(list((tmp_path / "c" / "quarantine").iterdir())) == 1
    strict.put(key, payload(key), graph_name="g", components={"x": "1"})
    assert strict.get(key).files() == payload(key) and strict.verify() == []


@pytest.mark.parametrize(
    "problem, mode, text",
    [
        ("world-readable", 0o644, b"k" * 40),
        ("too short", 0o600, b"short"),
        ("missing", None, b""),
    ],
)
def test_an_unusable_key_file_fails_closed(tmp_path, team_key, caplog, problem, mode, text):
    path = tmp_path / "bad.key"
    if mode is not None:
        path.write_bytes(text)
        path.chmod(mode)
    signer = settings.from_environ({ENV_SIGNING_KEY: str(path)}).signer
    assert signer is not None and signer.problem
    remote = tmp_path / "remote"
    remote.mkdir(mode=0o700)
    with caplog.at_level(logging.WARNING):
        cache = DiskCache(tmp_path / "local", remote=remote, signer=signer)
    assert cache.enabled and not cache.remote_enabled  # the covered tier is not read
    assert "[NC404]" in caplog.text and ENV_SIGNING_KEY in caplog.text
    key = key_of("x")
    stored = cache.put(key, payload(key), graph_name="g", components={})
    assert "signature" not in stored.manifest  # nothing is signed with a key that is not usable


def test_a_typo_in_the_tier_set_covers_every_tier(team_key, caplog):
    with caplog.at_level(logging.WARNING):
        s = settings.from_environ({ENV_SIGNING_KEY: str(team_key), ENV_SIGNED_TIERS: "shraed"})
    assert s.signer.covers("local") and s.signer.covers("remote")
    assert "[NC001]" in caplog.text and ENV_SIGNED_TIERS in caplog.text


def test_keygen_writes_a_private_key_and_never_overwrites(tmp_path):
    path = tmp_path / "team.key"
    out = _cli("keygen", str(path))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["key_id"] and (path.stat().st_mode & 0o777) == 0o600
    before = path.read_bytes()
    assert _cli("keygen", str(path)).returncode == 2 and path.read_bytes() == before


def test_index_entries_of_a_tier_others_write_are_used_only_when_signed(signed, tmp_path):
    """Without a team key, a remote tier others may write (ALLOW_SHARED) still serves graph
    entries, which bind to their keys by content, but not FX index entries, which cannot: the
    reader lowers once, and the same self-consistent forgery computes A's own loss."""
    remote = tmp_path / "remote"
    _promote(signed[A][0], remote)
    _promote(signed[B][0], remote)
    a, b, bbase = entries(signed[A][0]), entries(signed[B][0]), signed[B][0] / "neuron"
    (ki, _mi), (kbi, mbi) = a["index"], b["index"]
    plant(remote, ki, files_of(bbase, kbi, mbi), mbi)
    env = {REMOTE: str(remote), "NEURON_COMPILE_CACHE_ALLOW_SHARED": "1"}
    warm, _log = run_child(MODEL, tmp_path / "local", A, NEURON_COMPILE_AOT_CACHE="0", **env)
    assert_own_result(signed, warm)
    assert warm["sources"] == ["remote"]  # lowered here, the compiled graph from the remote


def test_an_imported_index_entry_is_installed_only_when_signed(signed, team_key, tmp_path):
    index_key = entries(signed[A][0])["index"][0]
    signer = settings.from_environ({ENV_SIGNING_KEY: str(team_key)}).signer
    source = DiskCache(signed[A][0] / "neuron", signer=signer)
    bundle = source.export([index_key], tmp_path / "b.tar")
    assert DiskCache(tmp_path / "plain").import_bundle(bundle) == []  # not trusted unsigned
    assert DiskCache(tmp_path / "team", signer=signer).import_bundle(bundle) == [index_key]


def test_a_shared_local_cache_does_not_serve_unsigned_index_entries(signed, tmp_path):
    """The same forgery in a local cache others may write (ALLOW_SHARED): not served either."""
    local = tmp_path / "shared"
    shutil.copytree(signed[A][0], local)
    a, b, bbase = entries(local), entries(signed[B][0]), signed[B][0] / "neuron"
    (ki, _mi), (kbi, mbi) = a["index"], b["index"]
    for kind in ("graph", "executable"):  # B's genuine entries, under B's own keys
        kb, mb = b[kind]
        plant(local / "neuron", kb, files_of(bbase, kb, mb), mb)
    plant(local / "neuron", ki, files_of(bbase, kbi, mbi), mbi)
    env = {"NEURON_COMPILE_CACHE_ALLOW_SHARED": "1", "NEURON_COMPILE_AOT_CACHE": "0"}
    warm, _log = run_child(MODEL, local, A, **env)
    assert_own_result(signed, warm)
    assert warm["sources"] == ["disk"]  # lowered here; A's own compiled graph from the cache
