"""``segment_reduce`` and its backward ``_segment_reduce_backward`` (decompositions apply below
autograd, so the backward op reaches the graph and is decomposed here too), after eager's CPU
kernels in ``aten/src/ATen/native/SegmentReduce.cpp``.

Segments run along ``axis`` (the last axis of ``lengths``; ``offsets`` become lengths by
differencing). A position's segment is the number of segment ends at or before it, built with a
scatter and a cumsum as eager's ``make_offset2bag`` does, so no shape depends on the lengths'
values; positions past the last segment (possible with ``unsafe``) go to a spare slot that is
dropped. Each segment then reduces with one ``scatter_reduce`` into a tensor filled with
``initial`` or eager's default (``-inf`` for max, ``inf`` for min, 0 for sum/mean, 1 for prod),
in the data dtype as eager accumulates. Mean divides by the length (converted to the data dtype,
as eager's ``scalar / int64`` does) and gives NaN for an empty segment without ``initial``.

The backward follows eager's kernel exactly, quirks included: max/min send the gradient to every
element equal to the result (or NaN) and divide it by their count only where it is positive;
prod divides ``grad * output`` by each element, except at zeros and NaNs, which get the product
of the other elements (times ``initial``). ``indices`` (unsupported by eager too) declines.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .counting import scatter_count

aten = torch.ops.aten

_SCATTER = {"sum": "sum", "mean": "sum", "prod": "prod", "max": "amax", "min": "amin"}
_DEFAULT = {"sum": 0.0, "mean": 0.0, "prod": 1.0, "max": -math.inf, "min": math.inf}


def _lengths(lengths: torch.Tensor | None, offsets: torch.Tensor | None) -> torch.Tensor | None:
    if lengths is not None:
        return lengths
    if offsets is not None:
        return offsets[..., 1:] - offsets[..., :-1]
    return None


def _layout(
    data: torch.Tensor, lengths: torch.Tensor, axis: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """``data`` as (outer, N, inner), the segment id of each (outer, position) as an index
    broadcast over inner, the lengths as (outer, S), and the output shape."""
    outer = math.prod(data.shape[:axis])
    n, segments = data.shape[axis], lengths.shape[-1]
    flat = data.reshape(outer, n, math.prod(data.shape[axis + 1 :]))  # -1 fails on 0 elements
    lens = lengths.reshape(outer, segments).to(torch.int64)
    ends = lens.cumsum(1).clamp(max=n)
    marks = scatter_count((outer, n + 1), 1, ends, None)
    seg = marks.cumsum(1)[:, :n].clamp(max=segments)  # segments == the spare slot
    index = seg.unsqueeze(2).expand(flat.shape)
    shape = [*data.shape[:axis], segments, *data.shape[axis + 1 :]]
    return flat, index, lens, shape


def _segment_reduce(
    data: torch.Tensor,
    reduce: str,
    *,
    lengths: torch.Tensor | None = None,
    indices: torch.Tensor | None = None,
    offsets: torch.Tensor | None = None,
    axis: int = 0,
    unsafe: bool = False,
    initial: Any = None,
) -> Any:
    """``aten.segment_reduce``: one scatter_reduce per call; see the module docstring."""
    lens = _lengths(lengths, offsets)
    if indices is not None or lens is None or reduce not in _SCATTER:
        return NotImplemented
    axis = axis + data.dim() if axis < 0 else axis
    if axis != lens.dim() - 1 or not data.dtype.is_floating_point:
        return NotImplemented
    flat, index, lens, shape = _layout(data, lens, axis)
    start = _DEFAULT[reduce] if initial is None else initial
    segments = lens.shape[1]
    acc = torch.full(
        (flat.shape[0], segments + 1, flat.shape[2]), start, dtype=data.dtype, device=data.device
    )
    out = acc.scatter_reduce(1, index, flat, _SCATTER[reduce])[:, :segments]
    if reduce == "mean":
        # The divisor goes through a gather, not a broadcast: XLA rewrites a division by a
        # broadcast as a multiplication by its reciprocal, which is not eager's quotient.
        size = lens.unsqueeze(2).expand(out.shape)
        rows = torch.arange(segments, device=data.device).view(1, -1, 1).expand(out.shape)
        size = size.gather(1, rows)
        out = torch.where(size > 0, out / size.to(data.dtype), out)
        if initial is None:
            out = torch.where(size == 0, math.nan, out)
    return out.reshape(shape).contiguous()  # eager's kernel writes a fresh contiguous output


def _segment_reduce_backward(
    grad: torch.Tensor,
    output: torch.Tensor,
    data: torch.Tensor,
    reduce: str,
    *,
    lengths: torch.Tensor | None = None,
    offsets: torch.Tensor | None = None,
    axis: int = 0,
    initial: Any = None,
) -> Any:
    """Gradient of ``data``, element by element as eager's backward kernel computes it."""
    lens = _lengths(lengths, offsets)
    if lens is None or reduce not in _SCATTER:
        return NotImplemented
    axis = axis + data.dim() if axis < 0 else axis
    if axis != lens.dim() - 1:
        return NotImplemented
    flat, index, lens, _ = _layout(data, lens, axis)
    outer, segments, inner = flat.shape[0], lens.shape[1], flat.shape[2]
    pad = torch.zeros(outer, 1, inner, dtype=grad.dtype, device=grad.device)
    # Per-position views of the segment's gradient and result (the spare slot gets zeros).
    g = torch.cat([grad.reshape(outer, segments, inner), pad], 1).gather(1, index)
    res = torch.cat([output.reshape(outer, segments, inner), pad], 1).gather(1, index)
    inside = index < segments  # past the last segment eager leaves the gradient 0
    if reduce == "sum":
        gi = g
    elif reduce == "mean":
        size = torch.cat([lens, torch.ones_like(lens[:, :1])], 1).unsqueeze(2)
        gi = g / size.expand(outer, segments + 1, inner).gather(1, index).to(grad.dtype)
    elif reduce in ("max", "min"):
        hit = flat.isnan() | (flat == res)
        count = scatter_count((outer, segments + 1, inner), 1, index, hit).gather(1, index)
        gi = torch.where(hit, g, 0)
        gi = torch.where((count >= 2) & (gi > 0), gi / count.to(grad.dtype), gi)
    else:
        gi = _prod_backward(flat, index, g, res, segments, initial)
    return torch.where(inside, gi, 0).reshape(data.shape)


def _prod_backward(
    flat: torch.Tensor,
    index: torch.Tensor,
    g: torch.Tensor,
    res: torch.Tensor,
    segments: int,
    initial: Any,
) -> torch.Tensor:
    """``grad * output / x``; at a zero or NaN, ``grad`` times the product of the segment's
    other elements and ``initial``."""
    special = flat.isnan() | (flat == 0)
    shape = (flat.shape[0], segments + 1, flat.shape[2])
    ones = torch.ones(shape, dtype=flat.dtype, device=flat.device)
    start = 1.0 if initial is None else initial
    # Product of the ordinary elements, and how many zeros / NaNs the segment holds.
    plain = ones.scatter_reduce(1, index, torch.where(special, 1.0, flat), "prod")
    plain = (plain * start).gather(1, index)
    n_special = scatter_count(shape, 1, index, special).gather(1, index)
    n_nan = scatter_count(shape, 1, index, flat.isnan()).gather(1, index)
    # The other specials multiply in as 0, or NaN when one of them is NaN.
    others_nan = (n_nan - flat.isnan().to(torch.int64)) > 0
    others = torch.where(others_nan, math.nan, 0.0).to(flat.dtype)
    exclusive = torch.where(n_special > 1, plain * others, plain)
    return torch.where(special, g * exclusive, (g * res) / flat)


DECOMPOSITIONS: dict[Any, Any] = {
    aten.segment_reduce.default: _segment_reduce,
    aten._segment_reduce_backward.default: _segment_reduce_backward,
}
