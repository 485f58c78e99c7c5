"""The neuronx-cc driver against the test double: exact command lines, timeout, NCC_ triage,
NEFF in the cache, negative entries, and compiler version + flags in the NEFF key."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

import neuron_compile
from neuron_compile import artifact as artifact_mod
from neuron_compile import errors
from neuron_compile.cache.memory import executable_cache
from neuron_compile.cache.tiers import disk_cache
from neuron_compile.config import load_config
from neuron_compile.trainium import neff, neuronx_cc

TEXT = """func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.add %a, %a : tensor<4xf32>
  return %0 : tensor<4xf32>
}"""


def _compile(name="module.mlir", data=None, **kw):
    data = artifact_mod.serialize(TEXT, "bytecode") if data is None else data
    return neuronx_cc.run_neuronx_cc(name, data, **{"target": "trn2", "lnc": 2, **kw})


@pytest.mark.parametrize(
    "target, lnc, optlevel, flags",
    [
        ("trn2", 2, 2, ""),
        ("trn2", 1, 1, "--native-int64=enabled"),
        ("trn3", 2, 3, "--verbose debug --enable-saturate-infinity"),
    ],
)
def test_exact_command_line_per_target_and_flags(double, target, lnc, optlevel, flags):
    neff, _ = _compile(target=target, lnc=lnc, optlevel=optlevel, flags=flags)
    assert neff.startswith(b"NEFF-DOUBLE\0")
    (argv,) = double.calls()
    work = argv[1].rsplit("/", 1)[0]
    assert argv == [
        "compile",
        f"{work}/module.mlir",
        *("--framework", "XLA", "--target", target, "--lnc", str(lnc), f"-O{optlevel}"),
        *("--model-type", "transformer", "--auto-cast=none"),
        *flags.split(),
        *("--output", f"{work}/model.neff"),
    ]


def test_hlo_input_and_neuron_cc_flags_env(double, monkeypatch):
    monkeypatch.setenv("NEURON_CC_FLAGS", "--auto-cast matmult --auto-cast-type bf16")
    _compile("module.hlo.pb", artifact_mod.serialize(TEXT, "hlo"))
    (argv,) = double.calls()
    assert argv[1].endswith("/module.hlo.pb")
    assert argv[-6:-2] == ["--auto-cast", "matmult", "--auto-cast-type", "bf16"]


def test_the_double_rejects_invalid_artifacts_and_argv(double):
    with pytest.raises(errors.NeuronxCcError) as info:
        _compile(data=b"not a module")
    assert info.value.ncc_code == "NCC_EVRF064" and info.value.triage == "lowering-bug"
    with pytest.raises(errors.NeuronxCcError) as info:
        _compile(flags="--no-such-flag")
    assert info.value.returncode == 2 and "unrecognized arguments" in info.value.log_tail


@pytest.mark.parametrize(
    "code, triage",
    [
        ("NCC_EMOD025", "user-shape-dtype"),
        ("NCC_EVRF035", "user-shape-dtype"),
        ("NCC_EVRF001", "unsupported-op"),
        ("NCC_EHCA005", "lowering-bug"),
        ("NCC_EVRF059", "nki-toolchain"),
        ("NCC_EOOM001", "capacity"),
        ("NCC_EBVF030", "capacity"),
        ("NCC_EARG001", "configuration"),
        ("NCC_ITEN406", "compiler-internal"),
        ("NCC_EZZZ999", "unknown"),
    ],
)
def test_each_triage_class(double, code, triage):
    double.mode("fail", code=code)
    with pytest.raises(errors.NeuronxCcError) as info:
        _compile()
    err = info.value
    assert (err.code, err.ncc_code, err.triage, err.returncode) == ("NC522", code, triage, 1)
    assert code in str(err) and f"[{triage}]" in str(err)


def test_timeout_kills_the_compiler(double, monkeypatch):
    double.mode("sleep", sleep="30")
    monkeypatch.setenv("NEURON_COMPILE_NEURONX_CC_TIMEOUT", "1")
    with pytest.raises(errors.NeuronxCcTimeout) as info:
        _compile()
    assert info.value.code == "NC523" and "within 1 s" in str(info.value)


def test_missing_compiler_is_nc521(no_neuronx_cc):
    with pytest.raises(errors.NeuronxCcNotFound, match="NC521"):
        _compile()


@pytest.mark.parametrize("kind", ["directory", "missing", "not executable"])
def test_a_compiler_path_that_is_no_executable_is_nc521_naming_it(kind, monkeypatch, tmp_path):
    """NEURON_COMPILE_NEURONX_CC=<a directory> passed as found, then failed with a bare
    PermissionError; a missing file said "set NEURON_COMPILE_NEURONX_CC" although it was set."""
    path = {"directory": tmp_path, "missing": tmp_path / "nope", "not executable": tmp_path / "cc"}
    path["not executable"].write_text("#!/bin/sh\n")
    monkeypatch.setenv("NEURON_COMPILE_NEURONX_CC", str(path[kind]))
    with pytest.raises(errors.NeuronxCcNotFound) as info:
        _compile()
    assert f"NEURON_COMPILE_NEURONX_CC='{path[kind]}' is not an executable file" in str(info.value)


def _run_mlp(options):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    x = torch.randn(4, 8)
    out = torch.compile(model, backend="neuron", options=options)(x)
    torch.testing.assert_close(out, model(x))
    return out


def test_neff_is_cached_and_negative_entries_stop_retries(double):
    _run_mlp({"target": "trn2"})
    assert len(double.calls()) == 1  # the forward graph (no backward was run)
    neffs = [e for e in disk_cache().entries() if e.manifest["graph_name"].endswith(".neff")]
    assert len(neffs) == 1 and neffs[0].read("model.neff").startswith(b"NEFF-DOUBLE")
    _run_mlp({"target": "trn2"})  # cached: neuronx-cc not run again
    assert len(double.calls()) == 1

    double.mode("fail", code="NCC_EVRF001")
    with pytest.raises(Exception) as info:
        _run_mlp({"target": "trn3"})
    assert "NC522" in str(info.value) and "NCC_EVRF001" in str(info.value)
    assert len(double.calls()) == 2
    with pytest.raises(Exception) as info:  # the failure is cached: no third compile
        _run_mlp({"target": "trn3"})
    assert "NC402" in str(info.value) and len(double.calls()) == 2


def test_neff_key_includes_compiler_version_flags_target_and_lnc(double, monkeypatch):
    def key(**options):
        cfg = load_config({"target": "trn2", **options}, env={})
        return neff.neff_key(
            TEXT, [], artifact_form="portable", cfg=cfg, exe=double.path, input_name="module.mlir"
        )

    base = key()
    parts = base.components()
    assert parts["neuronx_cc_version"] == "2.28.7631.0+double" and parts["target"] == "trn2"
    monkeypatch.setenv("NEURON_CC_FLAGS", "--auto-cast=matmult")
    assert key().explain(base) == ["flags"]
    monkeypatch.delenv("NEURON_CC_FLAGS")
    assert key(lnc=1).explain(base) == ["lnc"]
    assert key(target="trn3").explain(base) == ["target"]
    assert key(optlevel=3).explain(base) == ["optlevel"]
    monkeypatch.setenv("NEURONX_CC_DOUBLE_VERSION", "2.29.0.0+double")
    neuronx_cc._version.cache_clear()  # a new compiler install changes the binary's mtime
    assert key().explain(base) == ["neuronx_cc_version"]


def test_compile_only_compiles_the_neff_and_runs_on_cpu(double):
    from neuron_compile.trainium.neff import ToolchainWarning
    from neuron_compile.warn_once import reset_warn_once

    reset_warn_once()  # said once per process: another test may have said it already
    with pytest.warns(ToolchainWarning, match="compile-only mode: no Neuron device") as caught:
        _run_mlp({"target": "trn3", "lnc": 1})  # asserts eager numerics
    said = [w for w in caught if issubclass(w.category, ToolchainWarning)]
    assert [w.filename for w in said] == [__file__]  # the user's line, not ours
    (argv,) = double.calls()
    assert argv[argv.index("--target") + 1] == "trn3" and argv[argv.index("--lnc") + 1] == "1"
    assert len(neuron_compile.metrics()) == 1


def test_neuronx_cc_compiles_the_module_text_never_a_cached_artifact(double, tmp_path):
    """A NEFF cannot be checked against its source once built, so neuronx-cc's input is made
    from the key-bound module text: an HLO artifact swapped under the genuine module in the
    cache (a writer of a shared tier) is never what it compiles."""
    cfg = {"target": "trn2", "artifact": "hlo"}
    _run_mlp(cfg)
    cache = disk_cache()
    graphs = [e for e in cache.entries() if "artifact" in e.manifest["files"]]
    neffs = [e for e in cache.entries() if e.manifest["graph_name"].endswith(".neff")]
    (graph,), (neff,) = graphs, neffs
    genuine = json.loads(neff.read("model.neff").split(b"\0", 1)[1])["input_ops"]
    other = "func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {\n  return %a : tensor<4xf32>\n}"
    forged = {**graph.files(), "artifact": artifact_mod.serialize(other, "hlo")}
    shutil.rmtree(graph.path)
    cache.put(graph.key, forged, graph_name=graph.graph_name, components=graph.components)
    shutil.rmtree(neff.path)  # the NEFF is rebuilt from the graph entry, in a "new process":
    executable_cache.clear()
    _run_mlp(cfg)
    rebuilt = [e for e in disk_cache().entries() if e.manifest["graph_name"].endswith(".neff")]
    assert json.loads(rebuilt[0].read("model.neff").split(b"\0", 1)[1])["input_ops"] == genuine
    assert "stablehlo.dot_general" in genuine and len(double.calls()) == 2
