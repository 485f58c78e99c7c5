"""The cpu target's grouped-convolution forms (``neuron_compile/cpu/lowering.py``): forward and
both gradients match eager for depthwise (with and without a channel multiplier) and other
groups, strided, dilated, 1-D to 3-D and in bfloat16; the cpu module carries no grouped
``stablehlo.convolution`` while trn2 still receives exactly one (the reference form)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn as nn

CASES = {
    # name: (conv class, in, out, kernel, stride, padding, dilation, groups, spatial)
    "depthwise3x3": (nn.Conv2d, 8, 8, 3, 1, 1, 1, 8, (9, 9)),
    "depthwise7x7": (nn.Conv2d, 6, 6, 7, 1, 3, 1, 6, (10, 10)),
    "multiplier2_stride2": (nn.Conv2d, 4, 8, 3, 2, 1, 1, 4, (9, 9)),
    "groups4_dilated": (nn.Conv2d, 8, 12, 3, 2, 2, 2, 4, (11, 11)),
    "groups2_1d": (nn.Conv1d, 6, 4, 5, 2, 1, 1, 2, (17,)),
    "groups3_3d": (nn.Conv3d, 6, 3, 3, 1, 1, 1, 3, (5, 6, 5)),
    "groups2_wide": (nn.Conv2d, 40, 20, 3, 1, 1, 1, 2, (6, 6)),  # a library conv per group
    "groups5_wide": (nn.Conv2d, 80, 40, 3, 1, 1, 1, 5, (6, 6)),  # 16 x 9 products: patches
    # strided: odd sizes, a kernel smaller than the stride, 3-D, 1-D depthwise
    "groups2_stride2_odd": (nn.Conv2d, 16, 32, 3, 2, 1, 1, 2, (9, 7)),
    "groups2_k1_stride2": (nn.Conv2d, 4, 4, 1, 2, 0, 1, 2, (7, 6)),
    "groups2_k4_stride3_pad2": (nn.Conv2d, 4, 6, 4, 3, 2, 1, 2, (11, 10)),
    "groups3_3d_stride2": (nn.Conv3d, 6, 6, 3, 2, 1, 1, 3, (5, 6, 7)),
    "depthwise_1d_k5_stride2": (nn.Conv1d, 4, 4, 5, 2, 0, 1, 4, (12,)),
}


def _model(name: str) -> tuple[nn.Module, torch.Tensor]:
    cls, cin, cout, k, s, p, d, g, spatial = CASES[name]
    torch.manual_seed(0)
    conv = cls(cin, cout, k, stride=s, padding=p, dilation=d, groups=g)
    return conv, torch.randn(3, cin, *spatial)


def _grads(model: nn.Module, x: torch.Tensor, compiled: nn.Module):
    x = x.clone().requires_grad_()
    out = compiled(x)
    (out.float() * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    grads = [x.grad, model.weight.grad, model.bias.grad]
    model.zero_grad(set_to_none=True)
    return out.detach(), grads


def _matches_eager(model: nn.Module, x: torch.Tensor, dump: Path | None = None) -> list[str]:
    """Compile ``model``, check its output and gradients against eager's (looser in bfloat16,
    where both round), and return the dumped forward and backward modules' text."""
    expected = _grads(model, x, model)
    torch._dynamo.reset()
    options = {"dump_dir": str(dump)} if dump is not None else {}
    actual = _grads(model, x, torch.compile(model, backend="neuron", options=options))
    low = x.dtype == torch.bfloat16
    assert actual[0].dtype == expected[0].dtype
    tol = 2e-2 if low else 1e-5
    torch.testing.assert_close(actual[0], expected[0], rtol=tol, atol=tol)
    for a, e in zip(actual[1], expected[1], strict=True):
        assert a.dtype == e.dtype
        torch.testing.assert_close(a, e, rtol=2e-2 if low else 1e-4, atol=5e-2 if low else 1e-4)
    if dump is None:
        return []
    return [next(dump.rglob(f"*{g}*/module.stablehlo.mlir")).read_text() for g in PHASES]


PHASES = ("forward", "backward")


@pytest.mark.parametrize("name", list(CASES))
def test_matches_eager(name: str) -> None:
    _matches_eager(*_model(name))


@pytest.mark.parametrize("name", ["groups4_dilated", "groups2_wide"])  # taps; per group
def test_bfloat16_rounds_once_like_eager(name: str) -> None:
    model, x = _model(name)
    _matches_eager(model.to(torch.bfloat16), x.to(torch.bfloat16))


def _grouped_convolutions(dump: Path) -> dict[str, int]:
    counts = {}
    for module in sorted(dump.rglob("module.stablehlo.mlir")):
        text = module.read_text()
        counts[module.parent.name.rsplit("_", 2)[-2]] = len(
            [m for m in re.findall(r"(feature|batch)_group_count = (\d+)", text) if m[1] != "1"]
        )
    return counts


@pytest.mark.parametrize("target, grouped", [("cpu", 0), ("trn2", 1)])
def test_only_the_cpu_target_gets_the_tap_forms(tmp_path: Path, target: str, grouped: int) -> None:
    model, x = _model("multiplier2_stride2")
    torch._dynamo.reset()
    options = {"target": target, "dump_dir": str(tmp_path)}
    _grads(model, x, torch.compile(model, backend="neuron", options=options))
    # forward: one grouped convolution; backward: grad_input and grad_weight, one each
    expected = {"forward": grouped, "backward": 2 * grouped}
    assert _grouped_convolutions(tmp_path) == expected


def test_depthwise_kernel_gradient_is_one_variadic_reduce(tmp_path: Path) -> None:
    """All 49 taps of a 7x7 depthwise kernel's gradient in one reduce (XLA fuses it with the
    slices), not one reduce per tap (each slice materialized first); the other reduce is the
    bias gradient."""
    model, x = _model("depthwise7x7")
    torch._dynamo.reset()
    _grads(model, x, torch.compile(model, backend="neuron", options={"dump_dir": str(tmp_path)}))
    (backward,) = tmp_path.rglob("*backward*/module.stablehlo.mlir")
    results = re.findall(r"%\S+?(?::(\d+))? = stablehlo\.reduce\(", backward.read_text())
    assert sorted(int(n or 1) for n in results) == [1, 49]


class DepthwiseThenNorm(nn.Module):
    """ConvNeXt's pattern: a 7x7 depthwise sum read by a LayerNorm's reductions, its
    normalization and (saved for the backward) autograd."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(6, 6, 7, padding=3, groups=6)
        self.norm = nn.LayerNorm(6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv(x).permute(0, 2, 3, 1))


def _depthwise_then_norm(tmp_path: Path | None) -> tuple[list[torch.Tensor], str]:
    """Output and gradients (float64 eager without ``tmp_path``), and XLA's optimized HLO of the
    compiled forward."""
    from jaxlib import xla_client

    from neuron_compile.runtime import xla_cpu

    model = DepthwiseThenNorm()
    x = torch.randn(3, 6, 10, 10, generator=torch.Generator().manual_seed(1))
    if tmp_path is None:
        model, x = model.double(), x.double()
        return [t.float() for t in [model(x), *_grads(model.conv, x, model)[1]]], ""
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="neuron", options={"dump_dir": str(tmp_path)})
    out, grads = _grads(model.conv, x, compiled)
    (forward,) = tmp_path.rglob("*forward*/module.portable.mlirbc")
    backend, _, devices, _ = xla_cpu._client()
    options = xla_cpu.compile_options(xla_client.CompileOptions())
    executable = backend.compile_and_load(forward.read_bytes(), devices, options)
    return [out, *grads], executable.hlo_modules()[0].to_string()


def _products(hlo: str) -> int:
    return len(re.findall(r"= f32\[[\d,]+\]\S* multiply\(", hlo))


def test_large_depthwise_sums_are_computed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 49-tap depthwise sum reaches XLA divided by a 1 it cannot prove is 1, so XLA computes
    it once instead of inside each of its consumers (which it does without the divide)."""
    from neuron_compile.cpu import lowering

    expected, _ = _depthwise_then_norm(None)
    once, once_hlo = _depthwise_then_norm(tmp_path / "once")
    for actual, reference in zip(once, expected, strict=True):
        torch.testing.assert_close(actual, reference, rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(lowering, "RECOMPUTED_TERMS", 49)
    _, recomputed_hlo = _depthwise_then_norm(tmp_path / "recomputed")
    assert _products(once_hlo) < 49 * 2 <= _products(recomputed_hlo)


@pytest.mark.parametrize(
    "channels, groups, reduce_results, products", [(16, 4, 36, 0), (64, 8, None, 1)]
)
def test_kernel_gradient_form_follows_its_own_bound(
    tmp_path: Path, channels: int, groups: int, reduce_results: int | None, products: int
) -> None:
    """A 3x3 kernel gradient over ``C/G`` = 4 channels (36 products per result) is one variadic
    reduce; over ``C/G`` = 8 in 8 groups (72 > ``KERNEL_GRADIENT_TERMS``; too many groups for a
    library convolution each) it is patches and one batched ``dot_general``, while its forward
    and input gradient (72 <= ``ELEMENTWISE_TERMS``) stay elementwise. Both match eager."""
    torch.manual_seed(0)
    conv = nn.Conv2d(channels, channels, 3, padding=1, groups=groups)
    forward, text = _matches_eager(conv, torch.randn(2, channels, 6, 6), tmp_path)
    assert "stablehlo.dot_general" not in forward
    assert text.count("stablehlo.dot_general") == products
    results = [int(n or 1) for n in re.findall(r"%\S+?(?::(\d+))? = stablehlo\.reduce\(", text)]
    assert (reduce_results in results) if reduce_results else max(results, default=1) < 36


def _convolutions(text: str) -> list[int]:
    """The ``feature_group_count`` of each ``stablehlo.convolution`` in a module's text."""
    return [int(n) for n in re.findall(r"feature_group_count = (\d+)", text)]


@pytest.mark.parametrize(
    "conv, library",
    [
        (nn.Conv2d(16, 32, 3, stride=2, padding=1, groups=2), True),  # conv_net's: 8 per group
        (nn.Conv2d(64, 64, 3, padding=1, groups=4), True),
        (nn.Conv2d(64, 64, 3, padding=1, groups=8), False),  # too many groups
        (nn.Conv2d(8, 8, 3, padding=1, groups=2), False),  # too few channels per group
        (nn.Conv1d(32, 32, 3, padding=1, groups=2), False),  # 1-D: no faster library path
    ],
)
def test_few_wide_groups_are_one_library_convolution_each(
    tmp_path: Path, conv: nn.Module, library: bool
) -> None:
    """2-D convolutions with at most ``LIBRARY_GROUPS`` groups of at least ``LIBRARY_CHANNELS``
    input channels run one ungrouped convolution per group for the forward and for each
    gradient; the others keep the tap forms (no convolution at all). Values match eager."""
    torch.manual_seed(0)
    x = torch.randn(3, conv.in_channels, *([9] * (conv.weight.dim() - 2)))
    forward, backward = _matches_eager(conv, x, tmp_path)
    assert _convolutions(forward) == ([1] * conv.groups if library else [])
    assert _convolutions(backward) == ([1] * 2 * conv.groups if library else [])
