"""Reductions. Low-precision floats accumulate in float32, as eager PyTorch does."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..context import LoweringContext
from ..emit import Value
from ..registry import ALL_DTYPES, FLOATS, dtypes_in, lowering

aten = torch.ops.aten
any_dtype = dtypes_in(*ALL_DTYPES)


def reduce_dims(dims: Sequence[int] | int | None, rank: int) -> list[int]:
    """Normalize a torch ``dim`` argument (None / [] = all dims) to sorted non-negative dims."""
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({d + rank if d < 0 else d for d in dims})


def keep_dims(
    ctx: LoweringContext, reduced: Value, x: Value, dims: Sequence[int], keepdim: bool
) -> Value:
    if not keepdim:
        return reduced
    shape = [1 if i in dims else d for i, d in enumerate(x.shape)]
    return ctx.emit.reshape(reduced, shape)


def sum_(
    ctx: LoweringContext, x: Value, dims: Sequence[int], keepdim: bool, dtype: torch.dtype
) -> Value:
    """Sum ``x`` over ``dims`` accumulating in the compute dtype of ``dtype``; result in ``dtype``."""
    acc = ctx.compute_dtype(dtype)
    if acc == torch.bool:
        acc = torch.int32
    src = ctx.emit.convert(x, acc)
    reduced = ctx.emit.reduce_simple(src, 0, dims, "add")
    return ctx.emit.convert(keep_dims(ctx, reduced, x, dims, keepdim), dtype)


@lowering(aten.sum.dim_IntList, aten.sum.default, supports=any_dtype)
def _lower_sum(
    ctx: LoweringContext, x: Value, dim=None, keepdim: bool = False, **_: object
) -> Value:
    return sum_(ctx, x, reduce_dims(dim, x.rank), keepdim, ctx.out_dtype)


@lowering(aten.mean.dim, aten.mean.default, supports=any_dtype)
def _lower_mean(
    ctx: LoweringContext, x: Value, dim=None, keepdim: bool = False, **_: object
) -> Value:
    dims = reduce_dims(dim, x.rank)
    out = ctx.out_dtype
    total = sum_(ctx, x, dims, keepdim, ctx.compute_dtype(out))
    count = math.prod(x.shape[d] for d in dims)
    mean = ctx.emit.binary("divide", total, ctx.full_like(count, total))
    return ctx.emit.convert(mean, out)


def _minmax_init(dtype: torch.dtype, largest: bool) -> float | int | bool:
    if dtype == torch.bool:
        return not largest
    if dtype.is_floating_point:
        return -math.inf if largest else math.inf
    info = torch.iinfo(dtype)
    return info.min if largest else info.max


@lowering(aten.amax.default, aten.max.default, supports=any_dtype)
def _lower_amax(ctx: LoweringContext, x: Value, dim=None, keepdim: bool = False) -> Value:
    dims = reduce_dims(dim, x.rank)
    reduced = ctx.emit.reduce_simple(x, _minmax_init(x.dtype, True), dims, "maximum")
    return keep_dims(ctx, reduced, x, dims, keepdim)


@lowering(aten.amin.default, aten.min.default, supports=any_dtype)
def _lower_amin(ctx: LoweringContext, x: Value, dim=None, keepdim: bool = False) -> Value:
    dims = reduce_dims(dim, x.rank)
    reduced = ctx.emit.reduce_simple(x, _minmax_init(x.dtype, False), dims, "minimum")
    return keep_dims(ctx, reduced, x, dims, keepdim)


@lowering(aten.any.dim, aten.any.dims, aten.any.default, supports=any_dtype)
def _lower_any(ctx: LoweringContext, x: Value, dim=None, keepdim: bool = False) -> Value:
    dims = reduce_dims(dim, x.rank)
    reduced = ctx.emit.reduce_simple(ctx.emit.convert(x, torch.bool), False, dims, "or")
    return keep_dims(ctx, reduced, x, dims, keepdim)


@lowering(aten.all.dim, aten.all.dims, aten.all.default, supports=any_dtype)
def _lower_all(ctx: LoweringContext, x: Value, dim=None, keepdim: bool = False) -> Value:
    dims = reduce_dims(dim, x.rank)
    reduced = ctx.emit.reduce_simple(ctx.emit.convert(x, torch.bool), True, dims, "and")
    return keep_dims(ctx, reduced, x, dims, keepdim)


def moments(
    ctx: LoweringContext, x: Value, dims: Sequence[int], correction: float = 0
) -> tuple[Value, Value]:
    """Mean and variance (divisor ``N - correction``) over ``dims``, kept as size-1 dims."""
    e = ctx.emit
    count = math.prod(x.shape[d] for d in dims)
    total = sum_(ctx, x, dims, True, x.dtype)
    mean = e.binary("divide", total, ctx.full_like(count, total))
    centered = e.binary("subtract", x, ctx.broadcast_to(mean, x.shape))
    sq = sum_(ctx, e.binary("multiply", centered, centered), dims, True, x.dtype)
    var = e.binary("divide", sq, ctx.full_like(max(count - correction, 0), sq))
    return mean, var


@lowering(aten.var.correction, aten.std.correction, supports=dtypes_in(*FLOATS))
def _lower_var_std(
    ctx: LoweringContext, x: Value, dim=None, *, correction=None, keepdim: bool = False
) -> Value:
    e = ctx.emit
    dims = reduce_dims(dim, x.rank)
    _, var = moments(
        ctx, e.convert(x, ctx.compute_dtype(x.dtype)), dims, 1 if correction is None else correction
    )
    if not keepdim:
        var = e.reshape(var, [d for i, d in enumerate(x.shape) if i not in dims])
    if ctx.node.target is aten.std.correction:
        var = e.unary("sqrt", var)
    return e.convert(var, ctx.out_dtype)
