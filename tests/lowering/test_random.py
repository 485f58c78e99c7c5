"""Random ops: statistics, reproducibility under torch.manual_seed, dropout semantics, IR."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.testing import FileCheck

from tests.helpers import lower_to_text

N = 200_000
# 6 standard errors: a correct generator fails these with probability ~1e-9.
SE = 6 / math.sqrt(N)


def _compiled(fn):
    return torch.compile(fn, backend="neuron", dynamic=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rand_is_uniform_on_unit_interval(dtype):
    r = _compiled(lambda x: torch.rand_like(x))(torch.empty(N, dtype=dtype)).float()
    assert r.min() >= 0 and r.max() < 1
    assert abs(r.mean().item() - 0.5) < SE * math.sqrt(1 / 12)
    assert abs(r.var().item() - 1 / 12) < 0.01
    hist = torch.histc(r, bins=10, min=0, max=1) / N  # every decile ~10%
    assert (hist - 0.1).abs().max() < 0.01


def test_randn_is_standard_normal():
    z = _compiled(lambda: torch.randn(N))()
    assert abs(z.mean().item()) < SE
    assert abs(z.std().item() - 1) < 0.01
    assert abs((z.abs() < 1).float().mean().item() - 0.6827) < 0.01  # 68% within one sigma


def test_bernoulli_matches_probabilities():
    p = torch.tensor([0.1, 0.5, 0.9]).repeat(N // 3)
    draws = _compiled(lambda q: torch.bernoulli(q))(p)
    assert set(draws.unique().tolist()) <= {0.0, 1.0}
    for k, q in enumerate([0.1, 0.5, 0.9]):
        assert abs(draws[k::3].mean().item() - q) < 0.01


def test_manual_seed_reproduces_and_successive_calls_differ():
    f = _compiled(lambda x: (torch.rand_like(x), torch.randn_like(x)))
    x = torch.empty(1000)
    torch.manual_seed(7)
    a = f(x)
    b = f(x)
    torch.manual_seed(7)
    c = f(x)
    assert all(torch.equal(u, v) for u, v in zip(a, c, strict=True))
    assert not torch.equal(a[0], b[0])
    assert not torch.equal(a[0], a[1])  # two ops in one graph draw different bits


def test_dropout_training_forward_and_backward_are_consistent():
    p = 0.3
    x = torch.randn(N, requires_grad=True)
    y = _compiled(lambda t: F.dropout(t, p, training=True))(x)
    kept = y != 0
    assert abs(kept.float().mean().item() - (1 - p)) < 0.01
    torch.testing.assert_close(y[kept], x.detach()[kept] / (1 - p))
    y.sum().backward()
    torch.testing.assert_close(x.grad, kept.float() / (1 - p))


def test_dropout_eval_is_identity():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5)).eval()
    x = torch.randn(3, 4)
    torch.testing.assert_close(_compiled(model)(x), model(x))


def test_random_graph_takes_a_seed_and_uses_rng_bit_generator():
    text = lower_to_text(lambda x: x + torch.rand_like(x), torch.randn(4))
    FileCheck().check("tensor<4xi32>").check("stablehlo.bitcast_convert").check_same(
        "tensor<2xui64>"
    ).check("stablehlo.rng_bit_generator").check_same("THREE_FRY").run(text)
    plain = lower_to_text(lambda x: x + 1, torch.randn(4))
    FileCheck().check_not("rng_bit_generator").check_not("xi32>").run(plain)
