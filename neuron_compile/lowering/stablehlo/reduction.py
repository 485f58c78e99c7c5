"""Reductions. Low-precision floats accumulate in float32, as eager PyTorch does."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from ..context import LoweringContext
from ..emit import Value
from ..registry import lowering
from ..rules import INDEX, any_dtype, exact_divide, floats, minmax_init

aten = torch.ops.aten


def reduce_dims(dims: Sequence[int] | int | None, rank: int) -> list[int]:
    """Normalize a torch ``dim`` argument (None / [] = all dims) to sorted non-negative dims.
    A 0-d tensor accepts dim 0 / -1 and has nothing to reduce."""
    if rank == 0:
        return []
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


def accumulated(ctx: LoweringContext, x: Value, dtype: torch.dtype, acc: torch.dtype) -> Value:
    """``x`` as a reduction or scan with result dtype ``dtype`` reads it: cast to ``dtype`` first,
    as eager's ``dtype=`` does (``sum(dtype=float16)`` of float32 values sums their float16
    roundings), then to the accumulation dtype ``acc``."""
    return ctx.emit.convert(ctx.emit.convert(x, dtype), acc)


def sum_(
    ctx: LoweringContext, x: Value, dims: Sequence[int], keepdim: bool, dtype: torch.dtype
) -> Value:
    """Sum ``x`` (read as ``dtype``) over ``dims`` accumulating in the compute dtype of
    ``dtype``; result in ``dtype``."""
    acc = ctx.compute_dtype(dtype)
    if acc == torch.bool:
        acc = torch.int32
    src = accumulated(ctx, x, dtype, acc)
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
    mean = exact_divide(ctx, total, ctx.full_like(count, total))  # eager: sum / n
    return ctx.emit.convert(mean, out)


@lowering(aten.amax.default, aten.max.default, supports=any_dtype)
def _lower_amax(ctx: LoweringContext, x: Value, dim=None, keepdim: bool = False) -> Value:
    dims = reduce_dims(dim, x.rank)
    reduced = ctx.emit.reduce_simple(x, minmax_init(x.dtype, True), dims, "maximum")
    return keep_dims(ctx, reduced, x, dims, keepdim)


@lowering(aten.amin.default, aten.min.default, supports=any_dtype)
def _lower_amin(ctx: LoweringContext, x: Value, dim=None, keepdim: bool = False) -> Value:
    dims = reduce_dims(dim, x.rank)
    reduced = ctx.emit.reduce_simple(x, minmax_init(x.dtype, False), dims, "minimum")
    return keep_dims(ctx, reduced, x, dims, keepdim)


@lowering(aten.any.dim, aten.any.dims, aten.any.default, supports=any_dtype)
def _lower_any(ctx: LoweringContext, x: Value, dim=None, keepdim: bool = False) -> Value:
    dims = reduce_dims(dim, x.rank)
    reduced = ctx.emit.reduce_simple(ctx.emit.convert(x, torch.bool), False, dims, "or")
    # eager's result is bool, or uint8 for uint8
    return ctx.emit.convert(keep_dims(ctx, reduced, x, dims, keepdim), ctx.out_dtype)


@lowering(aten.all.dim, aten.all.dims, aten.all.default, supports=any_dtype)
def _lower_all(ctx: LoweringContext, x: Value, dim=None, keepdim: bool = False) -> Value:
    dims = reduce_dims(dim, x.rank)
    reduced = ctx.emit.reduce_simple(ctx.emit.convert(x, torch.bool), True, dims, "and")
    # eager's result is bool, or uint8 for uint8
    return ctx.emit.convert(keep_dims(ctx, reduced, x, dims, keepdim), ctx.out_dtype)


def moments(
    ctx: LoweringContext, x: Value, dims: Sequence[int], correction: float = 0
) -> tuple[Value, Value]:
    """Mean and variance (divisor ``N - correction``) over ``dims``, kept as size-1 dims. Both
    divisions are exact: with XLA's reciprocal multiply a constant row's mean was an ulp off, so
    its variance was not 0 and layer_norm of a constant row gave -0.53 instead of 0."""
    e = ctx.emit
    count = math.prod(x.shape[d] for d in dims)
    total = sum_(ctx, x, dims, True, x.dtype)
    mean = exact_divide(ctx, total, ctx.full_like(count, total))
    centered = e.binary("subtract", x, ctx.broadcast_to(mean, x.shape))
    sq = sum_(ctx, e.binary("multiply", centered, centered), dims, True, x.dtype)
    var = exact_divide(ctx, sq, ctx.full_like(max(count - correction, 0), sq))
    return mean, var


def _power_of_two_scales(
    ctx: LoweringContext, x: Value, dims: Sequence[int]
) -> tuple[Value, Value]:
    """``(2^-E, 2^E)`` per slice of float32 ``x`` over ``dims`` (kept as size-1 dims), ``E`` the
    exponent of the slice's largest magnitude, clamped so that both are normal floats. Read from
    the bits: no arithmetic that could round or flush."""
    e = ctx.emit
    top = keep_dims(ctx, e.reduce_simple(e.unary("abs", x), 0.0, dims, "maximum"), x, dims, True)
    bits = e.bitcast_convert(top, torch.int32)

    def i32(value: int) -> Value:
        return e.full(value, bits.shape, torch.int32)

    biased = e.binary("and", e.binary("shift_right_logical", bits, i32(23)), i32(0xFF))
    biased = e.clamp(i32(1), biased, i32(253))
    down = e.binary("shift_left", e.binary("subtract", i32(254), biased), i32(23))
    up = e.binary("shift_left", biased, i32(23))
    return e.bitcast_convert(down, torch.float32), e.bitcast_convert(up, torch.float32)


def wide_moments(
    ctx: LoweringContext, x: Value, dims: Sequence[int], correction: float, root: bool
) -> tuple[Value, Value]:
    """Mean and variance (standard deviation with ``root``) of ``x`` over ``dims``, kept as
    size-1 dims, for ``var``/``std`` and their ``_mean`` forms.

    Eager computes these in double for float32 (and bf16/f16) inputs, so deviations up to
    float32's largest value square without overflowing: ``std([1e20, -1e20, 3, 5])`` is 8.2e19
    and ``var_mean([3e38, 3e38, 1, 2])``'s mean 1.5e38. In float32 the squares (or the sum)
    overflowed to inf. Each slice is first scaled by a power of two that brings its largest
    magnitude into [1, 2): exact, and rounding commutes with it, so wherever the unscaled
    float32 computation stays finite the bits are its bits; scaled back after the sums (and the
    square root), a result overflows only where eager's double result does not fit float32.
    float64 computes as eager does, unscaled (eager's squares overflow there too)."""
    e = ctx.emit
    x = e.convert(x, ctx.compute_dtype(x.dtype))
    if x.dtype != torch.float32:
        mean, var = moments(ctx, x, dims, correction)
        return mean, e.unary("sqrt", var) if root else var
    down, up = _power_of_two_scales(ctx, x, dims)
    mean, var = moments(
        ctx, e.binary("multiply", x, ctx.broadcast_to(down, x.shape)), dims, correction
    )
    if root:
        var = e.binary("multiply", e.unary("sqrt", var), up)
    else:  # 2^E twice: 2^2E itself may not be a float32
        var = e.binary("multiply", e.binary("multiply", var, up), up)
    return e.binary("multiply", mean, up), var


_ROOTS = (aten.std.correction, aten.std_mean.correction)


@lowering(aten.var.correction, aten.std.correction, supports=floats)
def _lower_var_std(
    ctx: LoweringContext, x: Value, dim=None, *, correction=None, keepdim: bool = False
) -> Value:
    e = ctx.emit
    dims = reduce_dims(dim, x.rank)
    correction = 1 if correction is None else correction
    _, var = wide_moments(ctx, x, dims, correction, ctx.node.target in _ROOTS)
    if not keepdim:
        var = e.reshape(var, [d for i, d in enumerate(x.shape) if i not in dims])
    return e.convert(var, ctx.out_dtype)


@lowering(aten.var_mean.correction, aten.std_mean.correction, supports=floats)
def _lower_var_mean(
    ctx: LoweringContext, x: Value, dim=None, *, correction=None, keepdim: bool = False
) -> tuple[Value, Value]:
    e = ctx.emit
    dims = reduce_dims(dim, x.rank)
    correction = 1 if correction is None else correction
    mean, var = wide_moments(ctx, x, dims, correction, ctx.node.target in _ROOTS)
    if not keepdim:
        kept = [d for i, d in enumerate(x.shape) if i not in dims]
        mean, var = e.reshape(mean, kept), e.reshape(var, kept)
    return e.convert(var, ctx.out_type(0).dtype), e.convert(mean, ctx.out_type(1).dtype)


# ---- products -------------------------------------------------------------------------------
@lowering(aten.prod.dim_int, aten.prod.default, supports=any_dtype)
def _lower_prod(
    ctx: LoweringContext, x: Value, dim: int | None = None, keepdim: bool = False, **_: object
) -> Value:
    e = ctx.emit
    out = ctx.out_dtype
    acc = ctx.compute_dtype(out)
    dims = reduce_dims(dim, x.rank)
    if acc == torch.bool:
        reduced = e.reduce_simple(e.convert(x, torch.bool), True, dims, "and")
    else:
        reduced = e.reduce_simple(accumulated(ctx, x, out, acc), 1, dims, "multiply")
    return e.convert(keep_dims(ctx, reduced, x, dims, keepdim), out)


# ---- norms ----------------------------------------------------------------------------------
def _vector_norm(ctx: LoweringContext, x: Value, ord: float, dims: list[int]) -> Value:  # noqa: A002
    """The ``ord``-norm of float ``x`` over ``dims`` (dropped)."""
    e = ctx.emit
    a = e.unary("abs", x)
    if ord == math.inf:
        reduced = e.reduce_simple(a, 0.0, dims, "maximum")
    elif ord == -math.inf:
        reduced = e.reduce_simple(a, math.inf, dims, "minimum")
    elif ord == 0:
        nonzero = e.convert(e.compare(a, ctx.full_like(0, a), "NE"), a.dtype)
        reduced = e.reduce_simple(nonzero, 0, dims, "add")
    elif ord == 1:
        reduced = e.reduce_simple(a, 0, dims, "add")
    elif ord == 2:
        reduced = e.unary("sqrt", e.reduce_simple(e.binary("multiply", a, a), 0, dims, "add"))
    else:
        powered = e.binary("power", a, ctx.full_like(float(ord), a))
        total = e.reduce_simple(powered, 0, dims, "add")
        reduced = e.binary("power", total, ctx.full_like(1.0 / float(ord), total))
    return reduced


@lowering(aten.linalg_vector_norm.default, supports=floats)
def _lower_linalg_vector_norm(
    ctx: LoweringContext,
    x: Value,
    ord: float = 2,  # noqa: A002
    dim=None,
    keepdim: bool = False,
    *,
    dtype: torch.dtype | None = None,
) -> Value:
    """``ord`` = 2 / 1 / inf / -inf / 0 / p, computed in float32 for low-precision inputs."""
    dims = reduce_dims(dim, x.rank)
    reduced = _vector_norm(ctx, ctx.emit.convert(x, ctx.compute_dtype(ctx.out_dtype)), ord, dims)
    return ctx.emit.convert(keep_dims(ctx, reduced, x, dims, keepdim), ctx.out_dtype)


@lowering(aten.dist.default, supports=floats)
def _lower_dist(ctx: LoweringContext, a, b, p: float = 2) -> Value:
    """``vector_norm(a - b, p)`` over every element, after broadcasting and promotion."""
    e = ctx.emit
    a, b = ctx.promote(a, b, dtype=ctx.compute_dtype(ctx.out_dtype))
    diff = e.binary("subtract", a, b)
    return e.convert(_vector_norm(ctx, diff, float(p), list(range(diff.rank))), ctx.out_dtype)


# ---- arg-reductions -------------------------------------------------------------------------
def arg_combiner(
    ctx: LoweringContext, largest: bool, later_on_ties: bool
) -> Callable[[Value, Value, Value, Value], list[Value]]:
    """Combiner of (value, index) pairs for a variadic reduce: the max (``largest``) or min of a
    total order, so XLA may combine in any order. NaN beats every number (torch propagates NaN);
    among equal values (and among NaNs) the smaller index wins, or the larger one when
    ``later_on_ties`` (torch's cummax/cummin, whose trn form uses this)."""
    e = ctx.emit

    def combine(av: Value, ai: Value, bv: Value, bi: Value) -> list[Value]:
        index_wins = e.compare(ai, bi, "GT" if later_on_ties else "LT")
        better = e.compare(av, bv, "GT" if largest else "LT")
        a_wins = e.binary("or", better, e.binary("and", e.compare(av, bv, "EQ"), index_wins))
        if av.dtype.is_floating_point:
            a_nan, b_nan = e.compare(av, av, "NE"), e.compare(bv, bv, "NE")
            numeric = e.binary("and", a_wins, e.unary("not", b_nan))
            a_wins = e.select(
                e.binary("and", a_nan, b_nan), index_wins, e.binary("or", a_nan, numeric)
            )
        return [e.select(a_wins, av, bv), e.select(a_wins, ai, bi)]

    return combine


def arg_reduce(ctx: LoweringContext, x: Value, dim: int, largest: bool) -> tuple[Value, Value]:
    """(values, indices) of the max/min of ``x`` along ``dim``; first index on ties."""
    e = ctx.emit
    inits = [e.scalar(minmax_init(x.dtype, largest), x.dtype), e.scalar(2**31 - 1, INDEX)]
    values, indices = e.reduce(
        [x, e.iota(x.shape, dim, INDEX)], inits, [dim], arg_combiner(ctx, largest, False)
    )
    return values, indices


def _arg_minmax(
    ctx: LoweringContext, x: Value, dim: int | None, keepdim: bool, largest: bool
) -> Value:
    e = ctx.emit
    if dim is None:  # over the flattened tensor
        _, idx = arg_reduce(ctx, e.reshape(x, [math.prod(x.shape)]), 0, largest)
        return e.reshape(idx, ctx.out_shape)
    if x.rank == 0:
        return e.full(0, (), INDEX)
    (d,) = reduce_dims(dim, x.rank)
    _, idx = arg_reduce(ctx, x, d, largest)
    return keep_dims(ctx, idx, x, [d], keepdim)


@lowering(aten.argmax.default, supports=any_dtype)
def _lower_argmax(ctx: LoweringContext, x: Value, dim=None, keepdim: bool = False) -> Value:
    return _arg_minmax(ctx, x, dim, keepdim, largest=True)


@lowering(aten.argmin.default, supports=any_dtype)
def _lower_argmin(ctx: LoweringContext, x: Value, dim=None, keepdim: bool = False) -> Value:
    return _arg_minmax(ctx, x, dim, keepdim, largest=False)


@lowering(aten.max.dim, aten.min.dim, supports=any_dtype)
def _lower_max_min_dim(
    ctx: LoweringContext, x: Value, dim: int, keepdim: bool = False
) -> tuple[Value, Value]:
    if x.rank == 0:  # a 0-d tensor is its own max, at index 0
        return x, ctx.emit.full(0, (), INDEX)
    (d,) = reduce_dims(dim, x.rank)
    values, idx = arg_reduce(ctx, x, d, largest=ctx.node.target is aten.max.dim)
    return keep_dims(ctx, values, x, [d], keepdim), keep_dims(ctx, idx, x, [d], keepdim)
