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

from neuron_compile.cache.manifest import (
    MANIFEST,
    build_manifest,
    dump_manifest,
    entry_path,
)
from neuron_compile.cache.store import DiskCache
from tests.helpers import run_child

_MODEL = """
import json, sys, warnings, torch, neuron_compile
warnings.simplefilter("ignore")
C = float(sys.argv[1])

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 16)
    def forward(self, x):
        return (torch.relu(self.lin(x)) * C).square().mean()

torch.manual_seed(0)
model = Net()
x = torch.randn(5, 8)
with torch.no_grad():
    loss = torch.compile(model, backend="neuron")(x).item()
    eager = model(x).item()
print(json.dumps({
    "loss": loss,
    "eager": eager,
    "sources": [r.cache_source for r in neuron_compile.metrics()],
}))
"""
A, B = "3.0", "5.0"


def _run(cache: Path, constant: str, **env: str) -> dict:
    return run_child(_MODEL, cache, constant, **{"NEURON_COMPILE_AOT_CACHE": "0", **env})[0]


@pytest.fixture(scope="module")
def colds(tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    """A's and B's cold processes, each with its own cache; tests copy them before forging."""
    out = {}
    for constant in (A, B):
        root = tmp_path_factory.mktemp(f"cold-{constant}")
        out[constant] = root, _run(root, constant)
    assert out[A][1]["loss"] != out[B][1]["loss"]  # the forgeries below would be visible
    return out


def _entries(cache: Path) -> dict[str, tuple[str, dict]]:
    """``{"graph" | "executable" | "index": (key, manifest)}`` of a one-graph cache."""
    found = {}
    for path in (cache / "neuron" / "entries").glob("*/*/" + MANIFEST):
        manifest = json.loads(path.read_bytes())
        name = manifest["graph_name"]
        kind = name.rsplit(".", 1)[1] if name.endswith((".executable", ".index")) else "graph"
        assert kind not in found, f"more than one {kind} entry in {cache}"
        found[kind] = manifest["key"], manifest
    assert set(found) == {"graph", "executable", "index"}, found
    return found


def _files(base: Path, key: str, manifest: dict) -> dict[str, bytes]:
    return {n: (entry_path(base, key) / n).read_bytes() for n in manifest["files"]}


def _plant(base: Path, key: str, files: dict[str, bytes], manifest: dict, **changes) -> None:
    """Write an entry under ``key`` with ``files``, its manifest resealed (checksums hold)."""
    path = entry_path(base, key)
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    for name, data in files.items():
        (path / name).write_bytes(data)
    (path / "last_access").touch()
    fields = {
        "graph_name": manifest["graph_name"],
        "components": manifest["components"],
        "meta": manifest["meta"],
        **changes,
    }
    (path / MANIFEST).write_bytes(dump_manifest(build_manifest(key, files, **fields)))


def _victim(colds, tmp_path: Path) -> tuple[Path, dict, dict, Path]:
    """A copy of A's cold cache, A's and B's entries, and B's cache root (read only)."""
    shutil.copytree(colds[A][0], tmp_path / "a")
    return tmp_path / "a", _entries(tmp_path / "a"), _entries(colds[B][0]), colds[B][0] / "neuron"


def _assert_own_result(colds, warm: dict) -> None:
    cold_a, cold_b = colds[A][1], colds[B][1]
    assert warm["loss"] != cold_b["loss"], "A computed B's loss: the forgery was served"
    assert warm["loss"] == cold_a["loss"]
    assert abs(warm["loss"] - warm["eager"]) <= 1e-5 * abs(warm["eager"])


def _flagged(cache: Path, key: str) -> list[str]:
    problems = DiskCache(cache / "neuron").verify()
    return [p["problem"] for p in problems if p["key"] == key]


def test_a_genuine_cache_verifies_and_serves_warm(colds, tmp_path):
    cache, _a, _b, _bbase = _victim(colds, tmp_path)
    assert DiskCache(cache / "neuron").verify() == []
    warm = _run(cache, A)
    _assert_own_result(colds, warm)
    assert warm["sources"] == ["disk"]


def test_swapped_artifact_and_module_resealed_is_refused(colds, tmp_path):
    cache, a, b, bbase = _victim(colds, tmp_path)
    base = cache / "neuron"
    (ka, ma), (kb, mb) = a["graph"], b["graph"]
    _plant(base, ka, _files(bbase, kb, mb), ma)  # B's artifact and module, A's key, resealed
    shutil.rmtree(entry_path(base, a["executable"][0]))
    assert any("module" in p for p in _flagged(cache, ka))
    _assert_own_result(colds, _run(cache, A))
    assert DiskCache(base).verify() == []  # quarantined and rebuilt


def test_swapped_artifact_under_the_genuine_module_is_refused(colds, tmp_path):
    """The module still hashes to A's key; only the artifact (what runs) is B's."""
    cache, a, b, bbase = _victim(colds, tmp_path)
    base = cache / "neuron"
    (ka, ma), (kb, mb) = a["graph"], b["graph"]
    files = {**_files(base, ka, ma), "artifact": _files(bbase, kb, mb)["artifact"]}
    _plant(base, ka, files, ma)
    shutil.rmtree(entry_path(base, a["executable"][0]))
    assert any("serialization" in p for p in _flagged(cache, ka))
    warm = _run(cache, A)
    _assert_own_result(colds, warm)
    # Refused before compiling, quarantined, rebuilt: the entry now holds A's own artifact.
    assert _files(base, ka, ma)["artifact"] == _files(colds[A][0] / "neuron", ka, ma)["artifact"]
    assert len(list((base / "quarantine").iterdir())) == 1


def test_swapped_executable_is_refused(colds, tmp_path):
    cache, a, b, bbase = _victim(colds, tmp_path)
    base = cache / "neuron"
    (ka, _ma), (kb, mb) = a["executable"], b["executable"]
    _plant(base, ka, _files(bbase, kb, mb), mb)  # B's executable entry, resealed under A's key
    assert any("derive key" in p for p in _flagged(cache, ka))
    _assert_own_result(colds, _run(cache, A))


def test_whole_entry_moved_under_another_key_is_refused(colds, tmp_path):
    cache, a, b, bbase = _victim(colds, tmp_path)
    base = cache / "neuron"
    (ka, _ma), (kb, mb) = a["graph"], b["graph"]
    _plant(base, ka, _files(bbase, kb, mb), mb)  # B's whole entry (its components too)
    shutil.rmtree(entry_path(base, a["executable"][0]))
    assert any("derive key" in p for p in _flagged(cache, ka))
    _assert_own_result(colds, _run(cache, A))


@pytest.mark.parametrize("aot", ["0", "1"])
def test_index_entry_pointed_at_another_graph_key_is_refused(colds, tmp_path, aot):
    cache, a, b, bbase = _victim(colds, tmp_path)
    if aot == "1":  # PyTorch's AOTAutogradCache too, filled by a cold run with it on
        shutil.rmtree(cache)
        _run(cache, A, NEURON_COMPILE_AOT_CACHE="1")
        a = _entries(cache)
    base = cache / "neuron"
    for kind in ("graph", "executable"):  # B's genuine entries, under B's own keys
        kb, mb = b[kind]
        _plant(base, kb, _files(bbase, kb, mb), mb, created=mb["created"])
    ki, mi = a["index"]
    payload = json.loads(_files(base, ki, mi)["index.json"])
    payload["graph_key"] = json.loads(_files(bbase, b["index"][0], b["index"][1])["index.json"])[
        "graph_key"
    ]
    _plant(
        base,
        ki,
        {"index.json": json.dumps(payload).encode()},
        mi,
        components={"graph_key": b["graph"][0]},
    )
    assert any("index payload" in p for p in _flagged(cache, ki))
    _assert_own_result(colds, _run(cache, A, NEURON_COMPILE_AOT_CACHE=aot))
    assert DiskCache(base).verify() == []  # the forged index entry quarantined and rewritten
    assert (base / "quarantine").exists() and any((base / "quarantine").iterdir())


@pytest.mark.parametrize("forgery", ["moved", "artifact"])
def test_forged_remote_entry_is_refused_and_not_kept_locally(colds, tmp_path, forgery):
    remote = tmp_path / "remote"
    shutil.copytree(colds[A][0] / "neuron", remote)
    a, b, bbase = _entries(colds[A][0]), _entries(colds[B][0]), colds[B][0] / "neuron"
    (ka, ma), (kb, mb) = a["graph"], b["graph"]
    if forgery == "moved":  # B's whole entry under A's key
        _plant(remote, ka, _files(bbase, kb, mb), mb)
    else:  # A's module, B's artifact: passes every check the store can make without jaxlib
        files = {**_files(remote, ka, ma), "artifact": _files(bbase, kb, mb)["artifact"]}
        _plant(remote, ka, files, ma)
    for kind in ("executable", "index"):  # never read from a remote tier anyway
        shutil.rmtree(entry_path(remote, a[kind][0]))
    local = tmp_path / "local"
    env = {"NEURON_COMPILE_REMOTE_CACHE": str(remote), "NEURON_COMPILE_CACHE_ALLOW_SHARED": "1"}
    _assert_own_result(colds, _run(local, A, **env))
    kept = _files(local / "neuron", ka, ma)  # the local entry is A's own
    assert kept == _files(colds[A][0] / "neuron", ka, ma)
    assert DiskCache(local / "neuron").verify() == []
    _assert_own_result(colds, _run(local, A, **env))  # and stays so on the next start


def test_bundle_carrying_a_forged_entry_is_refused_on_import(colds, tmp_path):
    from neuron_compile.errors import CacheBundleError

    a, b, bbase = _entries(colds[A][0]), _entries(colds[B][0]), colds[B][0] / "neuron"
    (ka, _ma), (kb, mb) = a["graph"], b["graph"]
    bundle = DiskCache(colds[A][0] / "neuron").export([ka], tmp_path / "bundle")
    forged = bundle / "entries" / ka  # B's entry, resealed as A's
    shutil.rmtree(forged)
    _plant(tmp_path / "staging", ka, _files(bbase, kb, mb), mb)
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
