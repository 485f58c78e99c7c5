"""Scans (cumulative ops): cumsum, cumprod, cummax/cummin, logcumsumexp.

Each scan is one ``reduce_window`` whose window covers the whole scanned dim, padded by N - 1
init values on the low side: output ``i`` reduces elements ``0..i`` exactly, with no ``while``
loop or associative-scan tree. The cost is O(N^2) per row, which is fine for the sequence
lengths scans see in models (XLA's own CPU/GPU lowering of ``cumsum`` does the same).
Low-precision floats accumulate in float32 and round once, as eager's CPU kernels do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ..context import LoweringContext
from ..emit import Value
from ..registry import lowering
from ..rules import INDEX, any_dtype, floats, minmax_init, normalize_dim
from .reduction import accumulated

aten = torch.ops.aten


def scan(
    ctx: LoweringContext,
    xs: Sequence[Value],
    inits: Sequence[Value],
    dim: int,
    body: Callable[..., Sequence[Value]],
) -> list[Value]:
    """Inclusive scan of ``xs`` along ``dim`` with the associative ``body``."""
    x = xs[0]
    if x.rank == 0:
        return list(xs)
    n = x.shape[dim]
    window = [1] * x.rank
    window[dim] = n
    padding = [(0, 0)] * x.rank
    padding[dim] = (n - 1, 0)
    return ctx.emit.reduce_window(xs, inits, window, [1] * x.rank, padding, body)


def accumulating_scan(
    ctx: LoweringContext,
    x: Value,
    dim: int,
    combiner: str,
    init: int,
    acc: torch.dtype | None = None,
) -> Value:
    """The inclusive ``combiner`` scan (``add``, ``multiply``) of ``x`` along ``dim``, read as the
    result dtype and accumulated in ``acc`` (default: the result's compute dtype)."""
    e = ctx.emit
    out = ctx.out_dtype
    acc = acc or ctx.compute_dtype(out)
    if acc == torch.bool:  # only reachable with an explicit dtype=torch.bool
        acc = torch.int32
    src = accumulated(ctx, x, out, acc)
    (total,) = scan(
        ctx,
        [src],
        [e.scalar(init, acc)],
        normalize_dim(dim, max(x.rank, 1)),
        lambda a, b: [e.binary(combiner, a, b)],
    )
    return e.convert(total, out)


@lowering(aten.cumsum.default, supports=any_dtype)
def _lower_cumsum(ctx: LoweringContext, x: Value, dim: int, **_: object) -> Value:
    return accumulating_scan(ctx, x, dim, "add", 0)


@lowering(aten.cumprod.default, supports=any_dtype)
def _lower_cumprod(ctx: LoweringContext, x: Value, dim: int, **_: object) -> Value:
    return accumulating_scan(ctx, x, dim, "multiply", 1)


def _later_wins(ctx: LoweringContext, a: Value, b: Value, largest: bool) -> Value:
    """Whether the later element ``b`` is the running max/min after ``a``: ties go to the later
    one and NaN beats every number, later NaNs too (torch's cummax/cummin). Associative: the
    rightmost maximum of a total order."""
    e = ctx.emit
    wins = e.compare(b, a, "GE" if largest else "LE")
    if b.dtype.is_floating_point:
        wins = e.binary("or", wins, e.compare(b, b, "NE"))
    return wins


@lowering(aten.cummax.default, aten.cummin.default, supports=any_dtype)
def _lower_cummax_cummin(ctx: LoweringContext, x: Value, dim: int) -> tuple[Value, Value]:
    """Running max/min with its index; on ties (and among NaNs) torch reports the latest index.

    Two single-array scans, not one over (value, index) pairs: XLA CPU aborts the process
    (``std::bad_alloc``) compiling a two-array ``reduce_window`` whose window exceeds 256. The
    index is the latest position where ``x`` equals the running value (any NaN, once it is NaN):
    the running value changes only where an element attains it."""
    e = ctx.emit
    if x.rank == 0:
        return x, e.full(0, (), INDEX)
    dim = normalize_dim(dim, x.rank)
    largest = ctx.node.target is aten.cummax.default
    (values,) = scan(
        ctx,
        [x],
        [e.scalar(minmax_init(x.dtype, largest), x.dtype)],
        dim,
        lambda a, b: [e.select(_later_wins(ctx, a, b, largest), b, a)],
    )
    attained = e.compare(x, values, "EQ")
    if x.dtype.is_floating_point:
        attained = e.binary("or", attained, e.compare(x, x, "NE"))
    marks = e.select(attained, e.iota(x.shape, dim, INDEX), e.full(-1, x.shape, INDEX))
    (indices,) = scan(
        ctx, [marks], [e.scalar(-1, INDEX)], dim, lambda a, b: [e.binary("maximum", a, b)]
    )
    return values, indices


def _logaddexp(ctx: LoweringContext, a: Value, b: Value) -> list[Value]:
    """``log(exp(a) + exp(b))`` without overflow; exact for equal infinities (no inf - inf)."""
    e = ctx.emit
    hi, lo = e.binary("maximum", a, b), e.binary("minimum", a, b)
    delta = e.select(e.compare(a, b, "EQ"), e.scalar(0.0, a.dtype), e.binary("subtract", lo, hi))
    return [e.binary("add", hi, e.unary("log_plus_one", e.unary("exponential", delta)))]


@lowering(aten.logcumsumexp.default, supports=floats)
def _lower_logcumsumexp(ctx: LoweringContext, x: Value, dim: int) -> Value:
    e = ctx.emit
    xf = e.convert(x, ctx.compute_dtype(x.dtype))
    (out,) = scan(
        ctx,
        [xf],
        [e.scalar(float("-inf"), xf.dtype)],
        normalize_dim(dim, max(x.rank, 1)),
        lambda a, b: _logaddexp(ctx, a, b),
    )
    return e.convert(out, ctx.out_dtype)
