"""The cpu target computes a convolution's grad_output once when both of its gradients read it
(``cpu/lowering.py:_shared_grad_output``): XLA CPU otherwise fuses the elementwise code that
makes it (here a BatchNorm's and a ReLU's backward) into each of the two transposes the library
convolutions need. Gradients still match eager; XLA's optimized backward holds that code once;
trn2 never gets the divide."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn as nn


class ConvBnReluConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1, bias=False),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.Conv2d(8, 8, 3, padding=1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _grads(model: nn.Module, run, x: torch.Tensor) -> list[torch.Tensor]:
    out = run(x)
    (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return grads


def _compiled(tmp_path: Path, target: str = "cpu") -> tuple[list[torch.Tensor], Path]:
    model = ConvBnReluConv()
    torch._dynamo.reset()
    options = {"target": target, "dump_dir": str(tmp_path)}
    grads = _grads(model, torch.compile(model, backend="neuron", options=options), _input())
    (backward,) = tmp_path.rglob("*backward*/module.portable.mlirbc")
    return grads, backward


def _input() -> torch.Tensor:
    # with an input gradient, the first convolution's backward needs both gradients
    x = torch.randn(4, 3, 12, 12, generator=torch.Generator().manual_seed(1))
    return x.requires_grad_()


def _optimized_products(module: Path) -> int:
    """Multiplies in XLA's optimized HLO of ``module``: each fused copy of the BatchNorm
    backward's elementwise code brings its own."""
    from jaxlib import xla_client

    from neuron_compile.runtime import xla_cpu

    backend, _, devices, _ = xla_cpu._client()
    options = xla_cpu.compile_options(xla_client.CompileOptions())
    hlo = backend.compile_and_load(module.read_bytes(), devices, options).hlo_modules()[0]
    return len(re.findall(r"= f32\[[\d,]+\]\S* multiply\(", hlo.to_string()))


def test_gradients_match_eager(tmp_path: Path) -> None:
    model = ConvBnReluConv().double()
    expected = _grads(model, model, _input().detach().double().requires_grad_())
    actual, _ = _compiled(tmp_path)
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e.float(), rtol=1e-4, atol=1e-4)


def test_xla_computes_the_shared_grad_output_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from neuron_compile.cpu import lowering

    _, once = _compiled(tmp_path / "once")
    monkeypatch.setattr(lowering, "_shared_grad_output", lambda node: False)
    _, fused_twice = _compiled(tmp_path / "twice")
    assert _optimized_products(once) < _optimized_products(fused_twice)


@pytest.mark.parametrize("target, divides", [("cpu", 1), ("trn2", 0)])
def test_only_the_cpu_target_gets_the_divide(tmp_path: Path, target: str, divides: int) -> None:
    _, backward = _compiled(tmp_path, target)
    text = backward.with_name("module.stablehlo.mlir").read_text()
    # the first convolution's grad_output comes out of the BatchNorm's and ReLU's backward; the
    # second's is the graph's input (the tangent), already in memory
    assert text.count("stablehlo.count_leading_zeros") == divides
