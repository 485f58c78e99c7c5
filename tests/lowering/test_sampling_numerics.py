"""Grid sampling and anti-aliased resizing (``decompositions/sampling.py``) vs eager.

Two layers: the decompositions run eagerly against the ATen kernels over every mode, padding and
``align_corners`` (cheap, so exhaustive; the bfloat16 forward must be bit-exact, as it follows the
kernels' per-operation rounding), then a few cases through ``torch.compile(backend="neuron")``,
forward and backward, with nothing falling back to the CPU.

bfloat16 gradients: the decompositions compute them in float32 (eager accumulates them in
bfloat16 in its own order), so compiled gradients are held to the float64 gradient instead: no
further from it than eager's (with some slack).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
import torch

import neuron_compile
from neuron_compile.capture import decomposition_table
from neuron_compile.decompositions import sampling

aten = torch.ops.aten
F32 = {"rtol": 1e-4, "atol": 1e-5}


def _grid(*shape: int, dtype: torch.dtype, span: float = 2.5) -> torch.Tensor:
    """Coordinates in [-span, span]: in range, past the borders, and several spans out."""
    return ((torch.rand(shape, dtype=torch.float64) * 2 - 1) * span).to(dtype)


def _assert_matches(ours: torch.Tensor, eager: torch.Tensor, dtype: torch.dtype) -> None:
    if dtype == torch.bfloat16:
        torch.testing.assert_close(ours, eager, rtol=0, atol=0)
    else:
        torch.testing.assert_close(ours, eager, **F32)


# --------------------------------------------------------------------------- eager-level checks

MODES_2D = list(itertools.product((0, 1, 2), (0, 1, 2), (False, True)))
MODES_3D = list(itertools.product((0, 1), (0, 1, 2), (False, True)))


def test_the_backend_table_decomposes_every_sampling_op():
    table = decomposition_table()
    for op in (
        aten.grid_sampler_2d.default,
        aten.grid_sampler_2d_backward.default,
        aten.grid_sampler_3d.default,
        aten.grid_sampler_3d_backward.default,
        aten._upsample_bilinear2d_aa.default,
        aten._upsample_bilinear2d_aa_backward.default,
    ):
        assert table[op] is sampling.DECOMPOSITIONS[op]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_grid_sampler_2d_matches_the_kernel_in_every_mode(dtype):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 6, 9, dtype=dtype)
    g = _grid(2, 7, 5, 2, dtype=dtype, span=3.5)
    for mode, padding, align in MODES_2D:
        eager = aten.grid_sampler_2d(x, g, mode, padding, align)
        _assert_matches(sampling.grid_sampler_2d(x, g, mode, padding, align), eager, dtype)
        if dtype == torch.float32:
            go = torch.randn_like(eager)
            ours = sampling.grid_sampler_2d_backward(go, x, g, mode, padding, align, [True, True])
            ref = aten.grid_sampler_2d_backward(go, x, g, mode, padding, align, [True, True])
            torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_grid_sampler_3d_matches_the_kernel_in_every_mode(dtype):
    torch.manual_seed(1)
    x = torch.randn(2, 2, 4, 5, 6, dtype=dtype)
    g = _grid(2, 3, 4, 2, 3, dtype=dtype, span=4.0)
    for mode, padding, align in MODES_3D:
        eager = aten.grid_sampler_3d(x, g, mode, padding, align)
        _assert_matches(sampling.grid_sampler_3d(x, g, mode, padding, align), eager, dtype)
        if dtype == torch.float32:
            go = torch.randn_like(eager)
            ours = sampling.grid_sampler_3d_backward(go, x, g, mode, padding, align, [True, True])
            ref = aten.grid_sampler_3d_backward(go, x, g, mode, padding, align, [True, True])
            torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)


def test_border_gradient_is_zero_on_the_border_itself():
    # grid -1 / +1 with align_corners=True land exactly on pixels 0 and W-1: eager's clip passes
    # no gradient there (torch.clamp's derivative would pass 1).
    x = torch.randn(1, 1, 3, 4)
    g = torch.tensor([[[[-1.0, 0.25], [1.0, -0.5], [0.3, 0.1]]]])
    go = torch.ones(1, 1, 1, 3)
    ours = sampling.grid_sampler_2d_backward(go, x, g, 0, 1, True, [True, True])[1]
    ref = aten.grid_sampler_2d_backward(go, x, g, 0, 1, True, [True, True])[1]
    assert ours[0, 0, 0, 0] == 0 and ours[0, 0, 1, 0] == 0
    torch.testing.assert_close(ours, ref)


def test_grid_sampler_masked_input_gradient_is_none():
    x, g = torch.randn(1, 2, 3, 4), _grid(1, 2, 2, 2, dtype=torch.float32)
    gi, gg = sampling.grid_sampler_2d_backward(
        torch.ones(1, 2, 2, 2), x, g, 0, 0, False, [False, True]
    )
    assert gi is None and gg.shape == g.shape


AA_CASES = [  # output size, align_corners, scales_h, scales_w
    ((3, 3), False, None, None),
    ((3, 3), True, 1.7, 0.9),
    ((4, 7), False, 0.4, 0.35),
    ((17, 23), False, None, None),  # upsampling: the triangle filter's own width
    ((10, 6), False, 2.0, None),  # height unchanged: that pass is skipped
]


@pytest.mark.parametrize("case", AA_CASES, ids=str)
def test_upsample_bilinear2d_aa_matches_the_kernel(case):
    size, align, sh, sw = case
    x = torch.randn(2, 3, 10, 20)
    eager = aten._upsample_bilinear2d_aa(x, size, align, sh, sw)
    torch.testing.assert_close(sampling.upsample_bilinear2d_aa(x, size, align, sh, sw), eager)
    go = torch.randn_like(eager)
    ref = aten._upsample_bilinear2d_aa_backward(go, size, list(x.shape), align, sh, sw)
    ours = sampling.upsample_bilinear2d_aa_backward(go, size, list(x.shape), align, sh, sw)
    torch.testing.assert_close(ours, ref)


def test_upsample_bilinear2d_aa_keeps_channels_last():
    x = torch.randn(2, 4, 10, 20).to(memory_format=torch.channels_last)
    for size in ([3, 5], [10, 20]):  # resized, and copied unchanged
        ours = sampling.upsample_bilinear2d_aa(x, size, False)
        assert ours.stride() == aten._upsample_bilinear2d_aa(x, size, False).stride()


def test_upsample_bilinear2d_aa_leaves_low_precision_to_eager():
    # Eager has no bfloat16 kernel (it raises); the op must stay whole, not get a value.
    x = torch.randn(1, 1, 8, 8, dtype=torch.bfloat16)
    assert sampling.upsample_bilinear2d_aa(x, [3, 3], False) is NotImplemented


NEAREST_CASES = [  # input spatial size, output size, scales
    ([5], [11], [None]),
    ([4, 5], [7, 10], [None, None]),  # 7/4 and the exact doubling
    ([4, 5], [3, 12], [1.3, 2.5]),  # scales given: they, not the sizes, set the source index
    ([3, 4, 5], [6, 4, 9], [None, 0.9, 1.7]),  # an unchanged size copies whatever its scale
]


@pytest.mark.parametrize("exact", [False, True], ids=["nearest", "nearest_exact"])
@pytest.mark.parametrize("case", NEAREST_CASES, ids=str)
def test_nearest_backward_matches_the_kernel(case, exact):
    ins, outs, scales = case
    name = (
        f"_upsample_nearest_exact{len(ins)}d_backward"
        if exact
        else f"upsample_nearest{len(ins)}d_backward"
    )
    op = getattr(aten, name).default
    for dtype in (torch.float32, torch.bfloat16):
        g = torch.randn(2, 3, *outs).to(dtype)
        ours = sampling.DECOMPOSITIONS[op](g, outs, [2, 3, *ins], *scales)
        ref = op(g, outs, [2, 3, *ins], *scales)
        tol = F32 if dtype == torch.float32 else {"rtol": 1e-2, "atol": 1e-2}
        torch.testing.assert_close(ours, ref, **tol)


# --------------------------------------------------------------------------- through the backend


def _compiled_vs_eager(fn: Callable[..., torch.Tensor], inputs: list[torch.Tensor]) -> None:
    """Forward and input gradients of ``fn`` compiled (no CPU fallback) vs eager."""
    dtype = inputs[0].dtype
    ours = [x.clone().requires_grad_() for x in inputs]
    theirs = [x.clone().requires_grad_() for x in inputs]
    wide = [x.double().requires_grad_() for x in inputs]
    neuron_compile.clear_fallback_ops()
    out = torch.compile(fn, backend="neuron")(*ours)
    ref = fn(*theirs)
    _assert_matches(out, ref, dtype)
    cot = torch.randn_like(ref)
    out.backward(cot)
    ref.backward(cot)
    fn(*wide).backward(cot.double())
    assert not neuron_compile.get_fallback_ops(), neuron_compile.get_fallback_ops()
    for a, b, w in zip(ours, theirs, wide, strict=True):
        if dtype == torch.float32:
            torch.testing.assert_close(a.grad, b.grad, **F32)
        else:  # no further from the float64 gradient than eager (bf16 accumulation order)
            ours_err = (a.grad.double() - w.grad).abs().max().item()
            eager_err = (b.grad.double() - w.grad).abs().max().item()
            assert ours_err <= 2 * eager_err + 2e-2 * w.grad.abs().max().item(), (
                ours_err,
                eager_err,
            )


COMPILED_2D = [(0, 0, False), (0, 2, True), (1, 1, False), (2, 2, False), (2, 0, True)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("mode", COMPILED_2D, ids=str)
def test_compiled_grid_sample_2d(mode, dtype):
    torch.manual_seed(2)
    interp, padding, align = mode
    x, g = torch.randn(2, 3, 5, 7, dtype=dtype), _grid(2, 4, 6, 2, dtype=dtype)
    _compiled_vs_eager(lambda a, b: aten.grid_sampler_2d(a, b, interp, padding, align), [x, g])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("mode", [(0, 2, False), (1, 1, True)], ids=str)
def test_compiled_grid_sample_3d(mode, dtype):
    torch.manual_seed(3)
    interp, padding, align = mode
    x, g = torch.randn(2, 2, 3, 4, 5, dtype=dtype), _grid(2, 3, 2, 4, 3, dtype=dtype, span=4.0)
    _compiled_vs_eager(lambda a, b: aten.grid_sampler_3d(a, b, interp, padding, align), [x, g])


@pytest.mark.parametrize("case", [AA_CASES[1], AA_CASES[3]], ids=str)
def test_compiled_upsample_bilinear2d_aa(case):
    size, align, sh, sw = case
    fn = lambda a: aten._upsample_bilinear2d_aa(a, size, align, sh, sw)  # noqa: E731
    _compiled_vs_eager(fn, [torch.randn(2, 3, 10, 20)])


def test_compiled_interpolate_antialias_vec_overload():
    # F.interpolate(antialias=True) reaches the .vec overload, which decomposes onto ours.
    fn = lambda a: torch.nn.functional.interpolate(  # noqa: E731
        a, scale_factor=0.45, mode="bilinear", antialias=True
    )
    _compiled_vs_eager(fn, [torch.randn(1, 2, 11, 13)])


def test_compiled_nearest_backward_called_directly():
    g = torch.randn(2, 3, 7, 10)
    fn = lambda t: aten.upsample_nearest2d_backward(t, [7, 10], [2, 3, 4, 5], None, None)  # noqa: E731
    neuron_compile.clear_fallback_ops()
    out = torch.compile(fn, backend="neuron")(g)
    assert not neuron_compile.get_fallback_ops(), neuron_compile.get_fallback_ops()
    torch.testing.assert_close(out, fn(g), **F32)
