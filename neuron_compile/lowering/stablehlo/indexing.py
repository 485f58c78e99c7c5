"""Indexing: embedding, gather/scatter/scatter_reduce, index/index_put (advanced indexing),
masked_scatter."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.fx as fx

from ..context import LoweringContext, broadcast_shapes
from ..emit import Value
from ..registry import lowering
from ..rules import INDEX, any_dtype, minmax_init
from .scan import scan

aten = torch.ops.aten


def _wrap_negative(ctx: LoweringContext, idx: Value, size: int) -> Value:
    """torch accepts negative indices counting from the end."""
    e = ctx.emit
    idx = e.convert(idx, INDEX)
    neg = e.compare(idx, ctx.full_like(0, idx), "LT")
    return e.select(neg, e.binary("add", idx, ctx.full_like(size, idx)), idx)


def _as_vector(ctx: LoweringContext, *xs: Value | None) -> list[Value | None]:
    """0-d tensors as 1-element vectors: torch indexes a 0-d tensor along "dim 0" as if it had
    one element (the rules below then reshape their result back)."""
    return [ctx.emit.reshape(x, [1]) if isinstance(x, Value) and x.rank == 0 else x for x in xs]


def _empty_result(ctx: LoweringContext) -> Value | None:
    """A zero-element result needs no data (and a gather from an empty operand is invalid)."""
    out = ctx.out_type()
    return ctx.emit.full(0, out.shape, out.dtype) if math.prod(out.shape) == 0 else None


def _full_coordinates(ctx: LoweringContext, index: Value, dim: int, size: int) -> Value:
    """Coordinates ``index.shape + [rank]`` for torch.gather/scatter along ``dim``: the index
    tensor on ``dim`` and an iota on every other dim."""
    e = ctx.emit
    cols = []
    for d in range(index.rank):
        coord = _wrap_negative(ctx, index, size) if d == dim else e.iota(index.shape, d, INDEX)
        cols.append(e.reshape(coord, [*index.shape, 1]))
    return e.concatenate(cols, index.rank)


@lowering(aten.embedding.default, supports=any_dtype)
def _lower_embedding(
    ctx: LoweringContext,
    weight: Value,
    indices: Value,
    padding_idx: int = -1,
    scale_grad_by_freq: bool = False,
    sparse: bool = False,
) -> Value:
    idx = ctx.emit.convert(indices, INDEX)
    return ctx.emit.gather(
        weight,
        idx,
        offset_dims=[idx.rank],
        collapsed_slice_dims=[0],
        start_index_map=[0],
        index_vector_dim=idx.rank,
        slice_sizes=[1, *weight.shape[1:]],
        out_shape=ctx.out_shape,
    )


@lowering(aten.gather.default, supports=any_dtype)
def _lower_gather(
    ctx: LoweringContext, x: Value, dim: int, index: Value, sparse_grad: bool = False
) -> Value:
    if (empty := _empty_result(ctx)) is not None:
        return empty
    x, index = _as_vector(ctx, x, index)
    dim = dim + x.rank if dim < 0 else dim
    coords = _full_coordinates(ctx, index, dim, x.shape[dim])
    all_dims = list(range(x.rank))
    gathered = ctx.emit.gather(
        x,
        coords,
        offset_dims=[],
        collapsed_slice_dims=all_dims,
        start_index_map=all_dims,
        index_vector_dim=index.rank,
        slice_sizes=[1] * x.rank,
        out_shape=index.shape,
    )
    return ctx.emit.reshape(gathered, ctx.out_shape)


def _scatter_elements(
    ctx: LoweringContext, x: Value, dim: int, index: Value, src, combiner: str | None
) -> Value:
    e = ctx.emit
    if math.prod(index.shape) == 0:
        return x
    if x.rank == 0:  # torch scatters into a 0-d tensor as into a 1-element vector
        vx, vindex, vsrc = _as_vector(ctx, x, index, src)
        return e.reshape(_scatter_elements(ctx, vx, 0, vindex, vsrc, combiner), ())
    dim = dim + x.rank if dim < 0 else dim
    coords = _full_coordinates(ctx, index, dim, x.shape[dim])
    if isinstance(src, Value):
        # src may be larger than index; only its leading index.shape block is scattered.
        updates = e.slice(
            e.convert(src, x.dtype), [0] * src.rank, list(index.shape), [1] * src.rank
        )
    else:
        updates = e.full(src, index.shape, x.dtype)
    all_dims = list(range(x.rank))
    return e.scatter(
        x,
        coords,
        updates,
        update_window_dims=[],
        inserted_window_dims=all_dims,
        scatter_dims_to_operand_dims=all_dims,
        index_vector_dim=index.rank,
        combiner=combiner,
    )


@lowering(aten.scatter.value, aten.scatter.src, supports=any_dtype)
def _lower_scatter(ctx: LoweringContext, x: Value, dim: int, index: Value, src) -> Value:
    return _scatter_elements(ctx, x, dim, index, src, None)


@lowering(aten.scatter_add.default, supports=any_dtype)
def _lower_scatter_add(ctx: LoweringContext, x: Value, dim: int, index: Value, src: Value) -> Value:
    return scatter_reduce(ctx, x, dim, index, src, "sum", include_self=True)


_SCATTER_REDUCE = {
    "sum": "add",
    "mean": "add",
    "prod": "multiply",
    "amax": "maximum",
    "amin": "minimum",
}


def _reduce_identity(reduce: str, dtype: torch.dtype) -> float | int | bool:
    if reduce in ("sum", "mean"):
        return 0
    if reduce == "prod":
        return 1
    return minmax_init(dtype, largest=reduce == "amax")


@lowering(aten.scatter_reduce.two, supports=any_dtype)
def _lower_scatter_reduce(
    ctx: LoweringContext,
    x: Value,
    dim: int,
    index: Value,
    src: Value,
    reduce: str,
    *,
    include_self: bool = True,
) -> Value:
    return scatter_reduce(ctx, x, dim, index, src, reduce, include_self)


def scatter_reduce(
    ctx: LoweringContext,
    x: Value,
    dim: int,
    index: Value,
    src: Value,
    reduce: str,
    include_self: bool,
    opmath: bool = True,
) -> Value:
    """Without ``include_self``, every scattered-to position first becomes the reduction's
    identity; ``mean`` divides by the per-position count (floor division for integers), as
    eager's kernel does. With ``opmath``, bfloat16 and float16 sums and products accumulate in
    float32 and round once, and a mean divides that rounded sum by the exact count rounded once,
    as eager's CPU scatter kernels do (adding in bfloat16 drifted: 200 times 3.0 summed to 712;
    a count added up in bfloat16 stopped at 256); without it they accumulate in their own
    dtype, as eager's ``index_reduce`` does."""
    e = ctx.emit
    dtype = x.dtype
    acc = ctx.compute_dtype(dtype) if opmath else dtype
    x, src = e.convert(x, acc), e.convert(src, acc)
    if not include_self:
        x = _scatter_elements(ctx, x, dim, index, _reduce_identity(reduce, acc), None)
    out = e.convert(_scatter_elements(ctx, x, dim, index, src, _SCATTER_REDUCE[reduce]), dtype)
    if reduce != "mean":
        return out
    count = ctx.full_like(1 if include_self else 0, x)
    count = _scatter_elements(ctx, count, dim, index, 1, "add")
    count = e.select(
        e.compare(count, ctx.full_like(0, count), "EQ"), ctx.full_like(1, count), count
    )
    if out.dtype.is_floating_point:  # the count rounded to ``dtype`` too (bfloat16: 301 -> 300)
        count = e.round_to_precision(count, dtype)
        return e.convert(e.binary("divide", e.convert(out, acc), count), dtype)
    quotient = e.binary("divide", out, count)  # truncates; floor for a negative inexact result
    inexact = e.compare(e.binary("multiply", quotient, count), out, "NE")
    negative = e.compare(out, ctx.full_like(0, out), "LT")
    fix = e.binary("and", inexact, negative)
    return e.select(fix, e.binary("subtract", quotient, ctx.full_like(1, quotient)), quotient)


@lowering(aten.index_reduce.default, supports=any_dtype)
def _lower_index_reduce(
    ctx: LoweringContext,
    x: Value,
    dim: int,
    index: Value,
    source: Value,
    reduce: str,
    *,
    include_self: bool = True,
) -> Value:
    """``x.select(dim, index[i]) <reduce>= source.select(dim, i)``: a scatter_reduce whose
    element-wise index is ``index`` broadcast along ``dim`` over ``source``'s shape."""
    if x.rank == 0:
        vx, vsource = _as_vector(ctx, x, source)
        out = _lower_index_reduce(ctx, vx, 0, index, vsource, reduce, include_self=include_self)
        return ctx.emit.reshape(out, ())
    dim = dim + x.rank if dim < 0 else dim
    index = ctx.emit.reshape(ctx.emit.convert(index, INDEX), [math.prod(index.shape)])
    full = ctx.emit.broadcast_in_dim(index, source.shape, [dim])
    return scatter_reduce(ctx, x, dim, full, source, reduce, include_self, opmath=False)


@lowering(aten.put.default, supports=any_dtype)
def _lower_put(
    ctx: LoweringContext, x: Value, index: Value, source: Value, accumulate: bool = False
) -> Value:
    """Writes (or adds) ``source`` at flat positions of ``x`` (negative positions count from
    the end)."""
    e = ctx.emit
    n, k = math.prod(x.shape), math.prod(index.shape)
    flat_idx = e.reshape(_wrap_negative(ctx, index, n), [k, 1])
    updates = e.reshape(e.convert(source, x.dtype), [k])
    out = e.scatter(
        e.reshape(x, [n]), flat_idx, updates, update_window_dims=[], inserted_window_dims=[0],
        scatter_dims_to_operand_dims=[0], index_vector_dim=1,
        combiner="add" if accumulate else None,
    )  # fmt: skip
    return e.reshape(out, x.shape)


def supports_index_tensors(node: fx.Node) -> str | None:
    """index / index_put: integer index tensors in any positions (boolean masks are rejected:
    their result shape depends on the data)."""
    for idx in node.args[1]:
        if isinstance(idx, fx.Node) and idx.meta["val"].dtype == torch.bool:
            return "boolean-mask indexing has a data-dependent shape"
    return None


def _advanced_index(
    ctx: LoweringContext, x: Value, indices: Sequence[Value | None]
) -> tuple[Value, list[int], list[int]]:
    """torch advanced indexing as gather/scatter dimension numbers.

    Returns the stacked coordinates (``broadcast shape + [k]``), the indexed operand dims, and the
    result positions of the operand's remaining (sliced) dims. As in NumPy, the broadcast index
    dims replace the indexed dims in place when those are adjacent, and go first otherwise.
    """
    e = ctx.emit
    indexed = [d for d, t in enumerate(indices) if t is not None]
    tensors = [indices[d] for d in indexed]
    shape = broadcast_shapes(*[t.shape for t in tensors])
    cols = []
    for d, t in zip(indexed, tensors, strict=True):
        t = ctx.broadcast_to(_wrap_negative(ctx, t, x.shape[d]), shape)
        cols.append(e.reshape(t, [*shape, 1]))
    coords = e.concatenate(cols, len(shape))
    adjacent = indexed == list(range(indexed[0], indexed[-1] + 1))
    first = indexed[0] if adjacent else 0
    rest = [d for d in range(x.rank) if d not in indexed]
    offset_dims = [i if i < first else i + len(shape) for i in range(len(rest))]
    return coords, indexed, offset_dims


@lowering(aten.index.Tensor, supports=supports_index_tensors)
def _lower_index(ctx: LoweringContext, x: Value, indices: Sequence[Value | None]) -> Value:
    if (empty := _empty_result(ctx)) is not None:
        return empty
    coords, indexed, offset_dims = _advanced_index(ctx, x, indices)
    return ctx.emit.gather(
        x,
        coords,
        offset_dims=offset_dims,
        collapsed_slice_dims=indexed,
        start_index_map=indexed,
        index_vector_dim=coords.rank - 1,
        slice_sizes=[1 if d in indexed else n for d, n in enumerate(x.shape)],
        out_shape=ctx.out_shape,
    )


def supports_index_put(node: fx.Node) -> str | None:
    """index_put: integer index tensors anywhere, or one boolean mask (``x[mask] = v``: the
    result keeps x's shape, so the mask is fine here even though ``x[mask]`` is dynamic)."""
    tensors = [i for i in node.args[1] if isinstance(i, fx.Node)]
    masks = [i for i in tensors if i.meta["val"].dtype == torch.bool]
    if masks and (len(tensors) > 1 or masks[0].meta["val"].dim() == 0):
        return "a boolean mask combined with other index tensors (or a 0-d mask) is not supported"
    return None


@lowering(aten.index_put.default, aten._unsafe_index_put.default, supports=supports_index_put)
def _lower_index_put(
    ctx: LoweringContext,
    x: Value,
    indices: Sequence[Value | None],
    values: Value,
    accumulate: bool = False,
) -> Value:
    if any(isinstance(i, Value) and i.dtype == torch.bool for i in indices):
        return _masked_put(ctx, x, indices, values, accumulate)
    coords, indexed, offset_dims = _advanced_index(ctx, x, indices)
    # The updates have the shape x[indices] would have; values broadcast to it.
    batch = list(coords.shape[:-1])
    rest = [n for d, n in enumerate(x.shape) if d not in indexed]
    shape, rest_iter, batch_iter = [], iter(rest), iter(batch)
    for i in range(len(batch) + len(rest)):
        shape.append(next(rest_iter) if i in offset_dims else next(batch_iter))
    (values,) = ctx.promote(values, dtype=x.dtype)
    return ctx.emit.scatter(
        x,
        coords,
        ctx.broadcast_to(values, shape),
        update_window_dims=offset_dims,
        inserted_window_dims=indexed,
        scatter_dims_to_operand_dims=indexed,
        index_vector_dim=coords.rank - 1,
        combiner="add" if accumulate else None,
    )


@lowering(aten.index_select.default, supports=any_dtype)
def _lower_index_select(ctx: LoweringContext, x: Value, dim: int, index: Value) -> Value:
    if (empty := _empty_result(ctx)) is not None:
        return empty
    if x.rank == 0:
        (vx,) = _as_vector(ctx, x)
        return ctx.emit.reshape(_lower_index_select(ctx, vx, 0, index), ctx.out_shape)
    dim = dim + x.rank if dim < 0 else dim
    idx = ctx.emit.reshape(
        _wrap_negative(ctx, index, x.shape[dim]), [index.shape[0] if index.rank else 1, 1]
    )
    slice_sizes = list(x.shape)
    slice_sizes[dim] = 1
    offset_dims = [d for d in range(x.rank) if d != dim]
    gathered = ctx.emit.gather(
        x,
        idx,
        offset_dims=list(range(1, x.rank)),
        collapsed_slice_dims=[dim],
        start_index_map=[dim],
        index_vector_dim=1,
        slice_sizes=slice_sizes,
        out_shape=[idx.shape[0]] + [x.shape[d] for d in offset_dims],
    )
    # gather puts the batch dim first; move it back to `dim`.
    perm = list(range(1, dim + 1)) + [0] + list(range(dim + 1, x.rank))
    return ctx.emit.reshape(ctx.emit.transpose(gathered, perm), ctx.out_shape)


# ---- masked_scatter: static shapes via a running count of the mask ---------------------------
def _mask_slots(ctx: LoweringContext, mask: Value, shape: Sequence[int]) -> tuple[Value, Value]:
    """Flattened mask broadcast to ``shape``, and for each position the number of true mask
    elements before it: the source element a true position takes (row-major order)."""
    e = ctx.emit
    flat = e.reshape(ctx.broadcast_to(e.convert(mask, torch.bool), shape), [math.prod(shape)])
    ones = e.convert(flat, INDEX)
    (inclusive,) = scan(ctx, [ones], [e.scalar(0, INDEX)], 0, lambda a, b: [e.binary("add", a, b)])
    return flat, e.binary("subtract", inclusive, ones)


def _clamped(ctx: LoweringContext, idx: Value, size: int) -> Value:
    e = ctx.emit
    return e.clamp(e.scalar(0, INDEX), idx, e.scalar(max(size - 1, 0), INDEX))


@lowering(aten.masked_scatter.default, supports=any_dtype)
def _lower_masked_scatter(ctx: LoweringContext, x: Value, mask: Value, source: Value) -> Value:
    e = ctx.emit
    out = ctx.out_type()
    flat_mask, slot = _mask_slots(ctx, mask, out.shape)
    n = math.prod(source.shape)
    src = e.reshape(e.convert(source, out.dtype), [n])
    taken = e.gather(
        src, e.reshape(_clamped(ctx, slot, n), [*slot.shape, 1]), offset_dims=[],
        collapsed_slice_dims=[0], start_index_map=[0], index_vector_dim=1, slice_sizes=[1],
        out_shape=slot.shape,
    )  # fmt: skip
    base = e.reshape(ctx.broadcast_to(e.convert(x, out.dtype), out.shape), slot.shape)
    return e.reshape(e.select(flat_mask, taken, base), out.shape)


@lowering(aten.masked_scatter_backward.default, supports=any_dtype)
def _lower_masked_scatter_backward(
    ctx: LoweringContext, grad: Value, mask: Value, sizes: Sequence[int]
) -> Value:
    """The source gradient: true positions' gradients packed in order, zeros after them."""
    e = ctx.emit
    flat_mask, slot = _mask_slots(ctx, mask, grad.shape)
    n = math.prod(sizes)
    g = e.reshape(grad, slot.shape)
    # Masked-off positions add 0 at a clamped (valid) slot rather than relying on out-of-bounds
    # scatter behaviour, which StableHLO leaves to the implementation.
    updates = e.select(flat_mask, g, ctx.full_like(0, g))
    packed = e.scatter(
        e.full(0, [n], grad.dtype), e.reshape(_clamped(ctx, slot, n), [*slot.shape, 1]), updates,
        update_window_dims=[], inserted_window_dims=[0], scatter_dims_to_operand_dims=[0],
        index_vector_dim=1, combiner="add",
    )  # fmt: skip
    return e.reshape(packed, ctx.out_shape)


def _masked_put(
    ctx: LoweringContext,
    x: Value,
    indices: Sequence[Value | None],
    values: Value,
    accumulate: bool,
) -> Value:
    """``x[mask] = values`` for one boolean mask covering dims ``d .. d + mask.rank``. ``values``
    is laid out as ``x[mask]`` would be (lead dims, one entry per true position, trailing dims):
    a single entry broadcasts to every true position (a select); otherwise true positions take
    their entries in row-major order, found with a running count of the mask."""
    e = ctx.emit
    d = next(i for i, t in enumerate(indices) if t is not None)
    mask = indices[d]
    k = mask.rank
    lead, rest = list(x.shape[:d]), list(x.shape[d + k :])
    pick = e.broadcast_in_dim(e.convert(mask, torch.bool), x.shape, list(range(d, d + k)))
    (v,) = ctx.promote(values, dtype=x.dtype)
    rank = len(lead) + 1 + len(rest)
    aligned = [1] * max(rank - v.rank, 0) + list(v.shape)[max(v.rank - rank, 0) :]
    v = e.reshape(v, aligned)
    count = v.shape[d]
    if count == 1:
        v = e.reshape(ctx.broadcast_to(v, [*lead, 1, *rest]), [*lead, *[1] * k, *rest])
        taken = ctx.broadcast_to(v, x.shape)
    else:
        v = ctx.broadcast_to(v, [*lead, count, *rest])
        _, slot = _mask_slots(ctx, mask, mask.shape)
        m = math.prod(mask.shape)
        taken = e.gather(
            v, e.reshape(_clamped(ctx, slot, count), [m, 1]),
            offset_dims=[i for i in range(v.rank) if i != d], collapsed_slice_dims=[d],
            start_index_map=[d], index_vector_dim=1,
            slice_sizes=[1 if i == d else n for i, n in enumerate(v.shape)],
            out_shape=[*lead, m, *rest],
        )  # fmt: skip
        taken = e.reshape(taken, x.shape)
    if not accumulate:
        return e.select(pick, taken, x)
    added = e.select(pick, taken, ctx.full_like(0, x))
    return e.binary("or" if x.dtype == torch.bool else "add", x, added)


@lowering(aten.nonzero_static.default, supports=any_dtype)
def _lower_nonzero_static(
    ctx: LoweringContext, x: Value, *, size: int, fill_value: int = -1
) -> Value:
    """(size, ndim) coordinates of the first ``size`` non-zero elements in row-major order, rows
    past the last one filled with ``fill_value``: a static-shape scatter of every element's
    coordinates to its rank among the non-zeros (elements that are zero, or ranked past
    ``size``, are sent out of bounds, which scatter drops)."""
    e = ctx.emit
    out = ctx.out_type()
    n = math.prod(x.shape)
    if 0 in out.shape or n == 0:  # (size, 0) for a 0-d input: nothing to compute
        return e.full(fill_value, out.shape, out.dtype)
    flat = e.reshape(e.compare(x, ctx.full_like(0, x), "NE"), [n])
    hits = e.convert(flat, INDEX)
    (rank,) = scan(ctx, [hits], [e.scalar(0, INDEX)], 0, lambda a, b: [e.binary("add", a, b)])
    rank = e.binary("subtract", rank, e.full(1, [n], INDEX))  # 0-based among the non-zeros
    target = e.select(flat, rank, e.full(size, [n], INDEX))
    coords = [e.reshape(e.iota(x.shape, d, INDEX), [n, 1]) for d in range(x.rank)]
    updates = e.convert(e.concatenate(coords, 1), out.dtype)
    base = e.full(fill_value, out.shape, out.dtype)
    return e.scatter(
        base, e.reshape(target, [n, 1]), updates, update_window_dims=[1],
        inserted_window_dims=[0], scatter_dims_to_operand_dims=[0], index_vector_dim=1,
        combiner=None,
    )  # fmt: skip
