"""Softmax, layer norm and group norm (batch norm lives in ``batch_norm.py``).

All statistics are computed in float32 for low-precision inputs, as eager PyTorch does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..context import LoweringContext
from ..emit import Value
from ..registry import lowering
from ..rules import exact_divide, floats, minmax_init
from .reduction import keep_dims, moments, sum_

aten = torch.ops.aten


def _shifted(ctx: LoweringContext, x: Value, dim: int) -> tuple[Value, int]:
    """``x - max(x, dim)`` in the compute dtype (the max-shift keeps exp from overflowing)."""
    e = ctx.emit
    dim = dim + x.rank if dim < 0 else dim
    x = e.convert(x, ctx.compute_dtype(x.dtype))
    m = keep_dims(
        ctx, e.reduce_simple(x, minmax_init(x.dtype, True), [dim], "maximum"), x, [dim], True
    )
    return e.binary("subtract", x, ctx.broadcast_to(m, x.shape)), dim


@lowering(aten._softmax.default, supports=floats)
def _lower_softmax(ctx: LoweringContext, x: Value, dim: int, half_to_float: bool = False) -> Value:
    e = ctx.emit
    if x.rank == 0:  # eager treats a 0-d tensor as one element along dim 0 (or -1)
        return e.reshape(_lower_softmax(ctx, e.reshape(x, (1,)), 0), ())
    shifted, dim = _shifted(ctx, x, dim)
    ex = e.unary("exponential", shifted)
    total = sum_(ctx, ex, [dim], True, ex.dtype)
    return e.convert(e.binary("divide", ex, ctx.broadcast_to(total, ex.shape)), ctx.out_dtype)


@lowering(aten._log_softmax.default, supports=floats)
def _lower_log_softmax(
    ctx: LoweringContext, x: Value, dim: int, half_to_float: bool = False
) -> Value:
    e = ctx.emit
    if x.rank == 0:  # as in _lower_softmax
        return e.reshape(_lower_log_softmax(ctx, e.reshape(x, (1,)), 0), ())
    shifted, dim = _shifted(ctx, x, dim)
    total = sum_(ctx, e.unary("exponential", shifted), [dim], True, shifted.dtype)
    out = e.binary("subtract", shifted, ctx.broadcast_to(e.unary("log", total), shifted.shape))
    return e.convert(out, ctx.out_dtype)


@lowering(aten.native_layer_norm.default, supports=floats)
def _lower_native_layer_norm(
    ctx: LoweringContext,
    x: Value,
    normalized_shape: Sequence[int],
    weight: Value | None,
    bias: Value | None,
    eps: float,
) -> tuple[Value, Value, Value]:
    e = ctx.emit
    axis = x.rank - len(normalized_shape)
    dims = list(range(axis, x.rank))
    xf = e.convert(x, ctx.compute_dtype(x.dtype))
    mean, var = moments(ctx, xf, dims)
    rstd = e.unary("rsqrt", e.binary("add", var, ctx.full_like(eps, var)))
    y = e.binary(
        "multiply",
        e.binary("subtract", xf, ctx.broadcast_to(mean, xf.shape)),
        ctx.broadcast_to(rstd, xf.shape),
    )
    if weight is not None:
        y = e.binary("multiply", y, ctx.broadcast_to(e.convert(weight, y.dtype), y.shape))
    if bias is not None:
        y = e.binary("add", y, ctx.broadcast_to(e.convert(bias, y.dtype), y.shape))
    return (
        e.convert(y, ctx.out_type(0).dtype),
        e.convert(mean, ctx.out_type(1).dtype),
        e.convert(rstd, ctx.out_type(2).dtype),
    )


@lowering(aten.native_layer_norm_backward.default, supports=floats)
def _lower_native_layer_norm_backward(
    ctx: LoweringContext,
    grad_out: Value,
    x: Value,
    normalized_shape: Sequence[int],
    mean: Value,
    rstd: Value,
    weight: Value | None,
    bias: Value | None,
    output_mask: Sequence[bool],
) -> tuple[Value | None, Value | None, Value | None]:
    """What PyTorch's decomposition (``torch._decomp.decompositions.native_layer_norm_backward``)
    computes, operation for operation in the same dtypes, for the targets that keep the op whole
    (``Target.kept_ops``): with ``x_hat = (x - mean) * rstd`` and ``gh = g * weight``,
    ``d_input = rstd / N * (gh * N - sum(gh) - x_hat * sum(gh * x_hat))`` over the normalized
    dims; ``d_weight = sum(g * x_hat)``, ``d_bias = sum(g)`` over the others."""
    e = ctx.emit
    acc = ctx.compute_dtype(x.dtype)
    axis = x.rank - len(normalized_shape)
    inner, outer = list(range(axis, x.rank)), list(range(axis))
    n = math.prod(x.shape[axis:])
    outs: list[Value | None] = [None, None, None]
    if n == 0 or math.prod(x.shape[:axis]) == 0:
        for i, wanted in enumerate(output_mask):
            if wanted and (i == 0 or (weight, bias)[i - 1] is not None):
                out = ctx.out_type(i)
                outs[i] = e.full(0, out.shape, out.dtype)
        return outs[0], outs[1], outs[2]
    g, xf = e.convert(grad_out, acc), e.convert(x, acc)

    def times(a: Value, b: Value) -> Value:
        return e.binary("multiply", a, ctx.broadcast_to(b, a.shape))

    rstd = e.convert(rstd, acc)
    x_hat = times(e.binary("subtract", xf, ctx.broadcast_to(e.convert(mean, acc), xf.shape)), rstd)
    grad_x_hat = g if weight is None else times(g, e.convert(weight, acc))
    if output_mask[0]:
        a = times(grad_x_hat, ctx.full_like(n, grad_x_hat))
        b = sum_(ctx, grad_x_hat, inner, True, acc)
        c2 = sum_(ctx, e.binary("multiply", grad_x_hat, x_hat), inner, True, acc)
        c3 = times(x_hat, c2)
        inner_term = e.binary("subtract", e.binary("subtract", a, ctx.broadcast_to(b, a.shape)), c3)
        scale = exact_divide(ctx, rstd, ctx.full_like(n, rstd))
        outs[0] = e.convert(times(inner_term, scale), ctx.out_type(0).dtype)
    if output_mask[1] and weight is not None:
        d_weight = e.binary("multiply", g, x_hat)
        d_weight = sum_(ctx, d_weight, outer, False, acc) if outer else d_weight
        outs[1] = e.convert(d_weight, ctx.out_type(1).dtype)
    if output_mask[2] and bias is not None:
        d_bias = sum_(ctx, g, outer, False, acc) if outer else g
        outs[2] = e.convert(d_bias, ctx.out_type(2).dtype)
    return outs[0], outs[1], outs[2]


@lowering(aten.native_group_norm.default, supports=floats)
def _lower_native_group_norm(
    ctx: LoweringContext,
    x: Value,
    weight: Value | None,
    bias: Value | None,
    n: int,
    c: int,
    hxw: int,
    group: int,
    eps: float,
) -> tuple[Value, Value, Value]:
    """Statistics per (sample, group) over ``(C / group) * HxW`` elements; the affine transform is
    per channel. Returns (out, mean, rstd) with mean/rstd of shape (N, group), as eager does."""
    e = ctx.emit
    xf = e.convert(x, ctx.compute_dtype(x.dtype))
    grouped = e.reshape(xf, [n, group, (c // group) * hxw])
    mean, var = moments(ctx, grouped, [2])
    rstd = e.unary("rsqrt", e.binary("add", var, ctx.full_like(eps, var)))
    normed = e.binary(
        "multiply",
        e.binary("subtract", grouped, ctx.broadcast_to(mean, grouped.shape)),
        ctx.broadcast_to(rstd, grouped.shape),
    )
    y = e.reshape(normed, [n, c, hxw])
    if weight is not None:
        w = e.convert(weight, y.dtype)
        y = e.binary("multiply", y, e.broadcast_in_dim(w, y.shape, [1]))
    if bias is not None:
        b = e.convert(bias, y.dtype)
        y = e.binary("add", y, e.broadcast_in_dim(b, y.shape, [1]))
    stats = [n, group]
    return (
        e.convert(e.reshape(y, x.shape), ctx.out_type(0).dtype),
        e.convert(e.reshape(mean, stats), ctx.out_type(1).dtype),
        e.convert(e.reshape(rstd, stats), ctx.out_type(2).dtype),
    )
