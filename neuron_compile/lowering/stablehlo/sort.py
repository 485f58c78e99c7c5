"""Sorting and order statistics: sort (stable or not), topk, kthvalue, median, mode, bucketize.

One ``stablehlo.sort`` over (values, iota) pairs. The comparator orders like eager PyTorch: NaN
sorts above every number (last ascending, first descending) and ties keep their input order
(the sort is always stable, which is one of the orders torch's unstable sort may return).
``topk`` and ``kthvalue`` are a sort plus a slice, ``median`` a sort plus a per-row gather;
``bucketize``/``searchsorted`` are eager's binary search, unrolled.
"""

from __future__ import annotations

import math

import torch
import torch.fx as fx

from ..context import LoweringContext
from ..emit import Value
from ..registry import lowering
from ..rules import INDEX, any_dtype, minmax_init, normalize_dim

aten = torch.ops.aten


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
    return sort_with_indices(ctx, x, normalize_dim(dim, x.rank), descending)


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
    dim = normalize_dim(dim, x.rank)
    values, indices = sort_with_indices(ctx, x, dim, descending=largest)
    return _take(ctx, values, dim, 0, k), _take(ctx, indices, dim, 0, k)


@lowering(aten.kthvalue.default, supports=any_dtype)
def _lower_kthvalue(
    ctx: LoweringContext, x: Value, k: int, dim: int = -1, keepdim: bool = False
) -> tuple[Value, Value]:
    e = ctx.emit
    if x.rank == 0:
        return x, e.full(0, (), INDEX)
    dim = normalize_dim(dim, x.rank)
    values, indices = sort_with_indices(ctx, x, dim, descending=False)
    shape = ctx.out_type(0).shape
    return (
        e.reshape(_take(ctx, values, dim, k - 1, k), shape),
        e.reshape(_take(ctx, indices, dim, k - 1, k), shape),
    )


# ---- medians: a sort plus a per-row position ------------------------------------------------
def _median(ctx: LoweringContext, x: Value, dim: int, ignore_nan: bool) -> tuple[Value, Value]:
    """(value, index) of the lower median along ``dim`` with ``dim`` removed. NaNs sort last, so
    ``median`` picks the first NaN (position n - #NaN) when a row has one; ``nanmedian`` takes
    the lower median of the non-NaN prefix."""
    e = ctx.emit
    n = x.shape[dim]
    values, indices = sort_with_indices(ctx, x, dim, descending=False)
    reduced_shape = [d for i, d in enumerate(x.shape) if i != dim]
    if x.dtype.is_floating_point:
        isnan = e.convert(e.compare(x, x, "NE"), INDEX)
        nans = e.reduce_simple(isnan, 0, [dim], "add")
    else:
        nans = e.full(0, reduced_shape, INDEX)
    valid = e.binary("subtract", e.full(n, reduced_shape, INDEX), nans)
    if ignore_nan:  # all-NaN rows: position 0 (a NaN)
        half = e.binary(
            "divide", e.binary("subtract", valid, ctx.full_like(1, valid)), ctx.full_like(2, valid)
        )
        position = e.binary("maximum", half, ctx.full_like(0, half))
    else:
        has_nan = e.compare(nans, ctx.full_like(0, nans), "GT")
        position = e.select(has_nan, valid, e.full((n - 1) // 2, reduced_shape, INDEX))
    return _take_positions(ctx, values, dim, position), _take_positions(ctx, indices, dim, position)


def _take_positions(ctx: LoweringContext, x: Value, dim: int, position: Value) -> Value:
    """``x`` at one position per row along ``dim`` (``position`` has ``dim`` removed)."""
    e = ctx.emit
    rest = [d for d in range(x.rank) if d != dim]
    cols = []
    for d in range(x.rank):
        coord = position if d == dim else e.iota(position.shape, rest.index(d), INDEX)
        cols.append(e.reshape(coord, [*position.shape, 1]))
    coords = e.concatenate(cols, position.rank)
    all_dims = list(range(x.rank))
    return e.gather(
        x, coords, offset_dims=[], collapsed_slice_dims=all_dims, start_index_map=all_dims,
        index_vector_dim=position.rank, slice_sizes=[1] * x.rank, out_shape=position.shape,
    )  # fmt: skip


@lowering(aten.median.dim, aten.nanmedian.dim, supports=any_dtype)
def _lower_median_dim(
    ctx: LoweringContext, x: Value, dim: int, keepdim: bool = False
) -> tuple[Value, Value]:
    e = ctx.emit
    if x.rank == 0:
        return x, e.full(0, (), INDEX)
    dim = normalize_dim(dim, x.rank)
    values, indices = _median(ctx, x, dim, ctx.node.target is aten.nanmedian.dim)
    shape = ctx.out_type(0).shape
    return e.reshape(values, shape), e.reshape(indices, shape)


@lowering(aten.median.default, aten.nanmedian.default, supports=any_dtype)
def _lower_median(ctx: LoweringContext, x: Value) -> Value:
    e = ctx.emit
    flat = e.reshape(x, [math.prod(x.shape)])
    values, _ = _median(ctx, flat, 0, ctx.node.target is aten.nanmedian.default)
    return e.reshape(values, ())


# ---- bucketize / searchsorted: eager's binary search, step for step --------------------------
def _binary_search(ctx: LoweringContext, seq: Value, x: Value, right: bool) -> Value:
    """Per element of ``x``, eager's lower bound in ``seq``'s last dim (upper bound when
    ``right``; ``native/cpu/Bucketization.cpp``), step for step: ``k.bit_length()`` halvings of
    ``[lo, hi)``, going right where ``!(seq[mid] >= x)`` (``>`` when ``right``). The same index
    as eager's for any boundaries, NaN or unsorted ones included; a count of the boundaries
    below each value is eager's only for sorted boundaries without NaN. ``seq`` is 1-D or has
    ``x``'s leading dims."""
    e = ctx.emit
    common = torch.promote_types(seq.dtype, x.dtype)
    seq, x = e.convert(seq, common), e.convert(x, common)
    k = seq.shape[-1]
    lo, hi = e.full(0, x.shape, INDEX), e.full(k, x.shape, INDEX)
    one, last = e.full(1, x.shape, INDEX), e.full(max(k - 1, 0), x.shape, INDEX)
    lead = [e.reshape(e.iota(x.shape, d, INDEX), [*x.shape, 1]) for d in range(seq.rank - 1)]
    for _ in range(k.bit_length()):
        active = e.compare(lo, hi, "LT")
        mid = e.binary(
            "add", lo, e.binary("shift_right_logical", e.binary("subtract", hi, lo), one)
        )
        at = e.reshape(e.binary("minimum", mid, last), [*x.shape, 1])
        probe = e.gather(
            seq,
            e.concatenate([*lead, at], x.rank) if lead else at,
            offset_dims=[],
            collapsed_slice_dims=list(range(seq.rank)),
            start_index_map=list(range(seq.rank)),
            index_vector_dim=x.rank,
            slice_sizes=[1] * seq.rank,
            out_shape=x.shape,
        )
        go_right = e.unary("not", e.compare(probe, x, "GT" if right else "GE"))
        lo = e.select(e.binary("and", active, go_right), e.binary("add", mid, one), lo)
        hi = e.select(e.binary("and", active, e.unary("not", go_right)), mid, hi)
    return lo


def _no_sorter(node: fx.Node) -> str | None:
    if node.kwargs.get("sorter") is not None:
        return "searchsorted with a sorter permutation is not supported"
    return any_dtype(node)


@lowering(aten.bucketize.Tensor, supports=any_dtype)
def _lower_bucketize(
    ctx: LoweringContext,
    x: Value,
    boundaries: Value,
    *,
    out_int32: bool = False,
    right: bool = False,
) -> Value:
    return ctx.emit.convert(_binary_search(ctx, boundaries, x, right), ctx.out_dtype)


@lowering(aten.searchsorted.Tensor, supports=_no_sorter)
def _lower_searchsorted(
    ctx: LoweringContext,
    seq: Value,
    x: Value,
    *,
    out_int32: bool = False,
    right: bool = False,
    side: str | None = None,
    sorter: Value | None = None,
) -> Value:
    right = right or side == "right"
    return ctx.emit.convert(_binary_search(ctx, seq, x, right), ctx.out_dtype)


_MODE_MAX_LEN = 2048  # mode compares every pair along dim: n^2 work and memory per slice


def _mode_support(node: fx.Node) -> str | None:
    why = any_dtype(node)
    if why:
        return why
    x = node.args[0].meta["val"]
    if x.ndim == 0:
        return None
    if x.dtype.is_floating_point:
        # Eager counts runs in a sort whose comparator leaves NaN unordered: where NaNs are, its
        # answer depends on that sort's element order ([1, nan, 1, nan, 0] gives 0).
        return (
            "mode of floating-point values runs eagerly (eager's answer with NaN follows its sort)"
        )
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", -1)
    n = x.shape[normalize_dim(dim, x.ndim)]
    if n == 0 or n > _MODE_MAX_LEN:
        return f"mode along a dim of size {n} is not lowered (1 .. {_MODE_MAX_LEN})"
    return None


@lowering(aten.mode.default, supports=_mode_support)
def _lower_mode(
    ctx: LoweringContext, x: Value, dim: int = -1, keepdim: bool = False
) -> tuple[Value, Value]:
    """The most frequent integer or bool along ``dim`` (the smallest among equally frequent ones,
    as eager's sorted scan picks) and an index holding it (the last; eager promises none in
    particular). Frequencies come from comparing every pair of elements along ``dim``."""
    e = ctx.emit
    out_idx = ctx.out_type(1).dtype
    if x.rank == 0:
        return x, e.full(0, (), out_idx)
    d = normalize_dim(dim, x.rank)
    perm = [i for i in range(x.rank) if i != d] + [d]
    xt = e.transpose(x, perm)  # (..., n)
    r = xt.rank
    n = xt.shape[-1]
    pair_shape = (*xt.shape, n)
    lead = list(range(r - 1))
    xi = e.broadcast_in_dim(xt, pair_shape, [*lead, r - 1])
    xj = e.broadcast_in_dim(xt, pair_shape, [*lead, r])
    count = e.reduce_simple(e.convert(e.compare(xi, xj, "EQ"), INDEX), 0, [r], "add")  # (..., n)
    best = e.reduce_simple(count, 0, [r - 1], "maximum")
    cand = e.compare(count, e.broadcast_in_dim(best, count.shape, lead), "EQ")
    top = minmax_init(xt.dtype, largest=False)  # non-candidates never win the minimum
    value = e.reduce_simple(e.select(cand, xt, ctx.full_like(top, xt)), top, [r - 1], "minimum")
    pos = e.iota(xt.shape, r - 1, INDEX)
    holds = e.compare(xt, e.broadcast_in_dim(value, xt.shape, lead), "EQ")
    index = e.reduce_simple(
        e.select(holds, pos, e.full(-1, xt.shape, INDEX)), -1, [r - 1], "maximum"
    )
    index = e.convert(index, out_idx)
    if keepdim:
        shape = list(x.shape)
        shape[d] = 1
        value, index = e.reshape(value, shape), e.reshape(index, shape)
    return value, index
