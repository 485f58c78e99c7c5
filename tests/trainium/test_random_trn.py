"""Random ops bound for Trainium: dropout training compiles for trn2/trn3, its module carries no
RngBitGenerator and no 64-bit state (NCC_EVRF006 / EVRF062), and the trn stand-in draws the same
bits as the cpu target, so a mask checked here is the one the device applies."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from train_gpt import GPTConfig, TinyGPT

import neuron_compile.trainium.legality as legality_mod
from tests.helpers import train_losses

#: a 64-bit element type of a value (``array<i64>`` attribute payloads are not values)
SIXTY_FOUR_BIT_TYPE = re.compile(r"tensor<(?:[0-9x]*x)?(?:ui64|i64|f64)>")


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 8))


def _gpt_with_dropout(p: float = 0.1) -> TinyGPT:
    """TinyGPT with GPT-2's residual dropout (after attention's projection and after the MLP)."""
    model = TinyGPT(GPTConfig(n_layer=1, d_model=32, block_size=16))
    for block in model.blocks:
        block.attn.proj = nn.Sequential(block.attn.proj, nn.Dropout(p))
        block.mlp.append(nn.Dropout(p))
    return model


def _losses(model: nn.Module, batches, loss_fn, target: str, steps: int = 3) -> list[float]:
    """SGD losses of ``steps`` compiled steps under ``torch.manual_seed(1)``."""
    torch._dynamo.reset()
    options = {"target": target}
    return train_losses(
        model, batches[:steps], loss_fn, compile_backend="neuron", lr=0.1, options=options, seed=1
    )


@pytest.mark.parametrize("target", ["trn2", "trn3"])
def test_dropout_mlp_trains_on_trn_with_the_cpu_losses(target, no_neuronx_cc):
    torch.manual_seed(0)
    model = _mlp()
    batches = [(torch.randn(16, 32),) for _ in range(3)]

    def loss_fn(m, x):
        return m(x).square().mean()

    cpu = _losses(model, batches, loss_fn, "cpu")
    assert _losses(model, batches, loss_fn, target) == cpu
    # Reproducible: the same seed gives the same first step again.
    assert _losses(model, batches[:1], loss_fn, target, steps=1) == cpu[:1]


def test_tinygpt_with_dropout_trains_on_trn2_with_the_cpu_losses(no_neuronx_cc):
    torch.manual_seed(0)
    model = _gpt_with_dropout()
    batches = [(torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16))) for _ in range(2)]

    def loss_fn(m, idx, targets):
        return F.cross_entropy(m(idx).flatten(0, 1), targets.flatten())

    cpu = _losses(model, batches, loss_fn, "cpu", steps=2)
    trn2 = _losses(model, batches, loss_fn, "trn2", steps=2)
    no_dropout = _losses(model.eval(), batches, loss_fn, "cpu", steps=2)
    assert trn2 == pytest.approx(cpu, rel=1e-6, abs=1e-6)
    assert cpu[0] != no_dropout[0]  # dropout is really on


def test_trn2_modules_have_no_rng_bit_generator_three_fry_or_ui64(monkeypatch, no_neuronx_cc):
    seen = []
    real_check = legality_mod.check_legality

    def spy(gm, lowered, target, **kw):
        seen.append(lowered.text)
        real_check(gm, lowered, target, **kw)

    monkeypatch.setattr(legality_mod, "check_legality", spy)
    torch._dynamo.reset()
    model = _mlp()
    torch.compile(model, backend="neuron", options={"target": "trn2"})(
        torch.randn(16, 32)
    ).sum().backward()
    forward = [t for t in seen if "stablehlo.shift_left" in t]
    assert len(seen) >= 2 and forward  # forward (with Threefry) and backward
    for text in seen:
        assert "rng_bit_generator" not in text and "THREE_FRY" not in text
        assert not SIXTY_FOUR_BIT_TYPE.search(text), SIXTY_FOUR_BIT_TYPE.search(text)


def test_dropout_masks_are_bit_identical_on_cpu_and_the_trn2_stand_in(no_neuronx_cc):
    x = torch.randn(64, 257)  # odd numel: the last Threefry block is half used

    def f(t):
        out, mask = torch.native_dropout(t, 0.5, True)
        return out, mask, torch.rand_like(t), torch.randn(3, 5)

    results = {}
    for target in ("cpu", "trn2"):
        torch._dynamo.reset()
        torch.manual_seed(3)
        compiled = torch.compile(f, backend="neuron", options={"target": target})
        results[target] = [compiled(x), compiled(x)]  # two calls: two seeds
    for a, b in zip(results["cpu"], results["trn2"], strict=True):
        assert all(torch.equal(u, v) for u, v in zip(a, b, strict=True))
    first, second = results["cpu"]
    assert not torch.equal(first[1], second[1])
    assert 0.45 < first[1].float().mean().item() < 0.55
