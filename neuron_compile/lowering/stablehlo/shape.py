"""Shape ops: views, permutes, broadcasting, slicing, concatenation, and tensor factories.

Views become value-semantics reshapes/transposes/slices: AOTAutograd has functionalized the
graph, so aliasing is already resolved outside the compiled region.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..context import LoweringContext
from ..emit import Value
from ..registry import ALL_DTYPES, dtypes_in, lowering

aten = torch.ops.aten
any_dtype = dtypes_in(*ALL_DTYPES)


def _dim(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


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


@lowering(aten.permute.default, supports=any_dtype)
def _lower_permute(ctx: LoweringContext, x: Value, dims: Sequence[int]) -> Value:
    return ctx.emit.transpose(x, [_dim(d, x.rank) for d in dims])


@lowering(aten.t.default, supports=any_dtype)
def _lower_t(ctx: LoweringContext, x: Value) -> Value:
    return ctx.emit.transpose(x, list(range(x.rank))[::-1])


@lowering(aten.transpose.int, supports=any_dtype)
def _lower_transpose(ctx: LoweringContext, x: Value, d0: int, d1: int) -> Value:
    perm = list(range(x.rank))
    d0, d1 = _dim(d0, x.rank), _dim(d1, x.rank)
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
    dim = _dim(dim, x.rank)
    size = x.shape[dim]
    begin, stop, _ = slice(start, end, step).indices(size)
    stop = max(stop, begin)
    starts = [0] * x.rank
    limits = list(x.shape)
    strides = [1] * x.rank
    starts[dim], limits[dim], strides[dim] = begin, stop, step
    return ctx.emit.slice(x, starts, limits, strides)


@lowering(aten.select.int, supports=any_dtype)
def _lower_select(ctx: LoweringContext, x: Value, dim: int, index: int) -> Value:
    dim = _dim(dim, x.rank)
    index = index + x.shape[dim] if index < 0 else index
    starts = [0] * x.rank
    limits = list(x.shape)
    starts[dim], limits[dim] = index, index + 1
    part = ctx.emit.slice(x, starts, limits, [1] * x.rank)
    return ctx.emit.reshape(part, ctx.out_shape)


def _split(ctx: LoweringContext, x: Value, sizes: Sequence[int], dim: int) -> list[Value]:
    dim = _dim(dim, x.rank)
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
    total = x.shape[_dim(dim, x.rank)]
    sizes = [min(size, total - i) for i in range(0, total, size)] or [0]
    return _split(ctx, x, sizes, dim)


@lowering(aten.cat.default, supports=any_dtype)
def _lower_cat(ctx: LoweringContext, xs: Sequence[Value], dim: int = 0) -> Value:
    out = ctx.out_type()
    # torch.cat skips legacy empty 1-D tensors and promotes dtypes.
    parts = [ctx.emit.convert(x, out.dtype) for x in xs if not (x.rank == 1 and x.shape[0] == 0)]
    return ctx.emit.concatenate(parts, _dim(dim, out.rank))


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
def _lower_copy(ctx: LoweringContext, dst: Value, src: Value, non_blocking: bool = False) -> Value:
    return ctx.broadcast_to(ctx.emit.convert(src, ctx.out_dtype), ctx.out_shape)
