"""The example models under trn targets: every graph passes trn2 and trn3 legality, and both
artifact forms (StableHLO bytecode and HloModuleProto) round-trip with identical numerics on the
XLA CPU executor."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conv_net import ConvNet
from train_gpt import GPTConfig, TinyGPT
from train_mlp import MLP

import neuron_compile.trainium.legality as legality_mod
from neuron_compile import artifact as artifact_mod
from neuron_compile.runtime.xla_cpu import XlaCpuExecutable
from neuron_compile.targets import get_target


def _mlp():
    return MLP(), (torch.randn(16, 32),), lambda out: out.square().mean()


def _gpt():
    cfg = GPTConfig(n_layer=1, d_model=32, block_size=16)
    idx = torch.randint(0, cfg.vocab_size, (2, 16))
    return TinyGPT(cfg), (idx,), lambda out: out.float().logsumexp(-1).mean()


def _conv():
    y = torch.randint(0, 10, (4,))
    return ConvNet(width=8), (torch.randn(4, 3, 8, 8),), lambda out: F.cross_entropy(out, y)


MODELS = {"mlp": _mlp, "gpt": _gpt, "conv": _conv}


def _step(model, inputs, loss_fn, options):
    compiled = torch.compile(model, backend="neuron", options=options)
    out = compiled(*inputs)
    loss_fn(out).backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    return out.detach(), grads


def _random_inputs(lowered):
    g = torch.Generator().manual_seed(0)
    out = []
    for spec in lowered.inputs:
        if spec.arg_dtype.is_floating_point:
            out.append(torch.randn(spec.shape, generator=g).to(spec.arg_dtype))
        elif spec.arg_dtype == torch.bool:
            out.append(torch.randint(0, 2, spec.shape, generator=g).bool())
        else:
            out.append(torch.randint(0, 2, spec.shape, generator=g).to(spec.arg_dtype))
    return out


@pytest.mark.parametrize("name", list(MODELS))
def test_example_graphs_pass_trn2_and_trn3_legality_and_round_trip(
    name, monkeypatch, no_neuronx_cc
):
    seen = []  # (gm, lowered) of every compiled graph, checked for trn3 as well
    real_check = legality_mod.check_legality

    def spy(gm, lowered, target, **kw):
        seen.append((gm, lowered))
        real_check(gm, lowered, target, **kw)  # trn2: raises on any violation

    monkeypatch.setattr(legality_mod, "check_legality", spy)
    torch.manual_seed(0)
    model, inputs, loss_fn = MODELS[name]()
    _step(model, inputs, loss_fn, {"target": "trn2"})
    assert len(seen) >= 2  # forward and backward (plus fallback regions, if any)
    trn3 = get_target("trn3")
    for gm, lowered in seen:
        assert legality_mod.find_violations(gm, lowered, trn3, lnc=2) == []
        # StableHLO bytecode -> text -> HloModuleProto -> StableHLO -> XLA: same numbers as the
        # portable artifact the CPU path runs.
        bytecode = artifact_mod.serialize(lowered.text, "bytecode")
        text = artifact_mod.artifact_text(bytecode, "bytecode")
        proto = artifact_mod.serialize(text, "hlo")
        hlo_text = artifact_mod.artifact_text(proto, "hlo")  # verifies
        if lowered.custom_calls:
            # neuronx-cc kernel calls (rewrite_neuron_calls) survive both forms; XLA CPU cannot
            # run them (the CPU stand-in lowers their references, tested in tests/passes).
            for call in set(lowered.custom_calls):
                assert call in text and call in hlo_text
            continue
        args = _random_inputs(lowered)
        ref = XlaCpuExecutable(artifact_mod.serialize(lowered.text, "portable"))
        via_hlo = XlaCpuExecutable(artifact_mod.executable_input(proto, "hlo"))
        via_bc = XlaCpuExecutable(bytecode)
        slots = [None] * len(args)
        expected = ref(list(args), list(slots))
        for exe in (via_hlo, via_bc):
            got = exe(list(args), list(slots))
            assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))


@pytest.mark.parametrize("name", ["mlp"])  # GPT and conv: per graph, in the test above
def test_hlo_artifact_form_trains_identically_to_portable(name):
    results = {}
    for form in ("portable", "hlo"):
        torch.manual_seed(0)
        model, inputs, loss_fn = MODELS[name]()
        torch._dynamo.reset()
        results[form] = _step(model, inputs, loss_fn, {"artifact": form})
    (out_p, grads_p), (out_h, grads_h) = results["portable"], results["hlo"]
    assert torch.equal(out_p, out_h)
    assert all(torch.equal(a, b) for a, b in zip(grads_p, grads_h, strict=True))


def test_compile_only_without_neuronx_cc_says_so_once(no_neuronx_cc, recwarn):
    model, inputs, loss_fn = _mlp()
    _step(model, inputs, loss_fn, {"target": "trn3"})
    said = [w for w in recwarn if "without neuronx-cc" in str(w.message)]
    assert len(said) == 1 and "module.mlir" in str(said[0].message)


def test_cpu_target_skips_legality(monkeypatch):
    monkeypatch.setattr(legality_mod, "check_legality", lambda *a, **k: pytest.fail("called"))
    model, inputs, loss_fn = _mlp()
    out, grads = _step(model, inputs, loss_fn, {"target": "cpu"})
    assert out.shape == (16, 4) and grads
