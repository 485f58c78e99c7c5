"""Max / average pooling (2-D and 3-D), 2-D adaptive average and max pooling, and their
backward ops.

* max pooling is one variadic ``reduce_window`` over (value, flat index) pairs whose body keeps
  eager PyTorch's choice: the larger value, ties to the smaller ``h * W + w`` index, and NaN wins
  (the last NaN in scan order, as the CPU kernel's ``val > max || isnan(val)`` loop does). Its
  backward scatter-adds grad_output at the saved indices, which is exact w.r.t. those ties.
  neuronx-cc rejects that reduce_window (variadic, window-dilated): the trn form, in
  ``trainium/lowering_windows.py``, reduces stacked window taps with the same combiner.
* average pooling is a ``reduce_window`` sum divided by torch's per-window divisor (a constant
  computed here, so ``ceil_mode`` / ``count_include_pad`` / ``divisor_override`` all agree with
  eager); its backward is the transposed window sum (interior/edge ``pad`` + ``reduce_window``).
* adaptive average pooling is an average pooling when the input divides the output size, and
  otherwise a product with constant averaging matrices along H and W.

Sums accumulate in float32 for low-precision inputs and round once; the division is eager's
true division (``exact_divide``). Max pooling also takes integer inputs; an integer average
(eager: int64 only, summed in int64) runs on the CPU, as int64-as-int32 would wrap its sum.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.fx as fx

from ..context import LoweringContext
from ..emit import TensorType, Value
from ..registry import lowering
from ..rules import FLOATS, exact_divide, floats, floats_and_ints, minmax_init

aten = torch.ops.aten


def pool_dims(value: Sequence[int] | int | None, default: Sequence[int], n: int = 2) -> list[int]:
    """torch's ``_pair`` / ``_triple``: one value for every one of the ``n`` spatial dims."""
    if value is None or (not isinstance(value, int) and len(value) == 0):
        return list(default)
    values = [value] if isinstance(value, int) else list(value)
    return [int(v) for v in values] * n if len(values) == 1 else [int(v) for v in values]


_POOL_3D = {
    aten.max_pool3d_with_indices.default,
    aten.max_pool3d_with_indices_backward.default,
    aten.avg_pool3d.default,
    aten.avg_pool3d_backward.default,
}


def pooled_dims(node: fx.Node) -> int:
    """Number of pooled (trailing) dims: 3 for the ``*3d`` ops, else 2."""
    return 3 if node.target in _POOL_3D else 2


def _window(
    x: Value, kernel: Sequence[int], stride: Sequence[int], dilation: Sequence[int]
) -> tuple[list[int], list[int], list[int]]:
    """Window/stride/dilation over all of ``x``'s dims (leading batch/channel dims get 1)."""
    lead = [1] * (x.rank - len(kernel))
    return lead + list(kernel), lead + list(stride), lead + list(dilation)


def _padding(
    x: Value,
    out_hw: Sequence[int],
    kernel: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
) -> list[tuple[int, int]]:
    """(low, high) padding for every dim so the window count is exactly ``out_hw``.

    The high side covers ceil_mode's extra partial window; it is never negative (an overshoot of
    less than one stride is absorbed by reduce_window's floor).
    """
    n = len(kernel)
    pads = [(0, 0)] * (x.rank - n)
    for size, out, k, s, p, d in zip(
        x.shape[-n:], out_hw, kernel, stride, padding, dilation, strict=True
    ):
        hi = (out - 1) * s + d * (k - 1) + 1 - size - p
        pads.append((p, max(hi, 0)))
    return pads


# ---- max pooling ----------------------------------------------------------------------------
def max_with_index(ctx: LoweringContext, av: Value, ai: Value, bv: Value, bi: Value) -> list[Value]:
    """Combiner of (value, index) pairs: a total order, so reduce_window may combine in any order.

    Order: NaN above everything (among NaNs the larger index), then larger value, then (for equal
    values) the smaller index.
    """
    e = ctx.emit
    a_nan, b_nan = e.compare(av, av, "NE"), e.compare(bv, bv, "NE")
    greater = e.compare(av, bv, "GT")
    tie_first = e.binary("and", e.compare(av, bv, "EQ"), e.compare(ai, bi, "LT"))
    a_wins_numeric = e.binary("or", greater, tie_first)
    a_wins_nan = e.select(b_nan, e.compare(ai, bi, "GT"), e.scalar(True, torch.bool))
    a_wins = e.select(
        a_nan, a_wins_nan, e.select(b_nan, e.scalar(False, torch.bool), a_wins_numeric)
    )
    return [e.select(a_wins, av, bv), e.select(a_wins, ai, bi)]


def plane_index(ctx: LoweringContext, x: Value, n: int = 2) -> Value:
    """Row-major flat index over the last ``n`` dims (``h * W + w`` in 2-D) for every element of
    ``x`` (int32: the 64-bit policy's index type)."""
    e = ctx.emit
    flat = e.iota(x.shape, x.rank - n, torch.int32)
    for d in range(x.rank - n + 1, x.rank):
        scaled = e.binary("multiply", flat, e.full(x.shape[d], x.shape, torch.int32))
        flat = e.binary("add", scaled, e.iota(x.shape, d, torch.int32))
    return flat


def max_pool_window(
    ctx: LoweringContext,
    x: Value,
    kernel_size: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
) -> tuple[list[int], list[int], list[int], list[tuple[int, int]]]:
    """(kernel, stride, dilation) over the pooled dims of ``ctx.node`` (a max pool with indices),
    and the (low, high) padding of every dim of ``x`` that yields exactly its output's windows."""
    n = pooled_dims(ctx.node)
    kernel = pool_dims(kernel_size, (), n)
    stride, padding, dilation = (
        pool_dims(stride, kernel, n),
        pool_dims(padding, [0] * n, n),
        pool_dims(dilation, [1] * n, n),
    )
    pads = _padding(x, ctx.out_type(0).shape[-n:], kernel, stride, padding, dilation)
    return kernel, stride, dilation, pads


def max_pool_inits(ctx: LoweringContext, dtype: torch.dtype) -> list[Value]:
    """Init (and padding) pair of a max pool's (value, index) reduction: the dtype's lowest value
    with an index past every real one, so it never wins."""
    e = ctx.emit
    return [e.scalar(minmax_init(dtype, True), dtype), e.scalar(2**31 - 1, torch.int32)]


@lowering(
    aten.max_pool2d_with_indices.default,
    aten.max_pool3d_with_indices.default,
    supports=floats_and_ints,
)
def _lower_max_pool_with_indices(
    ctx: LoweringContext,
    x: Value,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = 0,
    dilation: Sequence[int] = 1,
    ceil_mode: bool = False,
) -> tuple[Value, Value]:
    e = ctx.emit
    kernel, stride, dilation, pads = max_pool_window(ctx, x, kernel_size, stride, padding, dilation)
    window, strides, dilations = _window(x, kernel, stride, dilation)
    inits = max_pool_inits(ctx, x.dtype)
    values, indices = e.reduce_window(
        [x, plane_index(ctx, x, len(kernel))], inits, window, strides, pads,
        lambda av, ai, bv, bi: max_with_index(ctx, av, ai, bv, bi), window_dilations=dilations,
    )  # fmt: skip
    return values, e.convert(indices, ctx.out_type(1).dtype)


def float_first_arg(node: fx.Node) -> str | None:
    """Like ``floats`` but ignores the int64 ``indices`` operand of the max-pool backward."""
    val = node.args[0].meta.get("val")
    return None if val.dtype in FLOATS else f"dtype {val.dtype} not supported"


@lowering(
    aten.max_pool2d_with_indices_backward.default,
    aten.max_pool3d_with_indices_backward.default,
    supports=float_first_arg,
)
def _lower_max_pool_with_indices_backward(
    ctx: LoweringContext,
    grad_out: Value,
    x: Value,
    kernel_size: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    ceil_mode: bool,
    indices: Value,
) -> Value:
    """Scatter-add grad_output at the forward's indices (offset to a global flat position)."""
    return scatter_at_indices(ctx, grad_out, x, indices, pooled_dims(ctx.node))


def scatter_at_indices(
    ctx: LoweringContext, grad_out: Value, x: Value, indices: Value, n: int
) -> Value:
    """Gradient of a max pool over the last ``n`` dims: each grad_out element added at its
    saved flat index within its (batch, channel) plane."""
    e = ctx.emit
    acc = ctx.compute_dtype(grad_out.dtype)
    plane = math.prod(x.shape[-n:])
    planes = math.prod(x.shape[:-n])
    per_plane = math.prod(grad_out.shape[-n:])
    idx = e.reshape(e.convert(indices, torch.int32), [planes, per_plane])
    base = e.binary(
        "multiply",
        e.iota([planes, per_plane], 0, torch.int32),
        e.full(plane, [planes, per_plane], torch.int32),
    )
    flat_idx = e.reshape(e.binary("add", idx, base), [planes * per_plane, 1])
    updates = e.reshape(e.convert(grad_out, acc), [planes * per_plane])
    zeros = e.full(0, [planes * plane], acc)
    grad = e.scatter(
        zeros, flat_idx, updates, update_window_dims=[], inserted_window_dims=[0],
        scatter_dims_to_operand_dims=[0], index_vector_dim=1, combiner="add",
    )  # fmt: skip
    return e.convert(e.reshape(grad, x.shape), ctx.out_dtype)


# ---- average pooling ------------------------------------------------------------------------
def _divisors(
    in_hw: Sequence[int],
    out_hw: Sequence[int],
    kernel: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    count_include_pad: bool,
    divisor_override: int | None,
) -> np.ndarray:
    """Eager's per-window divisor (aten/src/ATen/native/cpu/AvgPoolKernel.cpp), shape out_hw:
    the outer product of the per-dim window sizes."""
    if divisor_override:
        return np.full(out_hw, float(divisor_override))
    per_dim = []
    for size, out, k, s, p in zip(in_hw, out_hw, kernel, stride, padding, strict=True):
        start = np.arange(out) * s - p
        end = np.minimum(start + k, size + p)
        padded = end - start  # the window clipped to the padded input
        real = np.minimum(end, size) - np.maximum(start, 0)
        per_dim.append(padded if count_include_pad else real)
    return functools.reduce(np.multiply.outer, per_dim).astype(np.float64)


def _divisor_value(
    ctx: LoweringContext, div: np.ndarray, shape: Sequence[int], dtype: torch.dtype
) -> Value:
    """The divisor as a splat when uniform, else an (OH, OW) constant broadcast to ``shape``."""
    e = ctx.emit
    if np.all(div == div.flat[0]):
        return e.full(float(div.flat[0]), shape, dtype)
    const = e.constant(div, TensorType(div.shape, dtype))
    return e.broadcast_in_dim(const, shape, list(range(len(shape) - div.ndim, len(shape))))


# Floats only: eager's integer average (int64 only) sums in int64, which int64-as-int32 would
# wrap although every input and the average fit (3 x 3 values of 10**9).
@lowering(aten.avg_pool2d.default, aten.avg_pool3d.default, supports=floats)
def _lower_avg_pool(
    ctx: LoweringContext,
    x: Value,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> Value:
    e = ctx.emit
    n = pooled_dims(ctx.node)
    kernel = pool_dims(kernel_size, (), n)
    stride, padding = pool_dims(stride, kernel, n), pool_dims(padding, [0] * n, n)
    out = ctx.out_type()
    acc = ctx.compute_dtype(x.dtype)
    window, strides, _ = _window(x, kernel, stride, [1] * n)
    pads = _padding(x, out.shape[-n:], kernel, stride, padding, [1] * n)
    (total,) = e.reduce_window(
        [e.convert(x, acc)], [e.scalar(0, acc)], window, strides, pads,
        lambda a, b: [e.binary("add", a, b)],
    )  # fmt: skip
    div = _divisors(
        x.shape[-n:], out.shape[-n:], kernel, stride, padding, count_include_pad, divisor_override
    )
    mean = exact_divide(ctx, total, _divisor_value(ctx, div, total.shape, acc))
    return e.convert(mean, out.dtype)


def window_sum_transpose(
    ctx: LoweringContext,
    g: Value,
    in_shape: Sequence[int],
    kernel: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
) -> Value:
    """Adjoint of a window sum over the trailing ``len(kernel)`` dims (window ``kernel``,
    ``stride``, low ``padding``): every input element receives the sum of ``g`` over the windows
    that cover it (JAX's ``_reduce_window_sum_transpose_rule``)."""
    e = ctx.emit
    n = len(kernel)
    lead = g.rank - n
    low, high, interior = [0] * lead, [0] * lead, [0] * lead
    for size, out, k, s, p in zip(
        in_shape[-n:], g.shape[-n:], kernel, stride, padding, strict=True
    ):
        lo = k - 1 - p
        low.append(lo)
        high.append(size + k - 1 - ((out - 1) * s + 1) - lo)
        interior.append(s - 1)
    padded = e.pad(g, e.scalar(0, g.dtype), low, high, interior)
    window = [1] * lead + list(kernel)
    (total,) = e.reduce_window(
        [padded], [e.scalar(0, g.dtype)], window, [1] * g.rank, [(0, 0)] * g.rank,
        lambda a, b: [e.binary("add", a, b)],
    )  # fmt: skip
    return total


@lowering(aten.avg_pool2d_backward.default, aten.avg_pool3d_backward.default, supports=floats)
def _lower_avg_pool_backward(
    ctx: LoweringContext,
    grad_out: Value,
    x: Value,
    kernel_size: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    ceil_mode: bool,
    count_include_pad: bool,
    divisor_override: int | None,
) -> Value:
    e = ctx.emit
    n = pooled_dims(ctx.node)
    kernel = pool_dims(kernel_size, (), n)
    stride, padding = pool_dims(stride, kernel, n), pool_dims(padding, [0] * n, n)
    acc = ctx.compute_dtype(grad_out.dtype)
    g = e.convert(grad_out, acc)
    div = _divisors(
        x.shape[-n:], g.shape[-n:], kernel, stride, padding, count_include_pad, divisor_override
    )
    g = e.binary("divide", g, _divisor_value(ctx, div, g.shape, acc))
    grad = window_sum_transpose(ctx, g, x.shape, kernel, stride, padding)
    return e.convert(grad, ctx.out_dtype)


# ---- adaptive average pooling ---------------------------------------------------------------
def adaptive_matrix(size: int, out: int) -> np.ndarray:
    """(out, size) averaging matrix of torch's adaptive windows [floor(i*size/out),
    ceil((i+1)*size/out))."""
    m = np.zeros((out, size))
    for i in range(out):
        start, end = (i * size) // out, -(-((i + 1) * size) // out)
        m[i, start:end] = 1.0 / (end - start)
    return m


def _divisible(in_hw: Sequence[int], out_hw: Sequence[int]) -> bool:
    return all(o > 0 and i % o == 0 for i, o in zip(in_hw, out_hw, strict=True))


def _separable(ctx: LoweringContext, x: Value, mh: np.ndarray, mw: np.ndarray) -> Value:
    """``mh @ x @ mw.T`` over the last two dims of ``x`` (two dot_generals with constants)."""
    e = ctx.emit
    lead = list(range(x.rank - 2))
    ah = e.constant(mh, TensorType(mh.shape, x.dtype))
    aw = e.constant(mw, TensorType(mw.shape, x.dtype))
    # (..., H, W) x (OW, W) -> (..., H, OW); then (OH, H) x (..., H, OW) -> (OH, ..., OW)
    y = e.dot_general(x, aw, ((x.rank - 1,), (1,)))
    y = e.dot_general(ah, y, ((1,), (x.rank - 2,)))
    return e.transpose(y, [*(d + 1 for d in lead), 0, x.rank - 1])


@lowering(aten._adaptive_avg_pool2d.default, supports=floats)
def _lower_adaptive_avg_pool2d(ctx: LoweringContext, x: Value, output_size: Sequence[int]) -> Value:
    e = ctx.emit
    out = ctx.out_type()
    in_hw, out_hw = x.shape[-2:], out.shape[-2:]
    xf = e.convert(x, ctx.compute_dtype(x.dtype))
    if _divisible(in_hw, out_hw):
        kernel = [i // o for i, o in zip(in_hw, out_hw, strict=True)]
        window, strides, _ = _window(x, kernel, kernel, [1, 1])
        (total,) = e.reduce_window(
            [xf], [e.scalar(0, xf.dtype)], window, strides, [(0, 0)] * x.rank,
            lambda a, b: [e.binary("add", a, b)],
        )  # fmt: skip
        y = e.binary("divide", total, ctx.full_like(math.prod(kernel), total))
    else:
        y = _separable(
            ctx, xf, adaptive_matrix(in_hw[0], out_hw[0]), adaptive_matrix(in_hw[1], out_hw[1])
        )
    return e.convert(y, out.dtype)


@lowering(aten._adaptive_avg_pool2d_backward.default, supports=floats)
def _lower_adaptive_avg_pool2d_backward(ctx: LoweringContext, grad_out: Value, x: Value) -> Value:
    e = ctx.emit
    in_hw, out_hw = x.shape[-2:], grad_out.shape[-2:]
    g = e.convert(grad_out, ctx.compute_dtype(grad_out.dtype))
    if _divisible(in_hw, out_hw):
        kh, kw = (i // o for i, o in zip(in_hw, out_hw, strict=True))
        lead = list(x.shape[:-2])
        # Repeat each grad element over its (kh, kw) window, then divide by the window size.
        spread = e.broadcast_in_dim(
            e.reshape(g, [*lead, out_hw[0], 1, out_hw[1], 1]),
            [*lead, out_hw[0], kh, out_hw[1], kw],
            list(range(len(lead) + 4)),
        )
        grad = e.reshape(spread, x.shape)
        grad = e.binary("divide", grad, ctx.full_like(kh * kw, grad))
    else:
        mh, mw = adaptive_matrix(in_hw[0], out_hw[0]), adaptive_matrix(in_hw[1], out_hw[1])
        grad = _separable(ctx, g, mh.T.copy(), mw.T.copy())
    return e.convert(grad, ctx.out_dtype)


# ---- adaptive max pooling -------------------------------------------------------------------
def window_table(size: int, out: int) -> np.ndarray:
    """(out, K) input positions of torch's adaptive windows [floor(i*size/out),
    ceil((i+1)*size/out)); shorter windows repeat their last position (harmless for a max)."""
    starts = [(i * size) // out for i in range(out)]
    ends = [-(-((i + 1) * size) // out) for i in range(out)]
    k = max(end - start for start, end in zip(starts, ends, strict=True))
    return np.array(
        [[min(s + j, e - 1) for j in range(k)] for s, e in zip(starts, ends, strict=True)]
    )


def take_windows(ctx: LoweringContext, x: Value, dim: int, table: np.ndarray) -> Value:
    """Gather ``x`` along ``dim`` with an (out, K) table: ``dim`` becomes the two dims (out, K)."""
    e = ctx.emit
    out, k = table.shape
    idx = e.constant(
        table.reshape(out, k, 1).astype(np.int32), TensorType((out, k, 1), torch.int32)
    )
    slice_sizes = [1 if d == dim else n for d, n in enumerate(x.shape)]
    offset_dims = [d if d < dim else d + 1 for d in range(x.rank) if d != dim]
    shape = [*x.shape[:dim], out, k, *x.shape[dim + 1 :]]
    return e.gather(
        x, idx, offset_dims=offset_dims, collapsed_slice_dims=[dim], start_index_map=[dim],
        index_vector_dim=2, slice_sizes=slice_sizes, out_shape=shape,
    )  # fmt: skip


@lowering(aten.adaptive_max_pool2d.default, supports=floats)
def _lower_adaptive_max_pool2d(
    ctx: LoweringContext, x: Value, output_size: Sequence[int]
) -> tuple[Value, Value]:
    """Gather every (possibly overlapping, unequal) window into two new axes, padded to the
    largest window by repeating a position, then one variadic reduce over (value, flat index)
    with max pooling's tie and NaN rules."""
    e = ctx.emit
    (oh, ow), (h, w) = ctx.out_type(0).shape[-2:], x.shape[-2:]
    th, tw = window_table(h, oh), window_table(w, ow)
    r = x.rank
    windows = []
    for v in (x, plane_index(ctx, x)):
        v = take_windows(ctx, v, r - 2, th)  # (..., OH, KH, W)
        windows.append(take_windows(ctx, v, r, tw))  # (..., OH, KH, OW, KW)
    inits = [e.scalar(minmax_init(x.dtype, True), x.dtype), e.scalar(2**31 - 1, torch.int32)]
    values, indices = e.reduce(
        windows, inits, [r - 1, r + 1], lambda av, ai, bv, bi: max_with_index(ctx, av, ai, bv, bi)
    )
    return values, e.convert(indices, ctx.out_type(1).dtype)


@lowering(aten.adaptive_max_pool2d_backward.default, supports=float_first_arg)
def _lower_adaptive_max_pool2d_backward(
    ctx: LoweringContext, grad_out: Value, x: Value, indices: Value
) -> Value:
    return scatter_at_indices(ctx, grad_out, x, indices, 2)
