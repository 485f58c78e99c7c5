"""The trn forms of the ops whose reference lowering is a reduce-window neuronx-cc rejects.

neuronx-cc accepts a ``reduce_window`` only over one operand, without base or window dilation
(NCC_EVRF017/018/019, ``legality_windows.py``). Max pooling with indices breaks that; cummax and
cummin get a form of their own too:

* **max pooling with indices** (``pooling.py``) is one variadic reduce-window over (value, flat
  index) pairs, with ``window_dilations = dilation``. Here every window tap becomes a strided
  slice of the padded input (a dilation is only the tap's offset), the taps are stacked on a new
  trailing axis, and one variadic ``stablehlo.reduce`` (legal) combines them with the reference's
  own combiner ``max_with_index``.
* **cummax / cummin** (``scan.py``) are two one-operand reduce-windows, O(N^2) per row (legal).
  Here they are a Hillis-Steele scan, O(N log N): ``ceil(log2 N)`` rounds, each combining every
  element with the one ``2**k`` before it (the init pair where there is none), by
  ``arg_combiner``.

Both combiners are total orders on (value, index) pairs (NaN and tie rules included), so the
result is the greatest pair of the same window whatever the grouping: bit-identical to the
reference, values and indices alike (the cummax reference selects the same elements). Every
other reduce-window we emit is already legal (one operand, no dilation):
cumsum/cumprod/logcumsumexp, cummax/cummin, average pooling and its backward, divisible adaptive
average pooling, and the internal scans of indexing/random draws.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from ..lowering.context import LoweringContext
from ..lowering.emit import Value
from ..lowering.registry import lowering
from ..lowering.rules import INDEX, any_dtype, floats_and_ints, minmax_init, normalize_dim
from ..lowering.stablehlo.pooling import (
    max_pool_inits,
    max_pool_window,
    max_with_index,
    plane_index,
)
from ..lowering.stablehlo.reduction import arg_combiner
from . import TRN_KEY

aten = torch.ops.aten


def window_taps(
    ctx: LoweringContext,
    x: Value,
    out_shape: Sequence[int],
    kernel: Sequence[int],
    stride: Sequence[int],
    dilation: Sequence[int],
) -> Value:
    """Every window tap of a pooling over ``x``'s trailing ``len(kernel)`` dims as a strided
    slice of shape ``out_shape``, stacked on a new last axis (``prod(kernel)`` taps in row-major
    tap order). ``x`` is already padded; the window at output ``o`` starts at ``o * stride``."""
    e = ctx.emit
    n = len(kernel)
    lead = list(out_shape[:-n])
    taps = []
    for offsets in itertools.product(*(range(k) for k in kernel)):
        start = [0] * len(lead) + [o * d for o, d in zip(offsets, dilation, strict=True)]
        limit = lead + [
            begin + (out - 1) * s + 1
            for begin, out, s in zip(start[-n:], out_shape[-n:], stride, strict=True)
        ]
        tap = e.slice(x, start, limit, [1] * len(lead) + list(stride))
        taps.append(e.reshape(tap, [*out_shape, 1]))
    return e.concatenate(taps, len(out_shape))


@lowering(
    aten.max_pool2d_with_indices.default,
    aten.max_pool3d_with_indices.default,
    key=TRN_KEY,
    supports=floats_and_ints,
)
def _lower_max_pool_with_indices_taps(
    ctx: LoweringContext,
    x: Value,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: Sequence[int] = 0,
    dilation: Sequence[int] = 1,
    ceil_mode: bool = False,
) -> tuple[Value, Value]:
    """Max pooling as a reduce over stacked window taps (no reduce-window, no dilation)."""
    e = ctx.emit
    kernel, stride, dilation, pads = max_pool_window(ctx, x, kernel_size, stride, padding, dilation)
    inits = max_pool_inits(ctx, x.dtype)
    low, high = [lo for lo, _ in pads], [hi for _, hi in pads]
    out_shape = ctx.out_type(0).shape
    stacked = []
    for v, init in zip((x, plane_index(ctx, x, len(kernel))), inits, strict=True):
        # the padding holds the init pair, as the reference's reduce-window padding does
        padded = e.pad(v, init, low, high, [0] * x.rank) if any(low + high) else v
        stacked.append(window_taps(ctx, padded, out_shape, kernel, stride, dilation))
    values, indices = e.reduce(
        stacked, inits, [x.rank], lambda av, ai, bv, bi: max_with_index(ctx, av, ai, bv, bi)
    )
    return values, e.convert(indices, ctx.out_type(1).dtype)


def _shift_in(ctx: LoweringContext, v: Value, dim: int, shift: int, fill: Value) -> Value:
    """``v`` moved ``shift`` places up along ``dim``; the first ``shift`` places hold ``fill``."""
    e = ctx.emit
    limit = list(v.shape)
    limit[dim] -= shift
    kept = e.slice(v, [0] * v.rank, limit, [1] * v.rank)
    low = [0] * v.rank
    low[dim] = shift
    return e.pad(kept, fill, low, [0] * v.rank, [0] * v.rank)


@lowering(aten.cummax.default, aten.cummin.default, key=TRN_KEY, supports=any_dtype)
def _lower_cummax_cummin_doubling(ctx: LoweringContext, x: Value, dim: int) -> tuple[Value, Value]:
    """Running max/min with its index as ``ceil(log2 N)`` shift-and-combine rounds: after round
    ``k`` element ``i`` holds the greatest pair of ``i - 2**(k+1) + 1 .. i``."""
    e = ctx.emit
    if x.rank == 0:
        return x, e.full(0, (), INDEX)
    dim = normalize_dim(dim, x.rank)
    largest = ctx.node.target is aten.cummax.default
    # The init pair loses every comparison: the weakest value with index -1 (ties go later).
    inits = [e.scalar(minmax_init(x.dtype, largest), x.dtype), e.scalar(-1, INDEX)]
    combine = arg_combiner(ctx, largest, True)
    values, indices = x, e.iota(x.shape, dim, INDEX)
    for k in range((x.shape[dim] - 1).bit_length()):  # until 2**k covers the whole dim
        pairs = zip((values, indices), inits, strict=True)
        before = [_shift_in(ctx, v, dim, 2**k, init) for v, init in pairs]
        values, indices = combine(values, indices, *before)
    return values, indices
