"""The disk cache seen from torch.compile: warm starts in new processes, miss explanations,
corrupt entries recompiled, strict mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import neuron_compile
from neuron_compile.cache import executable_cache

ROOT = Path(__file__).resolve().parents[2]

_TRAIN_STEP = """
import json, sys, torch, neuron_compile
from neuron_compile import compiler
lowered = []
real_lower = compiler.lower_graph
compiler.lower_graph = lambda gm, **kw: lowered.append(1) or real_lower(gm, **kw)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
x = torch.randn(5, 8)
loss = torch.compile(model, backend="neuron")(x).square().mean()
loss.backward()
m = neuron_compile.metrics()
print(json.dumps({
    "loss": loss.item(),
    "lowerings": len(lowered),
    "grad": model[0].weight.grad.sum().item(),
    "records": [
        {"name": r.name, "source": r.cache_source, "verify_s": r.verify_s, "key": r.cache_key}
        for r in m
    ],
    "cache": {k: v for k, v in m.cache.items() if isinstance(v, (int, float))},
}))
"""


def _run_step(cache_dir: Path) -> dict:
    env = {**os.environ, "NEURON_COMPILE_CACHE_DIR": str(cache_dir), "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", _TRAIN_STEP], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_new_process_with_warm_cache_skips_verify_and_xla_compile(tmp_path):
    cold = _run_step(tmp_path / "cache")
    warm = _run_step(tmp_path / "cache")
    assert [r["source"] for r in cold["records"]] == ["compiled", "compiled"]
    assert [r["source"] for r in warm["records"]] == ["disk", "disk"]
    assert [r["key"] for r in warm["records"]] == [r["key"] for r in cold["records"]]
    assert all(r["verify_s"] == 0 for r in warm["records"])
    assert all(r["verify_s"] > 0 for r in cold["records"])
    # artifact + executable entry per graph read back (index probes are not counted); nothing
    # compiled or written.
    assert warm["cache"]["disk_hits"] == 4 and warm["cache"]["disk_misses"] == 0
    assert warm["cache"]["compiles"] == 0
    assert cold["cache"]["disk_misses"] == 4  # artifact + executable per graph; probes uncounted
    assert warm["cache"]["bytes_written"] == 0 and warm["cache"]["bytes_read"] > 0
    assert warm["cache"]["compile_seconds_saved"] > 0
    assert warm["loss"] == cold["loss"] and warm["grad"] == cold["grad"]
    # The FX index maps each graph to its entry without lowering it again.
    assert cold["lowerings"] == 2 and warm["lowerings"] == 0


def _compile_mlp():
    torch._dynamo.reset()
    executable_cache.clear()  # a new process, as far as the cache tiers are concerned
    neuron_compile.reset_metrics()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU())
    x = torch.randn(3, 8)
    out = torch.compile(model, backend="neuron")(x)
    return out, model(x), neuron_compile.metrics()


def test_a_miss_says_which_component_changed(monkeypatch):
    _compile_mlp()
    monkeypatch.setenv("NEURON_CC_FLAGS", "--auto-cast=none")
    _, _, records = _compile_mlp()
    (record,) = records
    assert record.cache_source == "compiled"
    assert record.cache_miss == ["flags:  → --auto-cast=none"]


def test_first_compile_is_explained_too():
    (record,) = _compile_mlp()[2]
    assert record.cache_miss == ["first compile of Sequential_forward_0"]


def test_corrupt_artifact_is_quarantined_and_recompiled(caplog):
    (first,) = _compile_mlp()[2]
    root = Path(os.environ["NEURON_COMPILE_CACHE_DIR"])
    artifact = next(root.glob(f"entries/*/{first.cache_key}/artifact"))
    data = bytearray(artifact.read_bytes())
    data[len(data) // 2] ^= 0x40
    artifact.write_bytes(bytes(data))
    with caplog.at_level("WARNING", logger="neuron_compile"):
        out, expected, records = _compile_mlp()
    assert records[0].cache_source == "compiled"
    assert any("quarantin" in r.getMessage() for r in caplog.records)
    torch.testing.assert_close(out, expected)
    assert list((root / "quarantine").iterdir())
    assert records.cache["quarantined"] == 1


def test_strict_mode_miss_raises_nc401_naming_components(monkeypatch):
    monkeypatch.setenv("NEURON_COMPILE_CACHE_ONLY", "1")
    with pytest.raises(Exception) as info:
        _compile_mlp()
    text = str(info.value)
    assert "NC401" in text and "module" in text and "jaxlib" in text


def test_strict_mode_passes_on_a_warm_cache(monkeypatch):
    _compile_mlp()
    monkeypatch.setenv("NEURON_COMPILE_CACHE_ONLY", "1")
    out, expected, records = _compile_mlp()
    assert records[0].cache_source == "disk"
    torch.testing.assert_close(out, expected)


def test_cache_off(monkeypatch):
    monkeypatch.setenv("NEURON_COMPILE_CACHE_DIR", "off")
    out, expected, records = _compile_mlp()
    assert records[0].cache_source == "off" and records.cache["enabled"] is False
    torch.testing.assert_close(out, expected)


@pytest.mark.filterwarnings("ignore:neuron-compile. target trn2 without neuronx-cc")
def test_a_trn_graph_and_its_cpu_stand_in_are_separate_entries():
    # On trn2, GELU becomes an AwsNeuronGelu kernel call; XLA CPU runs a stand-in module with the
    # references. The record describes the trn artifact, and the stand-in never explains it.
    from neuron_compile.cache.store import DiskCache
    from neuron_compile.compiler import STAND_IN, cache_name

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU())
    x = torch.randn(3, 8)
    with torch.no_grad():
        out = torch.compile(model, backend="neuron", options={"target": "trn2"})(x)
        torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-5)
    (record,) = neuron_compile.metrics()
    graph = cache_name(record.name)
    assert record.cache_miss == [f"first compile of {graph}"]
    entries = DiskCache(os.environ["NEURON_COMPILE_CACHE_DIR"]).entries()
    trn = [e for e in entries if e.graph_name == graph]
    cpu = [e for e in entries if e.graph_name == graph + STAND_IN]
    assert len(trn) == 1 and len(cpu) == 1 and trn[0].key == record.cache_key


_AS_STRIDED = """
import json, sys, warnings
import torch, neuron_compile
warnings.simplefilter("ignore")
x = torch.arange(16.0).reshape(4, 4)
x = x.t() if sys.argv[1] == "t" else x
f = lambda x: x.as_strided((3, 3), (1, 3)) * 2 + 1
out = torch.compile(f, backend="neuron")(x)
print(json.dumps([neuron_compile.metrics()[-1].cache_source, torch.equal(out, f(x))]))
"""


def test_a_warm_entry_is_not_served_to_an_input_of_other_strides(tmp_path):
    """The FX index left strides out: an as_strided graph compiled for a contiguous input was
    served, from disk, to the same shape transposed, and read the wrong elements."""
    env = {**os.environ, "NEURON_COMPILE_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}

    def run(layout: str) -> list:
        out = subprocess.run(
            [sys.executable, "-c", _AS_STRIDED, layout], env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    assert run("c") == ["compiled", True]
    assert run("t") == ["compiled", True]
    assert run("c") == ["disk", True] and run("t") == ["disk", True]
