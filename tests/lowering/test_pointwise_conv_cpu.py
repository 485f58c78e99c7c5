"""The cpu target's pointwise-convolution forms (``neuron_compile/cpu/pointwise.py``): forward and
both gradients match eager for 1-D to 3-D, strided, with and without bias and in bfloat16; the
cpu module carries no ``stablehlo.convolution`` for them while trn2 still receives the reference
ones, and a padded 1x1 convolution keeps the reference form on cpu too."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn as nn

CONVS = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}


def _grads(model: nn.Module, x: torch.Tensor, compiled: nn.Module) -> list[torch.Tensor]:
    x = x.clone().requires_grad_()
    out = compiled(x)
    (out.float() * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    grads = [x.grad, model.weight.grad] + ([model.bias.grad] if model.bias is not None else [])
    model.zero_grad(set_to_none=True)
    return [out.detach(), *grads]


def _compare(model: nn.Module, x: torch.Tensor, tol: float, options=None) -> None:
    expected = _grads(model, x, model)
    torch._dynamo.reset()
    actual = _grads(model, x, torch.compile(model, backend="neuron", options=options))
    for a, e in zip(actual, expected, strict=True):
        assert a.dtype == e.dtype and a.shape == e.shape
        torch.testing.assert_close(a, e, rtol=tol, atol=tol)


@pytest.mark.parametrize("dims", [1, 2, 3])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("bias", [True, False])
def test_matches_eager(dims: int, stride: int, bias: bool) -> None:
    torch.manual_seed(0)
    model = CONVS[dims](6, 5, 1, stride=stride, bias=bias)
    _compare(model, torch.randn(3, 6, *[7] * dims), 1e-4)


def test_bfloat16_rounds_once_like_eager() -> None:
    torch.manual_seed(0)
    model = nn.Conv2d(16, 8, 1, stride=2).to(torch.bfloat16)
    _compare(model, torch.randn(2, 16, 9, 9, dtype=torch.bfloat16), 5e-2)


def _convolutions(dump: Path) -> dict[str, int]:
    return {
        m.parent.name.rsplit("_", 2)[-2]: m.read_text().count("stablehlo.convolution")
        for m in sorted(dump.rglob("module.stablehlo.mlir"))
    }


@pytest.mark.parametrize(
    "target, padding, expected",
    [
        ("cpu", 0, {"forward": 0, "backward": 0}),
        # the reference: forward one; backward grad_input and grad_weight, one each
        ("trn2", 0, {"forward": 1, "backward": 2}),
        ("cpu", 1, {"forward": 1, "backward": 2}),  # padding: not pointwise
    ],
)
def test_only_unpadded_pointwise_convolutions_on_cpu_become_products(
    tmp_path: Path, target: str, padding: int, expected: dict[str, int]
) -> None:
    torch.manual_seed(0)
    model = nn.Conv2d(4, 6, 1, stride=2, padding=padding)
    options = {"target": target, "dump_dir": str(tmp_path)}
    _grads(model, torch.randn(2, 4, 8, 8), torch.compile(model, backend="neuron", options=options))
    assert _convolutions(tmp_path) == expected
