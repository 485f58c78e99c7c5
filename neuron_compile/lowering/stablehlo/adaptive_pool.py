"""3-D adaptive average and max pooling and their backward ops.

The same constructions as the 2-D rules in ``pooling.py``, over any number of trailing spatial
dims: average pooling contracts each spatial dim with its constant (out, in) averaging matrix
(exact for overlapping, unequal windows; its backward contracts with the transposes), and max
pooling gathers every window into extra axes (padded by repeating a position) and reduces
(value, flat index) pairs with max pooling's tie and NaN rules; its backward scatter-adds at the
saved indices.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.fx as fx

from ..context import LoweringContext
from ..emit import TensorType, Value
from ..registry import lowering
from ..rules import floats, minmax_init
from .pooling import (
    adaptive_matrix,
    float_first_arg,
    max_with_index,
    plane_index,
    scatter_at_indices,
    take_windows,
    window_table,
)

aten = torch.ops.aten


def _contract_each(ctx: LoweringContext, x: Value, mats: Sequence[np.ndarray]) -> Value:
    """Apply (out_d, in_d) matrix ``mats[i]`` along the i-th of the last ``len(mats)`` dims."""
    e = ctx.emit
    n = len(mats)
    for i, m in enumerate(mats):
        d = x.rank - n + i
        a = e.constant(m, TensorType(m.shape, x.dtype))
        y = e.dot_general(x, a, ((d,), (1,)))  # contracted dim moves to the end
        perm = [*range(d), y.rank - 1, *range(d, y.rank - 1)]
        x = e.transpose(y, perm)
    return x


def _avg_matrices(in_sizes: Sequence[int], out_sizes: Sequence[int]) -> list[np.ndarray]:
    return [adaptive_matrix(i, o) for i, o in zip(in_sizes, out_sizes, strict=True)]


@lowering(aten._adaptive_avg_pool3d.default, supports=floats)
def _lower_adaptive_avg_pool3d(ctx: LoweringContext, x: Value, output_size: Sequence[int]) -> Value:
    e = ctx.emit
    out = ctx.out_type()
    xf = e.convert(x, ctx.compute_dtype(x.dtype))
    y = _contract_each(ctx, xf, _avg_matrices(x.shape[-3:], out.shape[-3:]))
    return e.convert(y, out.dtype)


@lowering(aten._adaptive_avg_pool3d_backward.default, supports=floats)
def _lower_adaptive_avg_pool3d_backward(ctx: LoweringContext, grad_out: Value, x: Value) -> Value:
    e = ctx.emit
    g = e.convert(grad_out, ctx.compute_dtype(grad_out.dtype))
    mats = [m.T.copy() for m in _avg_matrices(x.shape[-3:], grad_out.shape[-3:])]
    return e.convert(_contract_each(ctx, g, mats), ctx.out_dtype)


def _nonempty_max_pool(node: fx.Node) -> str | None:
    why = floats(node)
    if why is None and 0 in node.meta["val"][0].shape:
        return "empty input or output is not lowered"
    return why


@lowering(aten.adaptive_max_pool3d.default, supports=_nonempty_max_pool)
def _lower_adaptive_max_pool3d(
    ctx: LoweringContext, x: Value, output_size: Sequence[int]
) -> tuple[Value, Value]:
    e = ctx.emit
    n = 3
    outs, ins = ctx.out_type(0).shape[-n:], x.shape[-n:]
    tables = [window_table(i, o) for i, o in zip(ins, outs, strict=True)]
    r = x.rank
    windows = []
    for v in (x, plane_index(ctx, x, n)):
        # each spatial dim d (shifted by the window axes inserted before it) becomes (out, K)
        for i, table in enumerate(tables):
            v = take_windows(ctx, v, r - n + 2 * i, table)
        windows.append(v)  # (..., O1, K1, O2, K2, O3, K3)
    inits = [e.scalar(minmax_init(x.dtype, True), x.dtype), e.scalar(2**31 - 1, torch.int32)]
    window_axes = [r - n + 2 * i + 1 for i in range(n)]
    values, indices = e.reduce(
        windows, inits, window_axes, lambda av, ai, bv, bi: max_with_index(ctx, av, ai, bv, bi)
    )
    return values, e.convert(indices, ctx.out_type(1).dtype)


@lowering(aten.adaptive_max_pool3d_backward.default, supports=float_first_arg)
def _lower_adaptive_max_pool3d_backward(
    ctx: LoweringContext, grad_out: Value, x: Value, indices: Value
) -> Value:
    return scatter_at_indices(ctx, grad_out, x, indices, 3)
