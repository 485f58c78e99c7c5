"""Histograms: ``histc``, ``histogram`` (bin count or bin edges), and ``histogramdd``'s pieces
``_histogramdd_bin_edges`` / ``_histogramdd_from_bin_cts`` / ``_histogramdd_from_bin_tensors``.

Bin counts are static ints, so every shape is static; the data only decides which bin each
element lands in, and that is reproduced with eager's own float arithmetic
(``aten/src/ATen/native/Histogram.cpp`` and ``cpu/HistogramKernel.cpp``):

- Outer edges: ``histc`` takes ``[min, max]``, or the data's extrema (computed in-graph) when
  ``min == max``, widened by 1 when still equal; ``histogram`` takes ``range`` or the per-column
  extrema, widened by 0.5. Edges are ``torch.linspace`` of those in the input dtype; static
  ranges embed eager's own ``linspace`` as constants, in-graph ones replay its kernel, which
  computes ``start + step * i`` (first half) and ``end - step * (steps - 1 - i)`` as fused
  multiply-adds: emulated exactly in float32 (error-free products and round-to-odd sums).
- Bin index: ``histc`` truncates ``(x - left) * bins / (right - left)``, each operation rounded
  to the input dtype (c10's bf16/f16 operators round every step, subnormals kept; a quotient
  that overflows lands in bin 0, where eager's cast and index arithmetic put it on x86-64); ``histogram`` with a bin count
  corrects that guess by ``std::upper_bound`` over the edges ``[pos - 1, pos + 2)``, and with
  bin edges runs ``std::upper_bound`` over all of them; both searches replay libstdc++'s binary
  search step by step, so they agree with eager even on ties. Elements outside the outer edges
  (and NaN) are skipped; the last bin includes its right edge.
- Counts (or weights) are scatter-added in float32 and, for ``density``, divided by their total
  and then by each dimension's bin widths, in eager's order. Counts are exact; sums of float
  weights (and the density's total) may differ from eager's in the last bits, as any float32
  reduction in another order does.

Cases where eager's result depends on its thread layout or on low-precision accumulation are
left to eager: bf16/f16 ``histc`` with so many bins that the rounded index can pass ``bins``
(eager then writes into another thread's histogram) or so many elements that a count no longer
fits the dtype exactly; ``histc`` ranges eager rejects (min > max) or that collapse in the dtype.
``histogram``/``histogramdd`` lower for float32 only (eager rejects bf16/f16 without a range, and
its low-precision accumulation with one is not reproduced). Where eager raises (non-finite
data extrema), the lowered graph cannot raise, so its result there is meaningless.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from ..context import LoweringContext
from ..emit import TensorType, Value
from ..registry import lowering
from ..rules import FLOATS, INDEX, Ops, arg, exact_divide, float32_only

aten = torch.ops.aten
_F32 = torch.float32
#: float32 ``histc`` bin counts whose rounded index provably stays <= ``bins``: the rounded
#: quotient is at most bins * (1 + 2^-24)^2, which stays below bins + 1.
_F32_MAX_BINS = 1 << 20
#: Largest element count whose counts stay exact in the accumulation dtype (an integer count
#: above 2^(p+1) no longer rounds the same as eager's one-by-one increments).
_HISTC_MAX_NUMEL = {torch.float32: 1 << 24, torch.bfloat16: 256, torch.float16: 2048}


# ---- support predicates ----------------------------------------------------------------------
def _histc_support(node: fx.Node) -> str | None:
    x = node.args[0].meta.get("val")
    dtype = x.dtype if isinstance(x, torch.Tensor) else None
    if dtype == torch.float64:
        dtype = torch.float32
    if dtype not in FLOATS:
        return f"dtype {dtype} not supported"
    bins = int(arg(node, 1, "bins", 100))
    if not _histc_index_in_range(bins, dtype):
        return f"{dtype} histc with {bins} bins: eager's rounded bin index can exceed the range"
    if x.numel() > _HISTC_MAX_NUMEL[dtype]:
        return f"{dtype} histc of {x.numel()} elements: eager's {dtype} counts stop being exact"
    lo, hi = (float(arg(node, i, name, 0)) for i, name in ((2, "min"), (3, "max")))
    if lo > hi:
        return "histc with min > max (eager raises)"
    if lo != hi and _round_to(lo, dtype) == _round_to(hi, dtype):
        return f"histc range [{lo}, {hi}] is empty in {dtype} (eager divides by zero)"
    return None


@functools.cache
def _histc_index_in_range(bins: int, dtype: torch.dtype) -> bool:
    """Whether eager's rounded bin index of the largest element, ``r(r(d * bins) / d)`` with
    ``d = r(max - min)``, stays below ``bins + 1`` for every ``d``. The ratio depends only on
    ``d``'s significand, so for bf16/f16 every significand is tried; beyond, eager's index
    passes ``bins`` and it writes into another thread's histogram (not reproduced)."""
    if dtype == torch.float32:
        return bins <= _F32_MAX_BINS
    mantissa_bits = {torch.bfloat16: 7, torch.float16: 10}[dtype]
    with unset_fake_temporarily():
        sig = torch.arange(2**mantissa_bits, dtype=torch.float64) / 2**mantissa_bits + 1
        sig = sig.to(dtype)
        q = sig * torch.tensor(bins, dtype=dtype) / sig  # bf16 tensor ops round each step, as c10
        return bool((q.float() < bins + 1).all())


def _round_to(value: float, dtype: torch.dtype) -> float:
    """``value`` (a double) converted to ``dtype``, as eager's ``Scalar.to<scalar_t>()``."""
    with unset_fake_temporarily():
        return float(torch.tensor(value, dtype=torch.float64).to(dtype))


# ---- small helpers ---------------------------------------------------------------------------
def _scalar_at(ctx: LoweringContext, v: Value, i: int) -> Value:
    """Element ``i`` of a 1-D ``v`` as a 0-d value."""
    return ctx.emit.reshape(ctx.emit.slice(v, [i], [i + 1], [1]), ())


def _bcast(ctx: LoweringContext, s: Value, shape: Sequence[int]) -> Value:
    return ctx.emit.broadcast_in_dim(s, shape, [])


def _round(ctx: LoweringContext, v: Value, dtype: torch.dtype) -> Value:
    """float32 ``v`` rounded to ``dtype`` (kept as float32), subnormals included: a convert
    there and back, the barrier keeping XLA from folding the pair. ``reduce_precision`` would
    flush results below ``dtype``'s smallest normal (6.1e-5 for float16) to zero."""
    if dtype == _F32:
        return v
    e = ctx.emit
    narrow = e.convert(v, dtype)
    return e.convert(e.op1("optimization_barrier", [narrow], narrow.type), _F32)


def _gather1d(ctx: LoweringContext, table: Value, idx: Value) -> Value:
    """``table[idx]`` for a 1-D ``table`` and 1-D int32 ``idx`` (in range)."""
    e = ctx.emit
    (m,) = idx.shape
    return e.gather(
        table,
        e.reshape(idx, (m, 1)),
        offset_dims=[],
        collapsed_slice_dims=[0],
        start_index_map=[0],
        index_vector_dim=1,
        slice_sizes=[1],
        out_shape=(m,),
    )


def _upper_bound(
    ctx: LoweringContext, edges: Value, val: Value, first: Value, length: Value, max_len: int
) -> Value:
    """libstdc++'s ``std::upper_bound(edges + first, edges + first + length, val) - edges`` per
    element, step for step (so unsorted or NaN edges give eager's answer too)."""
    e = ctx.emit
    i32 = lambda c: ctx.full_like(c, first)  # noqa: E731
    last = edges.shape[0] - 1
    for _ in range(max(max_len, 0).bit_length()):
        live = e.compare(length, i32(0), "GT")
        half = e.binary("shift_right_logical", length, i32(1))
        middle = e.binary("add", first, half)
        at = _gather1d(ctx, edges, e.clamp(i32(0), middle, i32(last)))
        go_left = e.compare(val, at, "LT")
        right_len = e.binary("subtract", e.binary("subtract", length, half), i32(1))
        first = e.select(
            e.binary("and", live, e.unary("not", go_left)), e.binary("add", middle, i32(1)), first
        )
        length = e.select(live, e.select(go_left, half, right_len), length)
    return first


# ---- exact fused multiply-add (linspace replay) ----------------------------------------------
def _two_sum(o: Ops, a: Value, b: Value) -> tuple[Value, Value]:
    s = o.add(a, b)
    bb = o.sub(s, a)
    return s, o.add(o.sub(a, o.sub(s, bb)), o.sub(b, bb))


def _split(o: Ops, a: Value) -> tuple[Value, Value]:
    t = o.mul(a, 4097.0)  # Veltkamp: 2^12 + 1 splits float32's 24-bit significand in halves
    hi = o.sub(t, o.sub(t, a))
    return hi, o.sub(a, hi)


def _fma(o: Ops, a: Value, b: Value, c: Value) -> Value:
    """``a * b + c`` rounded once (Boldo and Melquiond's emulation: an error-free product, an
    error-free sum, the two error terms added with round-to-odd, then one rounding)."""
    e = o.e
    p = o.mul(a, b)
    ah, al = _split(o, a)
    bh, bl = _split(o, b)
    perr = o.add(o.add(o.add(o.sub(o.mul(ah, bh), p), o.mul(ah, bl)), o.mul(al, bh)), o.mul(al, bl))
    th, tl = _two_sum(o, c, p)
    s, err = _two_sum(o, tl, perr)
    # round to odd: an inexact sum with an even significand moves one ulp towards the exact value
    bits = e.bitcast_convert(s, torch.int32)
    ibits = lambda c_: o.ctx.full_like(c_, bits)  # noqa: E731
    even = e.compare(e.binary("and", bits, ibits(1)), ibits(0), "EQ")
    fix = e.binary("and", even, e.compare(err, o.c(0.0), "NE"))
    away = e.compare(e.compare(err, o.c(0.0), "GT"), e.compare(s, o.c(0.0), "GT"), "EQ")
    moved = e.binary("add", bits, e.select(away, ibits(1), ibits(-1)))
    v = e.bitcast_convert(e.select(fix, moved, bits), _F32)
    return o.add(th, v)


def _linspace(ctx: LoweringContext, start: Value, end: Value, steps: int) -> Value:
    """Eager's CPU ``linspace(start, end, steps)`` in float32 for 0-d ``start``/``end``."""
    e = ctx.emit
    step = exact_divide(ctx, e.binary("subtract", end, start), e.scalar(float(steps - 1), _F32))
    shape = (steps,)
    i = e.iota(shape, 0, _F32)
    o = Ops(ctx, i)
    step_b, start_b, end_b = (_bcast(ctx, v, shape) for v in (step, start, end))
    lo = _fma(o, step_b, i, start_b)
    hi = _fma(o, o.negate(step_b), o.sub(float(steps - 1), i), end_b)
    return e.select(o.lt(i, float(steps // 2)), lo, hi)


def _static_linspace(ctx: LoweringContext, lo: float, hi: float, steps: int) -> Value:
    with unset_fake_temporarily():  # rules run under the graph's fake mode
        edges = torch.linspace(lo, hi, steps, dtype=_F32).numpy().astype(np.float32)
    return ctx.emit.constant(edges, TensorType((steps,), _F32))


# ---- the shared machinery --------------------------------------------------------------------
def _outer_edges(
    ctx: LoweringContext, cols: Sequence[Value], bins: Sequence[int], rng: Sequence[float] | None
) -> list[Value]:
    """``histogramdd``'s bin edges per dimension (``select_outer_bin_edges`` + ``linspace``)."""
    e = ctx.emit
    out = []
    for d, (col, n) in enumerate(zip(cols, bins, strict=True)):
        if rng is not None or col.shape[0] == 0:
            lo, hi = (float(rng[2 * d]), float(rng[2 * d + 1])) if rng is not None else (0.0, 1.0)
            if lo == hi:
                lo, hi = lo - 0.5, hi + 0.5
            out.append(_static_linspace(ctx, lo, hi, n + 1))
            continue
        lo = e.reduce_simple(col, float("inf"), [0], "minimum")
        hi = e.reduce_simple(col, float("-inf"), [0], "maximum")
        same = e.compare(lo, hi, "EQ")
        half = e.scalar(0.5, _F32)
        lo = e.select(same, e.binary("subtract", lo, half), lo)
        hi = e.select(same, e.binary("add", hi, half), hi)
        out.append(_linspace(ctx, lo, hi, n + 1))
    return out


def _bin_of(ctx: LoweringContext, col: Value, edges: Value, algorithm: str) -> tuple[Value, Value]:
    """(in-range mask, bin index) of each float32 element of ``col`` for one dimension's
    ``edges`` (``histogramdd_cpu_contiguous``'s inner loop). ``algorithm``: ``local`` (linear
    guess corrected by a local search, for linspace edges) or ``search`` (binary search)."""
    e = ctx.emit
    (m,) = col.shape
    n_edges = edges.shape[0]
    o = Ops(ctx, col)
    left = _bcast(ctx, _scalar_at(ctx, edges, 0), (m,))
    right = _bcast(ctx, _scalar_at(ctx, edges, n_edges - 1), (m,))
    keep = o.and_(e.compare(col, left, "GE"), e.compare(col, right, "LE"))
    ivec = lambda c: e.full(c, (m,), INDEX)  # noqa: E731
    if algorithm == "search":
        pos = _upper_bound(ctx, edges, col, ivec(0), ivec(n_edges), n_edges)
        pos = e.binary("subtract", pos, ivec(1))
    else:
        q = exact_divide(ctx, o.mul(o.sub(col, left), float(n_edges - 1)), o.sub(right, left))
        # out-of-range elements are dropped below; keep their index finite and in range first
        q = e.select(keep, q, o.c(0.0))
        pos = e.convert(q, INDEX)
        lo = e.binary("maximum", ivec(0), e.binary("subtract", pos, ivec(1)))
        hi = e.binary("minimum", e.binary("add", pos, ivec(2)), ivec(n_edges))
        pos = _upper_bound(ctx, edges, col, lo, e.binary("subtract", hi, lo), 3)
        pos = e.binary("subtract", pos, ivec(1))
    # the last bin includes its right edge; clamping also keeps dropped elements in range
    pos = e.clamp(ivec(0), pos, ivec(n_edges - 2))
    return keep, pos


def _accumulate(
    ctx: LoweringContext,
    keeps: Sequence[Value],
    positions: Sequence[Value],
    bins: Sequence[int],
    weight: Value | None,
) -> Value:
    """float32 histogram of shape ``bins``: scatter-add of 1 (or the weight) at each kept
    element's bin."""
    e = ctx.emit
    (m,) = positions[0].shape
    total = int(np.prod(bins))
    flat = e.full(0, (m,), INDEX)
    stride = total
    keep = keeps[0]
    for k, p, n in zip(keeps, positions, bins, strict=True):
        stride //= n
        flat = e.binary("add", flat, e.binary("multiply", p, e.full(stride, (m,), INDEX)))
        keep = e.binary("and", keep, k)
    upd = e.convert(weight, _F32) if weight is not None else e.full(1.0, (m,), _F32)
    upd = e.select(keep, upd, e.full(0.0, (m,), _F32))
    hist = e.scatter(
        e.full(0.0, (total,), _F32),
        e.reshape(flat, (m, 1)),
        upd,
        update_window_dims=[],
        inserted_window_dims=[0],
        scatter_dims_to_operand_dims=[0],
        index_vector_dim=1,
        combiner="add",
    )
    return e.reshape(hist, tuple(bins))


def _density(ctx: LoweringContext, hist: Value, edges: Sequence[Value]) -> Value:
    """``hist / hist.sum()``, then divided by each dimension's bin widths (eager's order)."""
    e = ctx.emit
    shape = hist.shape
    total = e.reduce_simple(hist, 0.0, list(range(hist.rank)), "add")
    hist = exact_divide(ctx, hist, _bcast(ctx, total, shape))
    for d, ed in enumerate(edges):
        n = ed.shape[0]
        width = e.binary("subtract", e.slice(ed, [1], [n], [1]), e.slice(ed, [0], [n - 1], [1]))
        hist = exact_divide(ctx, hist, e.broadcast_in_dim(width, shape, [d]))
    return hist


def _columns(ctx: LoweringContext, x: Value, d: int) -> list[Value]:
    """``x`` reshaped to (M, d), as its ``d`` columns (each of shape (M,))."""
    e = ctx.emit
    m = int(np.prod(x.shape)) // d if d else 0
    x2 = e.reshape(x, (m, d))
    return [e.reshape(e.slice(x2, [0, j], [m, j + 1], [1, 1]), (m,)) for j in range(d)]


def _histogramdd(
    ctx: LoweringContext,
    x: Value,
    edges: Sequence[Value],
    algorithm: str,
    weight: Value | None,
    density: bool,
) -> Value:
    cols = _columns(ctx, x, len(edges))
    bins = [ed.shape[0] - 1 for ed in edges]
    if cols[0].shape[0] == 0:
        hist = ctx.emit.full(0.0, tuple(bins), _F32)
    else:
        found = [_bin_of(ctx, c, ed, algorithm) for c, ed in zip(cols, edges, strict=True)]
        w = ctx.emit.reshape(weight, cols[0].shape) if weight is not None else None
        hist = _accumulate(ctx, [k for k, _ in found], [p for _, p in found], bins, w)
    return _density(ctx, hist, edges) if density else hist


# ---- rules -----------------------------------------------------------------------------------
@lowering(aten.histc.default, supports=_histc_support)
def _lower_histc(
    ctx: LoweringContext, x: Value, bins: int = 100, min: Any = 0, max: Any = 0
) -> Value:
    e = ctx.emit
    dt = x.dtype
    n = int(np.prod(x.shape))
    if n == 0:
        return e.full(0, (bins,), ctx.out_dtype)
    (col,) = _columns(ctx, x, 1)
    col = e.convert(col, _F32)  # bf16/f16 values are exact in float32; rounding is explicit
    lo, hi = float(min), float(max)
    if lo == hi:
        # histc_select_outer_bin_edges: the data's extrema, widened by 1 when equal; edges are
        # then rounded to the input dtype (linspace in that dtype keeps its endpoints)
        left = e.reduce_simple(col, float("inf"), [0], "minimum")
        right = e.reduce_simple(col, float("-inf"), [0], "maximum")
        same = e.compare(left, right, "EQ")
        one = e.scalar(1.0, _F32)
        left = e.select(same, e.binary("subtract", left, one), left)
        right = e.select(same, e.binary("add", right, one), right)
        left, right = _round(ctx, left, dt), _round(ctx, right, dt)
    else:
        left = e.scalar(_round_to(lo, dt), _F32)
        right = e.scalar(_round_to(hi, dt), _F32)
    keep, pos = _bin_of_histc(ctx, col, left, right, bins, dt)
    hist = _accumulate(ctx, [keep], [pos], [bins], None)
    return e.convert(hist, ctx.out_dtype)


def _bin_of_histc(
    ctx: LoweringContext, col: Value, left: Value, right: Value, bins: int, dt: torch.dtype
) -> tuple[Value, Value]:
    """(in-range mask, bin index) by histc's LINEAR_INTERPOLATION: the truncated quotient alone
    (no search over edges), computed in ``dt``'s precision from 0-d outer edges."""
    e = ctx.emit
    (m,) = col.shape
    o = Ops(ctx, col)
    left, right = _bcast(ctx, left, (m,)), _bcast(ctx, right, (m,))
    keep = o.and_(e.compare(col, left, "GE"), e.compare(col, right, "LE"))
    r = lambda v: _round(ctx, v, dt)  # noqa: E731  c10's per-operation rounding
    # c10's ``BFloat16 * int64_t`` converts the int to the dtype first
    nb = _round_to(float(bins), dt)
    q = r(exact_divide(ctx, r(o.mul(r(o.sub(col, left)), nb)), r(o.sub(right, left))))
    # A quotient that overflowed the dtype (inf, or NaN from inf / inf: a wide range times many
    # bins in float16) becomes INT64_MIN in eager's cast on x86-64, and INT64_MIN elements past
    # the histogram's start wrap around to its first bin: count such elements in bin 0.
    q = e.select(o.and_(keep, o.isfinite(q)), q, o.c(0.0))
    pos = e.convert(q, INDEX)
    return keep, e.clamp(e.full(0, (m,), INDEX), pos, e.full(bins - 1, (m,), INDEX))


@lowering(aten.histogram.bin_ct, supports=float32_only)
def _lower_histogram_bin_ct(
    ctx: LoweringContext,
    x: Value,
    bins: int = 100,
    *,
    range: Sequence[float] | None = None,  # noqa: A002  (the schema's name)
    weight: Value | None = None,
    density: bool = False,
) -> tuple[Value, Value]:
    cols = _columns(ctx, x, 1)
    (edges,) = _outer_edges(ctx, cols, [bins], range)
    return _histogramdd(ctx, x, [edges], "local", weight, density), edges


@lowering(aten.histogram.bins_tensor, supports=float32_only)
def _lower_histogram_bins_tensor(
    ctx: LoweringContext,
    x: Value,
    bins: Value,
    *,
    weight: Value | None = None,
    density: bool = False,
) -> tuple[Value, Value]:
    return _histogramdd(ctx, x, [bins], "search", weight, density), bins


@lowering(aten._histogramdd_bin_edges.default, supports=float32_only)
def _lower_histogramdd_bin_edges(
    ctx: LoweringContext,
    x: Value,
    bins: Sequence[int],
    *,
    range: Sequence[float] | None = None,  # noqa: A002
    weight: Value | None = None,
    density: bool = False,
) -> list[Value]:
    return _outer_edges(ctx, _columns(ctx, x, len(bins)), list(bins), range)


@lowering(aten._histogramdd_from_bin_cts.default, supports=float32_only)
def _lower_histogramdd_from_bin_cts(
    ctx: LoweringContext,
    x: Value,
    bins: Sequence[int],
    *,
    range: Sequence[float] | None = None,  # noqa: A002
    weight: Value | None = None,
    density: bool = False,
) -> Value:
    edges = _outer_edges(ctx, _columns(ctx, x, len(bins)), list(bins), range)
    return _histogramdd(ctx, x, edges, "local", weight, density)


@lowering(aten._histogramdd_from_bin_tensors.default, supports=float32_only)
def _lower_histogramdd_from_bin_tensors(
    ctx: LoweringContext,
    x: Value,
    bins: Sequence[Value],
    *,
    weight: Value | None = None,
    density: bool = False,
) -> Value:
    return _histogramdd(ctx, x, list(bins), "search", weight, density)
