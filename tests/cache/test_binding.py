"""Consistent forgeries of the disk cache are refused (cache/binding.py), seen from real processes.

Models A and B differ in one constant only (same shapes, same graph names). Each test starts from
A's cold cache, plants B's compiled graph under A's keys in one way an attacker who can write
cache entries could (every manifest resealed, so checksums hold), and checks that a warm process
computes A's own loss, equal to its cold run and to eager, never B's, and that
``DiskCache.verify`` (``neuron-compile cache verify``) flags the forged entry.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from neuron_compile.cache.manifest import MANIFEST, entry_path
from neuron_compile.cache.store import DiskCache

from .forgery import (
    A,
    B,
    assert_own_result,
    cold_pair,
    entries,
    files_of,
    flagged,
    plant,
    run,
    victim,
)


@pytest.fixture(scope="module")
def colds(tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    return cold_pair(tmp_path_factory)


def test_a_genuine_cache_verifies_and_serves_warm(colds, tmp_path):
    cache, _a, _b, _bbase = victim(colds, tmp_path)
    assert DiskCache(cache / "neuron").verify() == []
    warm = run(cache, A)
    assert_own_result(colds, warm)
    assert warm["sources"] == ["disk"]


def test_swapped_artifact_and_module_resealed_is_refused(colds, tmp_path):
    cache, a, b, bbase = victim(colds, tmp_path)
    base = cache / "neuron"
    (ka, ma), (kb, mb) = a["graph"], b["graph"]
    plant(base, ka, files_of(bbase, kb, mb), ma)  # B's artifact and module, A's key, resealed
    shutil.rmtree(entry_path(base, a["executable"][0]))
    assert any("module" in p for p in flagged(cache, ka))
    assert_own_result(colds, run(cache, A))
    assert DiskCache(base).verify() == []  # quarantined and rebuilt


def test_swapped_artifact_under_the_genuine_module_is_refused(colds, tmp_path):
    """The module still hashes to A's key; only the artifact (what runs) is B's."""
    cache, a, b, bbase = victim(colds, tmp_path)
    base = cache / "neuron"
    (ka, ma), (kb, mb) = a["graph"], b["graph"]
    files = {**files_of(base, ka, ma), "artifact": files_of(bbase, kb, mb)["artifact"]}
    plant(base, ka, files, ma)
    shutil.rmtree(entry_path(base, a["executable"][0]))
    assert any("serialization" in p for p in flagged(cache, ka))
    warm = run(cache, A)
    assert_own_result(colds, warm)
    # Refused before compiling, quarantined, rebuilt: the entry now holds A's own artifact.
    assert (
        files_of(base, ka, ma)["artifact"] == files_of(colds[A][0] / "neuron", ka, ma)["artifact"]
    )
    assert len(list((base / "quarantine").iterdir())) == 1


def test_swapped_executable_is_refused(colds, tmp_path):
    cache, a, b, bbase = victim(colds, tmp_path)
    base = cache / "neuron"
    (ka, _ma), (kb, mb) = a["executable"], b["executable"]
    plant(base, ka, files_of(bbase, kb, mb), mb)  # B's executable entry, resealed under A's key
    assert any("derive key" in p for p in flagged(cache, ka))
    assert_own_result(colds, run(cache, A))


def test_whole_entry_moved_under_another_key_is_refused(colds, tmp_path):
    cache, a, b, bbase = victim(colds, tmp_path)
    base = cache / "neuron"
    (ka, _ma), (kb, mb) = a["graph"], b["graph"]
    plant(base, ka, files_of(bbase, kb, mb), mb)  # B's whole entry (its components too)
    shutil.rmtree(entry_path(base, a["executable"][0]))
    assert any("derive key" in p for p in flagged(cache, ka))
    assert_own_result(colds, run(cache, A))


@pytest.mark.parametrize("aot", ["0", "1"])
def test_index_entry_pointed_at_another_graph_key_is_refused(colds, tmp_path, aot):
    cache, a, b, bbase = victim(colds, tmp_path)
    if aot == "1":  # PyTorch's AOTAutogradCache too, filled by a cold run with it on
        shutil.rmtree(cache)
        run(cache, A, NEURON_COMPILE_AOT_CACHE="1")
        a = entries(cache)
    base = cache / "neuron"
    for kind in ("graph", "executable"):  # B's genuine entries, under B's own keys
        kb, mb = b[kind]
        plant(base, kb, files_of(bbase, kb, mb), mb, created=mb["created"])
    ki, mi = a["index"]
    payload = json.loads(files_of(base, ki, mi)["index.json"])
    payload["graph_key"] = json.loads(files_of(bbase, b["index"][0], b["index"][1])["index.json"])[
        "graph_key"
    ]
    plant(
        base,
        ki,
        {"index.json": json.dumps(payload).encode()},
        mi,
        components={"graph_key": b["graph"][0]},
    )
    assert any("index payload" in p for p in flagged(cache, ki))
    assert_own_result(colds, run(cache, A, NEURON_COMPILE_AOT_CACHE=aot))
    assert DiskCache(base).verify() == []  # the forged index entry quarantined and rewritten
    assert (base / "quarantine").exists() and any((base / "quarantine").iterdir())


@pytest.mark.parametrize("forgery", ["moved", "artifact"])
def test_forged_remote_entry_is_refused_and_not_kept_locally(colds, tmp_path, forgery):
    remote = tmp_path / "remote"
    shutil.copytree(colds[A][0] / "neuron", remote)
    a, b, bbase = entries(colds[A][0]), entries(colds[B][0]), colds[B][0] / "neuron"
    (ka, ma), (kb, mb) = a["graph"], b["graph"]
    if forgery == "moved":  # B's whole entry under A's key
        plant(remote, ka, files_of(bbase, kb, mb), mb)
    else:  # A's module, B's artifact: passes every check the store can make without jaxlib
        files = {**files_of(remote, ka, ma), "artifact": files_of(bbase, kb, mb)["artifact"]}
        plant(remote, ka, files, ma)
    for kind in ("executable", "index"):  # never read from a remote tier anyway
        shutil.rmtree(entry_path(remote, a[kind][0]))
    local = tmp_path / "local"
    env = {"NEURON_COMPILE_REMOTE_CACHE": str(remote), "NEURON_COMPILE_CACHE_ALLOW_SHARED": "1"}
    assert_own_result(colds, run(local, A, **env))
    kept = files_of(local / "neuron", ka, ma)  # the local entry is A's own
    assert kept == files_of(colds[A][0] / "neuron", ka, ma)
    assert DiskCache(local / "neuron").verify() == []
    assert_own_result(colds, run(local, A, **env))  # and stays so on the next start


def test_bundle_carrying_a_forged_entry_is_refused_on_import(colds, tmp_path):
    from neuron_compile.errors import CacheBundleError

    a, b, bbase = entries(colds[A][0]), entries(colds[B][0]), colds[B][0] / "neuron"
    (ka, _ma), (kb, mb) = a["graph"], b["graph"]
    bundle = DiskCache(colds[A][0] / "neuron").export([ka], tmp_path / "bundle")
    forged = bundle / "entries" / ka  # B's entry, resealed as A's
    shutil.rmtree(forged)
    plant(tmp_path / "staging", ka, files_of(bbase, kb, mb), mb)
    shutil.copytree(entry_path(tmp_path / "staging", ka), forged)
    (forged / "last_access").unlink()
    index = json.loads((bundle / "bundle.json").read_bytes())
    data = (forged / MANIFEST).read_bytes()
    index["entries"][ka]["manifest_sha256"] = hashlib.sha256(data).hexdigest()
    (bundle / "bundle.json").write_text(json.dumps(index))
    target = DiskCache(tmp_path / "target")
    with pytest.raises(CacheBundleError, match="not bound to its key"):
        target.import_bundle(bundle)
    assert target.get(ka) is None
