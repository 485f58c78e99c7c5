"""Indexing: embedding, gather/scatter, index/index_put (advanced indexing on leading dims)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.fx as fx

from ..context import LoweringContext, broadcast_shapes
from ..emit import Value
from ..registry import ALL_DTYPES, dtypes_in, lowering

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


def supports_leading_indices(node: fx.Node) -> str | None:
    """index / index_put: index tensors must cover a leading run of dims (``x[i]``, ``x[i, j]``)."""
    indices = node.args[1]
    seen_none = False
    for idx in indices:
        if idx is None:
            seen_none = True
        elif seen_none:
            return "index tensors after a skipped (None / ':') dim are not supported yet"
        elif isinstance(idx, fx.Node) and idx.meta["val"].dtype == torch.bool:
            return "boolean-mask indexing has a data-dependent shape"
    return None


def _stacked_indices(
    ctx: LoweringContext, x: Value, indices: Sequence[Value | None]
) -> tuple[Value, int]:
    """Broadcast the leading index tensors together and stack them on a trailing dim."""
    tensors = [i for i in indices if i is not None]
    shape = broadcast_shapes(*[t.shape for t in tensors])
    cols = []
    for d, t in enumerate(tensors):
        t = ctx.broadcast_to(_wrap_negative(ctx, t, x.shape[d]), shape)
        cols.append(ctx.emit.reshape(t, [*shape, 1]))
    return ctx.emit.concatenate(cols, len(shape)), len(tensors)


@lowering(aten.index.Tensor, supports=supports_leading_indices)
def _lower_index(ctx: LoweringContext, x: Value, indices: Sequence[Value | None]) -> Value:
    coords, k = _stacked_indices(ctx, x, indices)
    batch = coords.rank - 1
    return ctx.emit.gather(
        x,
        coords,
        offset_dims=list(range(batch, batch + x.rank - k)),
        collapsed_slice_dims=list(range(k)),
        start_index_map=list(range(k)),
        index_vector_dim=batch,
        slice_sizes=[1] * k + list(x.shape[k:]),
        out_shape=ctx.out_shape,
    )


@lowering(aten.index_put.default, aten._unsafe_index_put.default, supports=supports_leading_indices)
def _lower_index_put(
    ctx: LoweringContext,
    x: Value,
    indices: Sequence[Value | None],
    values: Value,
    accumulate: bool = False,
) -> Value:
    coords, k = _stacked_indices(ctx, x, indices)
    batch = coords.rank - 1
    (values,) = ctx.promote(values, dtype=x.dtype)
    updates = ctx.broadcast_to(values, [*coords.shape[:-1], *x.shape[k:]])
    return ctx.emit.scatter(
        x,
        coords,
        updates,
        update_window_dims=list(range(batch, batch + x.rank - k)),
        inserted_window_dims=list(range(k)),
        scatter_dims_to_operand_dims=list(range(k)),
        index_vector_dim=batch,
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
