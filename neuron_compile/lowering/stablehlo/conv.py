"""Convolution forward and backward (1-D/2-D/3-D, strided, padded, dilated, grouped, transposed).

Every form is one ``stablehlo.convolution``. The backward formulas follow JAX's
``_conv_general_dilated_transpose_lhs/_rhs``:

* grad_input is a convolution of grad_output (dilated by the forward stride) with the spatially
  reversed kernel whose in/out feature roles are swapped (per group);
* grad_weight is a convolution of the input with grad_output in which batch and feature roles are
  swapped, the forward stride becomes the kernel dilation and the forward dilation the stride
  (``batch_group_count = groups`` for grouped convolutions).

A transposed convolution is the grad_input formula applied to its input, and its backward swaps
the two formulas. Low-precision operands keep their element type and accumulate into a float32
result (convolution's result type), rounded once, like eager PyTorch's opmath.

Integer convolutions (forward, regular and transposed) accumulate in their own integer type, as
eager's slow (im2col + gemm) integer kernels do; sums and products wrap identically in any order.
trn targets still reject them in legality (NCC_EVRF035); XLA CPU runs this rule.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ..context import LoweringContext
from ..emit import Value
from ..registry import lowering
from ..rules import floats, floats_and_ints
from .reduction import sum_

aten = torch.ops.aten


def _dims(spec: str, n: int) -> str:
    return "[" + ", ".join([spec[0], spec[1], *(str(i) for i in range(n))]) + "]"


def _numbers(lhs: str, rhs: str, out: str, n: int) -> str:
    """Dimension numbers: ``_numbers("bf", "oi", "bf", 2)`` -> ``[b, f, 0, 1]x[o, i, 0, 1]->...``."""
    return f"{_dims(lhs, n)}x{_dims(rhs, n)}->{_dims(out, n)}"


def per_dim(value: Sequence[int] | int, n: int) -> list[int]:
    """A conv argument (stride, padding, dilation) as one int per spatial dim: a single value
    applies to all ``n``."""
    values = [value] if isinstance(value, int) else list(value)
    return [int(v) for v in values] * n if len(values) == 1 else [int(v) for v in values]


def forward_padding(
    x: Value,
    w: Value,
    out_spatial: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
) -> list[tuple[int, int]]:
    """(low, high) padding per spatial dim of a regular convolution of ``x`` by ``w`` giving
    ``out_spatial``: the high side is cropped (negative) where ``out_spatial`` is shorter."""
    pads = []
    for size, k, s, p, d, out in zip(
        x.shape[2:], w.shape[2:], stride, padding, dilation, out_spatial, strict=True
    ):
        natural = (size + 2 * p - d * (k - 1) - 1) // s + 1
        hi = p if natural == out else (out - 1) * s + d * (k - 1) + 1 - size - p
        pads.append((p, hi))
    return pads


def conv_forward(
    ctx: LoweringContext,
    x: Value,
    w: Value,
    out_spatial: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    groups: int,
) -> Value:
    """Regular convolution ``x (N, C, *S) * w (O, C/g, *K) -> (N, O, *out_spatial)`` in the
    compute dtype. The high padding is derived from ``out_spatial`` so callers can crop."""
    n = w.rank - 2
    pads = forward_padding(x, w, out_spatial, stride, padding, dilation)
    return ctx.emit.convolution(
        x, w, [x.shape[0], w.shape[0], *out_spatial],
        dimension_numbers=_numbers("bf", "oi", "bf", n),
        strides=stride, padding=pads, lhs_dilation=[1] * n, rhs_dilation=dilation,
        feature_group_count=groups, out_dtype=ctx.compute_dtype(x.dtype),
    )  # fmt: skip


def swapped_kernel(ctx: LoweringContext, w: Value, groups: int) -> Value:
    """``w (O, C/g, *K)`` as ``(O/g, C, *K)`` with the window flipped: per group, the in/out
    roles swapped (the kernel of a convolution's input adjoint)."""
    e = ctx.emit
    n = w.rank - 2
    out_ch, in_per_group, kernel = w.shape[0], w.shape[1], list(w.shape[2:])
    k = e.reshape(w, [groups, out_ch // groups, in_per_group, *kernel])
    k = e.transpose(k, [1, 0, *range(2, n + 3)])
    k = e.reshape(k, [out_ch // groups, groups * in_per_group, *kernel])
    return e.reverse(k, list(range(2, n + 2)))


def transpose_lhs_padding(
    g: Value,
    w: Value,
    in_spatial: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
) -> list[tuple[int, int]]:
    """(low, high) padding of ``g (N, O, *S')`` spread by the stride, so that a unit-stride
    convolution with ``swapped_kernel`` gives ``in_spatial`` (the input adjoint)."""
    pads = []
    for size, k, s, p, d, o in zip(
        in_spatial, w.shape[2:], stride, padding, dilation, g.shape[2:], strict=True
    ):
        lo = d * (k - 1) - p
        pads.append((lo, size + d * (k - 1) - ((o - 1) * s + 1) - lo))
    return pads


def transpose_rhs_padding(
    x: Value,
    g: Value,
    kernel: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
) -> list[tuple[int, int]]:
    """(low, high) padding of ``x (N, C, *S)`` whose taps, strided like the forward, meet each
    position of ``g (N, O, *S')`` exactly once (the kernel adjoint)."""
    pads = []
    for size, k, s, p, d, o in zip(
        x.shape[2:], kernel, stride, padding, dilation, g.shape[2:], strict=True
    ):
        pads.append((p, (k - 1) * d + (o - 1) * s + 1 - size - p))
    return pads


def conv_transpose_lhs(
    ctx: LoweringContext,
    g: Value,
    w: Value,
    in_spatial: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    groups: int,
) -> Value:
    """Adjoint of ``conv_forward`` w.r.t. its input: ``g (N, O, *S') , w (O, C/g, *K) -> (N, C,
    *in_spatial)``. This is grad_input, and also a transposed convolution's forward."""
    e = ctx.emit
    n = w.rank - 2
    k = swapped_kernel(ctx, w, groups)
    pads = transpose_lhs_padding(g, w, in_spatial, stride, padding, dilation)
    return e.convolution(
        g, k, [g.shape[0], groups * w.shape[1], *in_spatial],
        dimension_numbers=_numbers("bf", "io", "bf", n),
        strides=[1] * n, padding=pads, lhs_dilation=stride, rhs_dilation=dilation,
        feature_group_count=groups, out_dtype=ctx.compute_dtype(g.dtype),
    )  # fmt: skip


def conv_transpose_rhs(
    ctx: LoweringContext,
    x: Value,
    g: Value,
    kernel: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    groups: int,
) -> Value:
    """Adjoint of ``conv_forward`` w.r.t. its kernel: ``x (N, C, *S), g (N, O, *S') -> (O, C/g,
    *kernel)`` (grad_weight). The batch dim N is contracted, so it plays the feature role."""
    n = len(kernel)
    pads = transpose_rhs_padding(x, g, kernel, stride, padding, dilation)
    return ctx.emit.convolution(
        x, g, [g.shape[1], x.shape[1] // groups, *kernel],
        dimension_numbers=_numbers("fb", "io", "fb", n),
        strides=dilation, padding=pads, lhs_dilation=[1] * n, rhs_dilation=stride,
        batch_group_count=groups, out_dtype=ctx.compute_dtype(x.dtype),
    )  # fmt: skip


#: Functions with the signature and result of ``conv_forward``, ``conv_transpose_lhs``
#: (grad_input, a transposed convolution) and ``conv_transpose_rhs`` (grad_weight): a target
#: whose compiler rejects a form (trn: input with kernel dilation, NCC_EVRF010) or runs it slowly
#: (XLA CPU: grouped convolutions, non-overlapping windows) passes an equivalent of its own to
#: ``lower_convolution(_backward)``. A transposed convolution's gradients are the regular forms
#: with the roles swapped: ``forward`` for its input, ``transpose_rhs`` for its kernel.
ConvForm = Callable[..., Value]


def _batched(ctx: LoweringContext, x: Value, w: Value) -> Value:
    """Unbatched inputs (C, *S) gain a leading batch dim of 1."""
    return ctx.emit.reshape(x, [1, *x.shape]) if x.rank == w.rank - 1 else x


@lowering(aten.convolution.default, supports=floats_and_ints)
def lower_convolution(
    ctx: LoweringContext,
    x: Value,
    w: Value,
    bias: Value | None,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    transposed: bool,
    output_padding: Sequence[int],
    groups: int,
    *,
    transpose_lhs: ConvForm = conv_transpose_lhs,
    forward: ConvForm = conv_forward,
) -> Value:
    e = ctx.emit
    n = w.rank - 2
    stride, padding, dilation = (per_dim(v, n) for v in (stride, padding, dilation))
    out = ctx.out_type()
    xb = _batched(ctx, x, w)
    w = e.convert(w, xb.dtype)
    out_spatial = list(out.shape[-n:])
    if transposed:  # output_padding is already part of the output shape
        y = transpose_lhs(ctx, xb, w, out_spatial, stride, padding, dilation, groups)
    else:
        y = forward(ctx, xb, w, out_spatial, stride, padding, dilation, groups)
    if bias is not None:
        b = e.convert(bias, y.dtype)
        y = e.binary("add", y, e.broadcast_in_dim(b, y.shape, [1]))
    return e.convert(e.reshape(y, out.shape), out.dtype)


@lowering(aten.convolution_backward.default, supports=floats)
def lower_convolution_backward(
    ctx: LoweringContext,
    grad_out: Value,
    x: Value,
    w: Value,
    bias_sizes: Sequence[int] | None,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    transposed: bool,
    output_padding: Sequence[int],
    groups: int,
    output_mask: Sequence[bool],
    *,
    transpose_lhs: ConvForm = conv_transpose_lhs,
    transpose_rhs: ConvForm = conv_transpose_rhs,
    forward: ConvForm = conv_forward,
) -> tuple[Value | None, Value | None, Value | None]:
    """Returns ``None`` for outputs masked off by ``output_mask`` (their meta val is None too)."""
    e = ctx.emit
    n = w.rank - 2
    stride, padding, dilation = (per_dim(v, n) for v in (stride, padding, dilation))
    xb, gb = _batched(ctx, x, w), _batched(ctx, grad_out, w)
    gb = e.convert(gb, xb.dtype)
    wc = e.convert(w, xb.dtype)
    spatial = list(xb.shape[2:])
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        if transposed:  # a transposed conv's input adjoint is the regular convolution
            gi = forward(ctx, gb, wc, spatial, stride, padding, dilation, groups)
        else:
            gi = transpose_lhs(ctx, gb, wc, spatial, stride, padding, dilation, groups)
        out = ctx.out_type(0)
        grad_input = e.convert(e.reshape(gi, out.shape), out.dtype)
    if output_mask[1]:
        kernel = list(w.shape[2:])
        if transposed:  # roles of input and grad_output swap
            gw = transpose_rhs(ctx, gb, xb, kernel, stride, padding, dilation, groups)
        else:
            gw = transpose_rhs(ctx, xb, gb, kernel, stride, padding, dilation, groups)
        grad_weight = e.convert(gw, ctx.out_type(1).dtype)
    if output_mask[2]:
        dims = [d for d in range(gb.rank) if d != 1]
        grad_bias = sum_(ctx, gb, dims, False, ctx.out_type(2).dtype)
    return grad_input, grad_weight, grad_bias
