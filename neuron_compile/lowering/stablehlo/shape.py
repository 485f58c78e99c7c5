"""Shape ops: views, permutes, broadcasting, slicing, concatenation, and tensor factories.

Views become value-semantics reshapes/transposes/slices: AOTAutograd has functionalized the
graph, so aliasing is already resolved outside the compiled region.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.fx as fx

from ..context import LoweringContext, Scalar
from ..emit import TensorType, Value
from ..registry import lowering
from ..rules import any_dtype, floats, normalize_dim

aten = torch.ops.aten


@lowering(
    aten.view.default,
    aten._unsafe_view.default,
    aten.reshape.default,
    aten.view_copy.default,
    supports=any_dtype,
)
def _lower_view(ctx: LoweringContext, x: Value, shape: Sequence[int]) -> Value:
    return ctx.emit.reshape(x, ctx.out_shape)


@lowering(
    aten.alias.default,
    aten.clone.default,
    aten.detach.default,
    aten.lift_fresh_copy.default,
    supports=any_dtype,
)
def _lower_identity(ctx: LoweringContext, x: Value, **_: object) -> Value:
    return x


@lowering(aten.permute.default, aten.permute_copy.default, supports=any_dtype)
def _lower_permute(ctx: LoweringContext, x: Value, dims: Sequence[int]) -> Value:
    return ctx.emit.transpose(x, [normalize_dim(d, x.rank) for d in dims])


@lowering(aten.t.default, supports=any_dtype)
def _lower_t(ctx: LoweringContext, x: Value) -> Value:
    return ctx.emit.transpose(x, list(range(x.rank))[::-1])


@lowering(aten.transpose.int, supports=any_dtype)
def _lower_transpose(ctx: LoweringContext, x: Value, d0: int, d1: int) -> Value:
    perm = list(range(x.rank))
    d0, d1 = normalize_dim(d0, x.rank), normalize_dim(d1, x.rank)
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return ctx.emit.transpose(x, perm)


@lowering(aten.expand.default, supports=any_dtype)
def _lower_expand(
    ctx: LoweringContext, x: Value, size: Sequence[int], implicit: bool = False
) -> Value:
    return ctx.broadcast_to(x, ctx.out_shape)


@lowering(
    aten.unsqueeze.default,
    aten.squeeze.dims,
    aten.squeeze.dim,
    aten.squeeze.default,
    supports=any_dtype,
)
def _lower_squeeze_unsqueeze(ctx: LoweringContext, x: Value, *_: object) -> Value:
    return ctx.emit.reshape(x, ctx.out_shape)


@lowering(aten.slice.Tensor, supports=any_dtype)
def _lower_slice(
    ctx: LoweringContext,
    x: Value,
    dim: int = 0,
    start: int | None = None,
    end: int | None = None,
    step: int = 1,
) -> Value:
    dim = normalize_dim(dim, x.rank)
    size = x.shape[dim]
    begin, stop, _ = slice(start, end, step).indices(size)
    stop = max(stop, begin)
    starts = [0] * x.rank
    limits = list(x.shape)
    strides = [1] * x.rank
    starts[dim], limits[dim], strides[dim] = begin, stop, step
    return ctx.emit.slice(x, starts, limits, strides)


@lowering(aten.narrow_copy.default, supports=any_dtype)
def _lower_narrow_copy(ctx: LoweringContext, x: Value, dim: int, start: int, length: int) -> Value:
    dim = normalize_dim(dim, x.rank)
    start = start + x.shape[dim] if start < 0 else start
    return _lower_slice(ctx, x, dim, start, start + length)


def _contiguous_input(node: fx.Node) -> str | None:
    """as_strided addresses storage: only when the input's values are its whole storage
    (contiguous, offset 0, storage no larger) do they tell the lowering what it reads. The pass
    ``passes.rebase_strided_views`` rewrites in-graph views to read such a flat storage; what
    is left (a view the caller passed in) runs eagerly on the caller's own tensor."""
    val = node.args[0].meta.get("val")
    if (
        not isinstance(val, torch.Tensor)
        or not val.is_contiguous()
        or val.storage_offset() != 0
        or val.untyped_storage().nbytes() != val.numel() * val.element_size()
    ):
        return "as_strided of a view whose storage extends beyond its elements (a caller's view)"
    return any_dtype(node)


@lowering(aten.as_strided.default, aten.as_strided_copy.default, supports=_contiguous_input)
def _lower_as_strided(
    ctx: LoweringContext,
    x: Value,
    size: Sequence[int],
    stride: Sequence[int],
    storage_offset: int | None = None,
) -> Value:
    """A gather from the flattened input with a constant table of storage positions."""
    e = ctx.emit
    n = math.prod(x.shape)
    if math.prod(size) == 0:  # reads nothing (and a gather from an empty storage is invalid)
        return e.full(0, ctx.out_shape, ctx.out_dtype)
    idx = _storage_positions(ctx, size, stride, storage_offset)
    return e.gather(
        e.reshape(x, [n]), idx, offset_dims=[], collapsed_slice_dims=[0], start_index_map=[0],
        index_vector_dim=len(size), slice_sizes=[1], out_shape=ctx.out_shape,
    )  # fmt: skip


def _storage_positions(
    ctx: LoweringContext, size: Sequence[int], stride: Sequence[int], offset: int | None
) -> Value:
    """(*size, 1) int32 constant: the storage position of every element of the strided view."""
    positions = np.full(tuple(size), offset or 0, dtype=np.int64)
    for d, (sz, st) in enumerate(zip(size, stride, strict=True)):
        shape = [1] * len(size)
        shape[d] = sz
        positions = positions + (np.arange(sz) * st).reshape(shape)
    table = positions.astype(np.int32).reshape(*size, 1)
    return ctx.emit.constant(table, TensorType(tuple(table.shape), torch.int32))


@lowering(aten.as_strided_scatter.default, supports=_contiguous_input)
def _lower_as_strided_scatter(
    ctx: LoweringContext,
    x: Value,
    src: Value,
    size: Sequence[int],
    stride: Sequence[int],
    storage_offset: int | None = None,
) -> Value:
    """``x`` with the strided view's storage positions overwritten by ``src`` (a scatter into the
    flattened input; positions a self-overlapping view repeats get one of their writes)."""
    e = ctx.emit
    n = math.prod(x.shape)
    if math.prod(size) == 0:  # writes nothing
        return x
    idx = _storage_positions(ctx, size, stride, storage_offset)
    flat = e.scatter(
        e.reshape(x, [n]), idx, e.convert(src, x.dtype), update_window_dims=[],
        inserted_window_dims=[0], scatter_dims_to_operand_dims=[0],
        index_vector_dim=len(size), combiner=None,
    )  # fmt: skip
    return e.reshape(flat, x.shape)


@lowering(aten.select.int, supports=any_dtype)
def _lower_select(ctx: LoweringContext, x: Value, dim: int, index: int) -> Value:
    dim = normalize_dim(dim, x.rank)
    index = index + x.shape[dim] if index < 0 else index
    starts = [0] * x.rank
    limits = list(x.shape)
    starts[dim], limits[dim] = index, index + 1
    part = ctx.emit.slice(x, starts, limits, [1] * x.rank)
    return ctx.emit.reshape(part, ctx.out_shape)


def _split(ctx: LoweringContext, x: Value, sizes: Sequence[int], dim: int) -> list[Value]:
    dim = normalize_dim(dim, x.rank)
    outs, offset = [], 0
    for size in sizes:
        starts = [0] * x.rank
        limits = list(x.shape)
        starts[dim], limits[dim] = offset, offset + size
        outs.append(ctx.emit.slice(x, starts, limits, [1] * x.rank))
        offset += size
    return outs


@lowering(aten.split_with_sizes.default, supports=any_dtype)
def _lower_split_with_sizes(
    ctx: LoweringContext, x: Value, sizes: Sequence[int], dim: int = 0
) -> list[Value]:
    return _split(ctx, x, sizes, dim)


@lowering(aten.split.Tensor, supports=any_dtype)
def _lower_split(ctx: LoweringContext, x: Value, size: int, dim: int = 0) -> list[Value]:
    total = x.shape[normalize_dim(dim, x.rank)]
    sizes = [min(size, total - i) for i in range(0, total, size)] or [0]
    return _split(ctx, x, sizes, dim)


@lowering(aten.unbind_copy.int, aten.unbind.int, supports=any_dtype)
def _lower_unbind(ctx: LoweringContext, x: Value, dim: int = 0) -> list[Value]:
    dim = normalize_dim(dim, x.rank)
    shape = [d for i, d in enumerate(x.shape) if i != dim]
    return [ctx.emit.reshape(p, shape) for p in _split(ctx, x, [1] * x.shape[dim], dim)]


@lowering(aten.cat.default, supports=any_dtype)
def _lower_cat(ctx: LoweringContext, xs: Sequence[Value], dim: int = 0) -> Value:
    out = ctx.out_type()
    # torch.cat skips legacy empty 1-D tensors and promotes dtypes.
    parts = [ctx.emit.convert(x, out.dtype) for x in xs if not (x.rank == 1 and x.shape[0] == 0)]
    return ctx.emit.concatenate(parts, normalize_dim(dim, out.rank))


@lowering(aten.constant_pad_nd.default, supports=any_dtype)
def _lower_constant_pad_nd(
    ctx: LoweringContext, x: Value, pad: Sequence[int], value: float = 0
) -> Value:
    low, high = [0] * x.rank, [0] * x.rank
    for i in range(len(pad) // 2):  # pad lists the last dim first
        low[x.rank - 1 - i], high[x.rank - 1 - i] = pad[2 * i], pad[2 * i + 1]
    # Negative padding crops: pad with the non-negative part, then slice.
    padded = ctx.emit.pad(
        x,
        ctx.emit.scalar(value, x.dtype),
        [max(p, 0) for p in low],
        [max(p, 0) for p in high],
        [0] * x.rank,
    )
    if all(p >= 0 for p in low + high):
        return padded
    starts = [max(-p, 0) for p in low]
    limits = [d - max(-p, 0) for d, p in zip(padded.shape, high, strict=True)]
    return ctx.emit.slice(padded, starts, limits, [1] * x.rank)


# ---- factories ------------------------------------------------------------------------------
@lowering(
    aten.full.default,
    aten.full_like.default,
    aten.zeros_like.default,
    aten.ones_like.default,
    aten.empty.memory_format,
    aten.empty_like.default,
    aten.empty_permuted.default,
    aten.empty_strided.default,
    aten.new_empty_strided.default,
    aten._efficientzerotensor.default,
    aten.zeros.default,
    aten.ones.default,
    aten.new_zeros.default,
    aten.new_ones.default,
    aten.new_full.default,
    aten.new_empty.default,
    supports=any_dtype,
)
def _lower_full(ctx: LoweringContext, *args: object, **_: object) -> Value:
    target = ctx.node.target
    if target in (aten.full.default, aten.full_like.default):
        value = args[1]
    elif target is aten.new_full.default:
        value = args[2]
    elif target in (aten.ones_like.default, aten.ones.default, aten.new_ones.default):
        value = 1
    else:
        value = 0  # zeros and empty (uninitialized memory may be anything; zeros is deterministic)
    return ctx.emit.full(value, ctx.out_shape, ctx.out_dtype)


@lowering(aten.fill.Scalar, supports=any_dtype)
def _lower_fill(ctx: LoweringContext, x: Value, value: float) -> Value:
    return ctx.emit.full(value, ctx.out_shape, ctx.out_dtype)


@lowering(aten.arange.start_step, aten.arange.start, aten.arange.default, supports=any_dtype)
def _lower_arange(ctx: LoweringContext, *args: object, **kwargs: object) -> Value:
    start, step = 0, 1
    if ctx.node.target in (aten.arange.start_step, aten.arange.start):
        start = args[0]
    if ctx.node.target is aten.arange.start_step:
        # step is optional (default 1): arange(0, n) traces as start_step(0, n).
        step = args[2] if len(args) > 2 else kwargs.get("step", 1)
    out = ctx.out_type()
    e = ctx.emit
    compute = (
        torch.float32
        if out.dtype.is_floating_point or isinstance(step, float) or isinstance(start, float)
        else out.dtype
    )
    idx = e.iota(out.shape, 0, compute)
    if step != 1:
        idx = e.binary("multiply", idx, e.full(step, out.shape, compute))
    if start != 0:
        idx = e.binary("add", idx, e.full(start, out.shape, compute))
    return e.convert(idx, out.dtype)


@lowering(aten.copy.default, supports=any_dtype)
def _lower_copy(
    ctx: LoweringContext, dst: Value, src: Value | Scalar, non_blocking: bool = False
) -> Value:
    if not isinstance(src, Value):  # x.copy_(2.5): eager converts the number as a tensor would
        return ctx.emit.full(
            torch.tensor(src).to(ctx.out_dtype).item(), ctx.out_shape, ctx.out_dtype
        )
    return ctx.broadcast_to(ctx.emit.convert(src, ctx.out_dtype), ctx.out_shape)


@lowering(aten.tril_indices.default, aten.triu_indices.default, supports=any_dtype)
def _lower_tril_triu_indices(
    ctx: LoweringContext, row: int, col: int, offset: int = 0, **_: object
) -> Value:
    """A compile-time constant (2, N) index table."""
    make = np.tril_indices if ctx.node.target is aten.tril_indices.default else np.triu_indices
    table = np.stack(make(row, offset, col)).astype(np.int64)
    return ctx.emit.constant(table, ctx.out_type())


# ---- reordering and tiling ------------------------------------------------------------------
@lowering(aten.flip.default, supports=any_dtype)
def _lower_flip(ctx: LoweringContext, x: Value, dims: Sequence[int]) -> Value:
    if x.rank == 0:  # eager takes dim 0 or -1 of a 0-d tensor as its one element: nothing moves
        return x
    dims = sorted({normalize_dim(d, x.rank) for d in dims})
    return ctx.emit.reverse(x, dims) if dims else x


@lowering(aten.repeat.default, supports=any_dtype)
def _lower_repeat(ctx: LoweringContext, x: Value, repeats: Sequence[int]) -> Value:
    """Broadcast to interleaved ``(r0, s0, r1, s1, ...)`` and merge each pair."""
    lead = len(repeats) - x.rank
    sizes = [1] * lead + list(x.shape)
    interleaved = [n for r, s in zip(repeats, sizes, strict=True) for n in (r, s)]
    dims = [2 * (lead + i) + 1 for i in range(x.rank)]
    tiled = ctx.emit.broadcast_in_dim(x, interleaved, dims)
    return ctx.emit.reshape(tiled, ctx.out_shape)


@lowering(aten.unfold.default, supports=any_dtype)
def _lower_unfold(ctx: LoweringContext, x: Value, dimension: int, size: int, step: int) -> Value:
    """Sliding windows along ``dimension``: one gather with a constant ``(n, size)`` index table;
    the window index replaces ``dimension`` and the in-window offset becomes the last dim."""
    e = ctx.emit
    if x.rank == 0:
        return e.reshape(x, ctx.out_shape)
    dim = normalize_dim(dimension, x.rank)
    n = (x.shape[dim] - size) // step + 1
    table = (np.arange(n)[:, None] * step + np.arange(size)[None, :]).reshape(n, size, 1)
    idx = e.constant(table.astype(np.int32), TensorType((n, size, 1), torch.int32))
    slice_sizes = list(x.shape)
    slice_sizes[dim] = 1
    return e.gather(
        x,
        idx,
        offset_dims=[d for d in range(x.rank) if d != dim],
        collapsed_slice_dims=[dim],
        start_index_map=[dim],
        index_vector_dim=2,
        slice_sizes=slice_sizes,
        out_shape=ctx.out_shape,
    )


# ---- scatters into views (functionalized in-place writes) -----------------------------------
def _place(
    ctx: LoweringContext, x: Value, src: Value, dim: int, start: int, step: int, count: int
) -> Value:
    """``x`` with positions ``start, start + step, ...`` (``count`` of them) along ``dim`` taken
    from ``src``: ``src`` is spread out with interior padding and chosen by a constant mask."""
    e = ctx.emit
    if count == 0:
        return x
    low = [0] * x.rank
    high = [0] * x.rank
    interior = [0] * x.rank
    low[dim], interior[dim] = start, step - 1
    high[dim] = x.shape[dim] - (start + (count - 1) * step + 1)
    spread = e.pad(e.convert(src, x.dtype), e.scalar(0, x.dtype), low, high, interior)
    mask = np.zeros(x.shape[dim], dtype=bool)
    mask[start : start + (count - 1) * step + 1 : step] = True
    pick = e.broadcast_in_dim(
        e.constant(mask, TensorType((x.shape[dim],), torch.bool)), x.shape, [dim]
    )
    return e.select(pick, spread, x)


@lowering(aten.slice_scatter.default, supports=any_dtype)
def _lower_slice_scatter(
    ctx: LoweringContext,
    x: Value,
    src: Value,
    dim: int = 0,
    start: int | None = None,
    end: int | None = None,
    step: int = 1,
) -> Value:
    dim = normalize_dim(dim, x.rank)
    begin, stop, _ = slice(start, end, step).indices(x.shape[dim])
    count = len(range(begin, stop, step))
    return _place(ctx, x, src, dim, begin, step, count)


@lowering(aten.select_scatter.default, supports=any_dtype)
def _lower_select_scatter(
    ctx: LoweringContext, x: Value, src: Value, dim: int, index: int
) -> Value:
    dim = normalize_dim(dim, x.rank)
    index = index + x.shape[dim] if index < 0 else index
    shape = list(x.shape)
    shape[dim] = 1
    return _place(ctx, x, ctx.emit.reshape(src, shape), dim, index, 1, 1)


def _diagonal_layout(
    x: Value, offset: int, dim1: int, dim2: int
) -> tuple[list[int], int, int, int]:
    """Permutation moving (dim1, dim2) last, then (start, stride, length) of the diagonal in the
    flattened trailing ``d1 * d2`` block: element (i, i + offset) sits at ``start + i * (d2 + 1)``."""
    d1, d2 = normalize_dim(dim1, x.rank), normalize_dim(dim2, x.rank)
    perm = [d for d in range(x.rank) if d not in (d1, d2)] + [d1, d2]
    n1, n2 = x.shape[d1], x.shape[d2]
    if offset >= 0:
        length, start = max(0, min(n1, n2 - offset)), offset
    else:
        length, start = max(0, min(n1 + offset, n2)), -offset * n2
    return perm, start, n2 + 1, length


@lowering(aten.diagonal.default, aten.diagonal_copy.default, supports=any_dtype)
def _lower_diagonal(
    ctx: LoweringContext, x: Value, offset: int = 0, dim1: int = 0, dim2: int = 1
) -> Value:
    e = ctx.emit
    perm, start, stride, length = _diagonal_layout(x, offset, dim1, dim2)
    moved = e.transpose(x, perm)
    lead = list(moved.shape[:-2])
    flat = e.reshape(moved, [*lead, moved.shape[-2] * moved.shape[-1]])
    stop = start + (length - 1) * stride + 1 if length else start
    starts, limits, strides = [0] * len(lead), list(lead), [1] * len(lead)
    return e.slice(flat, [*starts, start], [*limits, stop], [*strides, stride])


@lowering(aten.diagonal_scatter.default, supports=any_dtype)
def _lower_diagonal_scatter(
    ctx: LoweringContext, x: Value, src: Value, offset: int = 0, dim1: int = 0, dim2: int = 1
) -> Value:
    e = ctx.emit
    perm, start, stride, length = _diagonal_layout(x, offset, dim1, dim2)
    moved = e.transpose(x, perm)
    lead = list(moved.shape[:-2])
    flat = e.reshape(moved, [*lead, moved.shape[-2] * moved.shape[-1]])
    flat = _place(ctx, flat, src, len(lead), start, stride, length)
    inverse = [perm.index(d) for d in range(x.rank)]
    return e.transpose(e.reshape(flat, moved.shape), inverse)


@lowering(
    aten.replication_pad1d_backward.default,
    aten.replication_pad2d_backward.default,
    aten.replication_pad3d_backward.default,
    supports=floats,
)
def _lower_replication_pad_backward(
    ctx: LoweringContext, grad_out: Value, x: Value, padding: Sequence[int]
) -> Value:
    """Per padded dim: output j came from input clamp(j - lo, 0, n - 1). So the interior of
    grad_out lands on its input positions (zeros where negative padding cropped the input), and
    the summed low (high) pad band is added onto the first (last) element."""
    e = ctx.emit
    g = e.convert(grad_out, ctx.compute_dtype(grad_out.dtype))
    for i in range(len(padding) // 2):  # padding lists the last dim first
        dim = g.rank - 1 - i
        lo, hi, n = padding[2 * i], padding[2 * i + 1], x.shape[dim]
        bands = []
        if lo > 0:
            bands.append((_sum_band(ctx, g, dim, 0, lo), 0))
        if hi > 0:
            bands.append((_sum_band(ctx, g, dim, lo + n, lo + n + hi), n - 1))
        g = _band(ctx, g, dim, max(lo, 0), min(lo + n, g.shape[dim]))
        if lo < 0 or hi < 0:  # cropped input positions get no gradient
            low, high = [0] * g.rank, [0] * g.rank
            low[dim], high[dim] = max(-lo, 0), max(-hi, 0)
            g = e.pad(g, e.scalar(0, g.dtype), low, high, [0] * g.rank)
        for total, at in bands:
            low, high = [0] * g.rank, [0] * g.rank
            low[dim], high[dim] = at, n - 1 - at
            g = e.binary("add", g, e.pad(total, e.scalar(0, g.dtype), low, high, [0] * g.rank))
    return e.convert(g, ctx.out_dtype)


def _band(ctx: LoweringContext, x: Value, dim: int, start: int, stop: int) -> Value:
    starts, limits = [0] * x.rank, list(x.shape)
    starts[dim], limits[dim] = start, stop
    return ctx.emit.slice(x, starts, limits, [1] * x.rank)


def _sum_band(ctx: LoweringContext, x: Value, dim: int, start: int, stop: int) -> Value:
    """Sum of ``x[start:stop]`` along ``dim``, kept as a size-1 dim."""
    band = _band(ctx, x, dim, start, stop)
    total = ctx.emit.reduce_simple(band, 0, [dim], "add")
    return ctx.emit.reshape(total, [1 if d == dim else n for d, n in enumerate(x.shape)])
