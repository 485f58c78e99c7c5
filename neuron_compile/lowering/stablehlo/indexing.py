"""Indexing: embedding, gather/scatter, index/index_put (advanced indexing on leading dims)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.fx as fx

from ..context import LoweringContext, broadcast_shapes
from ..emit import Value
from ..registry import ALL_DTYPES, dtypes_in, lowering
from .reduction import _minmax_init

aten = torch.ops.aten
any_dtype = dtypes_in(*ALL_DTYPES)
INDEX = torch.int32  # int64 indices run as int32 (64-bit policy)


def _wrap_negative(ctx: LoweringContext, idx: Value, size: int) -> Value:
    """torch accepts negative indices counting from the end."""
    e = ctx.emit
    idx = e.convert(idx, INDEX)
    neg = e.compare(idx, ctx.full_like(0, idx), "LT")
    return e.select(neg, e.binary("add", idx, ctx.full_like(size, idx)), idx)


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
    dim = dim + x.rank if dim < 0 else dim
    coords = _full_coordinates(ctx, index, dim, x.shape[dim])
    all_dims = list(range(x.rank))
    return ctx.emit.gather(
        x,
        coords,
        offset_dims=[],
        collapsed_slice_dims=all_dims,
        start_index_map=all_dims,
        index_vector_dim=index.rank,
        slice_sizes=[1] * x.rank,
        out_shape=index.shape,
    )


def _scatter_elements(
    ctx: LoweringContext, x: Value, dim: int, index: Value, src, combiner: str | None
) -> Value:
    e = ctx.emit
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
    return _scatter_elements(ctx, x, dim, index, src, "add")


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
    return _minmax_init(dtype, largest=reduce == "amax")


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
    """Without ``include_self``, every scattered-to position first becomes the reduction's
    identity; ``mean`` divides by the per-position count (floor division for integers), as
    eager's kernel does."""
    e = ctx.emit
    if not include_self:
        x = _scatter_elements(ctx, x, dim, index, _reduce_identity(reduce, x.dtype), None)
    out = _scatter_elements(ctx, x, dim, index, src, _SCATTER_REDUCE[reduce])
    if reduce != "mean":
        return out
    count = ctx.full_like(1 if include_self else 0, out)
    count = _scatter_elements(ctx, count, dim, index, 1, "add")
    count = e.select(
        e.compare(count, ctx.full_like(0, count), "EQ"), ctx.full_like(1, count), count
    )
    if out.dtype.is_floating_point:
        return e.binary("divide", out, count)
    quotient = e.binary("divide", out, count)  # truncates; floor for a negative inexact result
    inexact = e.compare(e.binary("multiply", quotient, count), out, "NE")
    negative = e.compare(out, ctx.full_like(0, out), "LT")
    fix = e.binary("and", inexact, negative)
    return e.select(fix, e.binary("subtract", quotient, ctx.full_like(1, quotient)), quotient)


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


@lowering(aten.index_put.default, aten._unsafe_index_put.default, supports=supports_index_tensors)
def _lower_index_put(
    ctx: LoweringContext,
    x: Value,
    indices: Sequence[Value | None],
    values: Value,
    accumulate: bool = False,
) -> Value:
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
