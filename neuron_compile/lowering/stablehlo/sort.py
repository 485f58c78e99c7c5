"""Sorting: sort (stable or not), topk, kthvalue.

One ``stablehlo.sort`` over (values, iota) pairs. The comparator orders like eager PyTorch: NaN
sorts above every number (last ascending, first descending) and ties keep their input order
(the sort is always stable, which is one of the orders torch's unstable sort may return).
``topk`` and ``kthvalue`` are a sort plus a slice.
"""

from __future__ import annotations

import torch

from ..context import LoweringContext
from ..emit import Value
from ..registry import ALL_DTYPES, dtypes_in, lowering
from .reduction import INDEX

aten = torch.ops.aten
any_dtype = dtypes_in(*ALL_DTYPES)


def _dim(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def sort_with_indices(
    ctx: LoweringContext, x: Value, dim: int, descending: bool
) -> tuple[Value, Value]:
    """Stable sort of ``x`` along ``dim``: (sorted values, their int32 source indices)."""
    e = ctx.emit

    def before(a: Value, b: Value, ai: Value, bi: Value) -> list[Value]:
        del ai, bi  # stability breaks ties; the indices just ride along
        if descending:
            a, b = b, a
        lt = e.compare(a, b, "LT")
        if not a.dtype.is_floating_point:
            return [lt]
        # NaN is the largest value: a < NaN for every non-NaN a.
        nan_above = e.binary("and", e.compare(b, b, "NE"), e.compare(a, a, "EQ"))
        return [e.binary("or", lt, nan_above)]

    values, indices = e.sort([x, e.iota(x.shape, dim, INDEX)], dim, before, is_stable=True)
    return values, indices


def _sort(ctx: LoweringContext, x: Value, dim: int, descending: bool) -> tuple[Value, Value]:
    if x.rank == 0:
        return x, ctx.emit.full(0, (), INDEX)
    return sort_with_indices(ctx, x, _dim(dim, x.rank), descending)


@lowering(aten.sort.default, supports=any_dtype)
def _lower_sort(
    ctx: LoweringContext, x: Value, dim: int = -1, descending: bool = False
) -> tuple[Value, Value]:
    return _sort(ctx, x, dim, descending)


@lowering(aten.sort.stable, supports=any_dtype)
def _lower_sort_stable(
    ctx: LoweringContext,
    x: Value,
    *,
    stable: bool | None = None,
    dim: int = -1,
    descending: bool = False,
) -> tuple[Value, Value]:
    return _sort(ctx, x, dim, descending)


def _take(ctx: LoweringContext, x: Value, dim: int, start: int, stop: int) -> Value:
    starts, limits = [0] * x.rank, list(x.shape)
    starts[dim], limits[dim] = start, stop
    return ctx.emit.slice(x, starts, limits, [1] * x.rank)


@lowering(aten.topk.default, supports=any_dtype)
def _lower_topk(
    ctx: LoweringContext,
    x: Value,
    k: int,
    dim: int = -1,
    largest: bool = True,
    sorted: bool = True,  # noqa: A002
) -> tuple[Value, Value]:
    if x.rank == 0:
        return x, ctx.emit.full(0, (), INDEX)
    dim = _dim(dim, x.rank)
    values, indices = sort_with_indices(ctx, x, dim, descending=largest)
    return _take(ctx, values, dim, 0, k), _take(ctx, indices, dim, 0, k)


@lowering(aten.kthvalue.default, supports=any_dtype)
def _lower_kthvalue(
    ctx: LoweringContext, x: Value, k: int, dim: int = -1, keepdim: bool = False
) -> tuple[Value, Value]:
    e = ctx.emit
    if x.rank == 0:
        return x, e.full(0, (), INDEX)
    dim = _dim(dim, x.rank)
    values, indices = sort_with_indices(ctx, x, dim, descending=False)
    shape = ctx.out_type(0).shape
    return (
        e.reshape(_take(ctx, values, dim, k - 1, k), shape),
        e.reshape(_take(ctx, indices, dim, k - 1, k), shape),
    )
