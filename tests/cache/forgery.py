"""Models A and B that differ in one constant, and tools to forge one's cache entries as the
other's (test_binding.py, test_signing.py). Every forged manifest is resealed: checksums hold."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from neuron_compile.cache.manifest import MANIFEST, build_manifest, dump_manifest, entry_path
from neuron_compile.cache.store import DiskCache
from tests.helpers import run_child

MODEL = """
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


def run(cache: Path, constant: str, **env: str) -> dict:
    return run_child(MODEL, cache, constant, **{"NEURON_COMPILE_AOT_CACHE": "0", **env})[0]


def cold_pair(tmp_path_factory, **env: str) -> dict[str, tuple[Path, dict]]:
    """A's and B's cold processes, each with its own cache; tests copy them before forging."""
    out = {}
    for constant in (A, B):
        root = tmp_path_factory.mktemp(f"cold-{constant}")
        out[constant] = root, run(root, constant, **env)
    assert out[A][1]["loss"] != out[B][1]["loss"]  # the forgeries below would be visible
    return out


def entries(cache: Path) -> dict[str, tuple[str, dict]]:
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


def files_of(base: Path, key: str, manifest: dict) -> dict[str, bytes]:
    return {n: (entry_path(base, key) / n).read_bytes() for n in manifest["files"]}


def plant(base: Path, key: str, files: dict[str, bytes], manifest: dict, **changes) -> None:
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


def victim(colds, tmp_path: Path) -> tuple[Path, dict, dict, Path]:
    """A copy of A's cold cache, A's and B's entries, and B's cache root (read only)."""
    shutil.copytree(colds[A][0], tmp_path / "a")
    return tmp_path / "a", entries(tmp_path / "a"), entries(colds[B][0]), colds[B][0] / "neuron"


def assert_own_result(colds, warm: dict) -> None:
    cold_a, cold_b = colds[A][1], colds[B][1]
    assert warm["loss"] != cold_b["loss"], "A computed B's loss: the forgery was served"
    assert warm["loss"] == cold_a["loss"]
    assert abs(warm["loss"] - warm["eager"]) <= 1e-5 * abs(warm["eager"])


def flagged(cache: Path, key: str) -> list[str]:
    problems = DiskCache(cache / "neuron").verify()
    return [p["problem"] for p in problems if p["key"] == key]
