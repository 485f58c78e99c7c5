"""The cpu target's forms of convolutions whose windows do not overlap
(``neuron_compile/cpu/windows.py``: 1x1 kernels, patch embeddings, transposed convolutions with
kernel = stride): forward and every gradient match eager for 1-D to 3-D, strided, kernels smaller
than their stride, output padding, with and without bias and in bfloat16; the cpu module carries
no ``stablehlo.convolution`` for them while trn2 still receives the reference ones, and padded
or overlapping windows keep the reference form on cpu too."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn as nn

CASES = {
    # name: (conv class, keyword arguments, spatial size)
    "pointwise": (nn.Conv2d, {"kernel_size": 1}, (7, 7)),
    "pointwise_strided": (nn.Conv2d, {"kernel_size": 1, "stride": 2}, (7, 7)),
    "pointwise_1d": (nn.Conv1d, {"kernel_size": 1, "stride": 3}, (10,)),
    "pointwise_3d": (nn.Conv3d, {"kernel_size": 1}, (3, 4, 3)),
    "patches_2x2": (nn.Conv2d, {"kernel_size": 2, "stride": 2}, (7, 9)),
    "patches_4x4": (nn.Conv2d, {"kernel_size": 4, "stride": 4}, (8, 8)),
    "kernel_below_stride": (nn.Conv2d, {"kernel_size": (2, 1), "stride": (3, 2)}, (8, 7)),
    "patches_1d": (nn.Conv1d, {"kernel_size": 3, "stride": 3}, (10,)),
    "patches_3d": (nn.Conv3d, {"kernel_size": 2, "stride": 2}, (4, 5, 4)),
    "transposed_2x2": (nn.ConvTranspose2d, {"kernel_size": 2, "stride": 2}, (4, 5)),
    "transposed_output_padding": (
        nn.ConvTranspose2d,
        {"kernel_size": 2, "stride": 3, "output_padding": 1},
        (4, 4),
    ),
    "transposed_1d": (nn.ConvTranspose1d, {"kernel_size": 3, "stride": 3}, (5,)),
    "transposed_3d": (nn.ConvTranspose3d, {"kernel_size": 2, "stride": 2}, (2, 3, 2)),
    "transposed_pointwise": (nn.ConvTranspose2d, {"kernel_size": 1}, (4, 4)),
}


def _model(name: str, bias: bool = True) -> tuple[nn.Module, torch.Tensor]:
    cls, kwargs, spatial = CASES[name]
    torch.manual_seed(0)
    return cls(6, 5, bias=bias, **kwargs), torch.randn(3, 6, *spatial)


def _grads(model: nn.Module, x: torch.Tensor, compiled: nn.Module) -> list[torch.Tensor]:
    x = x.clone().requires_grad_()
    out = compiled(x)
    (out.float() * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    grads = [x.grad, model.weight.grad] + ([model.bias.grad] if model.bias is not None else [])
    model.zero_grad(set_to_none=True)
    return [out.detach(), *grads]


def _compare(model: nn.Module, x: torch.Tensor, tol: float) -> None:
    expected = _grads(model, x, model)
    torch._dynamo.reset()
    actual = _grads(model, x, torch.compile(model, backend="neuron"))
    for a, e in zip(actual, expected, strict=True):
        assert a.dtype == e.dtype and a.shape == e.shape
        torch.testing.assert_close(a, e, rtol=tol, atol=tol)


@pytest.mark.parametrize("name", list(CASES))
def test_matches_eager(name: str) -> None:
    _compare(*_model(name), 1e-4)


@pytest.mark.parametrize("name", ["pointwise_strided", "transposed_2x2"])
def test_without_bias(name: str) -> None:
    _compare(*_model(name, bias=False), 1e-4)


@pytest.mark.parametrize("name", ["patches_2x2", "transposed_output_padding"])
def test_bfloat16_rounds_once_like_eager(name: str) -> None:
    model, x = _model(name)
    _compare(model.to(torch.bfloat16), x.to(torch.bfloat16), 5e-2)


def _convolutions(dump: Path) -> dict[str, int]:
    return {
        m.parent.name.rsplit("_", 2)[-2]: m.read_text().count("stablehlo.convolution")
        for m in sorted(dump.rglob("module.stablehlo.mlir"))
    }


REFERENCE = {"forward": 1, "backward": 2}  # grad_input and grad_weight, one each


@pytest.mark.parametrize(
    "target, cls, kwargs, expected",
    [
        ("cpu", nn.Conv2d, {"kernel_size": 1, "stride": 2}, {"forward": 0, "backward": 0}),
        ("cpu", nn.ConvTranspose2d, {"kernel_size": 2, "stride": 2}, {"forward": 0, "backward": 0}),
        ("trn2", nn.Conv2d, {"kernel_size": 1, "stride": 2}, REFERENCE),
        ("trn2", nn.ConvTranspose2d, {"kernel_size": 2, "stride": 2}, REFERENCE),
        ("cpu", nn.Conv2d, {"kernel_size": 1, "padding": 1}, REFERENCE),  # padded
        ("cpu", nn.Conv2d, {"kernel_size": 3, "stride": 2}, REFERENCE),  # windows overlap
        ("cpu", nn.ConvTranspose2d, {"kernel_size": 3, "stride": 2}, REFERENCE),
    ],
)
def test_only_non_overlapping_windows_on_cpu_become_products(
    tmp_path: Path, target: str, cls: type, kwargs: dict, expected: dict[str, int]
) -> None:
    torch.manual_seed(0)
    model = cls(4, 6, **kwargs)
    options = {"target": target, "dump_dir": str(tmp_path)}
    _grads(model, torch.randn(2, 4, 8, 8), torch.compile(model, backend="neuron", options=options))
    assert _convolutions(tmp_path) == expected
