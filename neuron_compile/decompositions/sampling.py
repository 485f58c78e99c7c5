"""Grid sampling and resizing ops core ATen keeps whole, as the eager CPU kernels compute them.

Covered: ``grid_sampler_{2,3}d``, ``_upsample_bilinear2d_aa`` (its ``.vec`` overload decomposes
onto it), their backward ops (AOTAutograd asks for them: the forwards have autograd formulas),
and the ``upsample_nearest*d_backward`` ops called directly.

Forward: each function follows its CPU kernel operation by operation in the input's dtype (the
kernels compute in ``scalar_t``; a bfloat16 grid computed in float32 would pick other pixels in
nearest mode) and sums in the kernel's order: bfloat16 results are bit-exact, float32 ones agree
to rounding (the vectorized kernel may fuse multiply-adds).

- ``grid_sampler_2d`` follows the vectorized kernel (``native/cpu/GridSamplerKernel.cpp``):
  unnormalize ``(g + 1) * s - 0.5``, reflection by ``trunc`` of the coordinate over twice the span,
  a NaN coordinate clipped to 0; bilinear, nearest (round half to even) and bicubic (A = -0.75,
  padding applied to each of the 16 taps). PyTorch's own decomposition is not used: it
  unnormalizes in another order, computes bfloat16 in float32 (other pixels than eager's), counts
  reflections in int8 (overflows past 127 spans), and its derivative passes the clip's gradient
  at the borders.
- ``grid_sampler_3d`` follows the scalar kernel (``native/GridSampler.cpp``, ``GridSampler.h``):
  unnormalize ``((g + 1) / 2) * (size - 1)`` or ``((g + 1) * size - 1) / 2``, reflection by
  ``fmod`` and the parity of ``floor``, ``min(size - 1, max(x, 0))`` (a NaN clips to ``size - 1``);
  trilinear sums only the in-bounds corners. Bicubic is 2-D only (eager raises): left to eager.
- ``_upsample_bilinear2d_aa`` follows the separable kernel (``native/cpu/UpSampleKernel.cpp``):
  the width pass, then the height pass, each skipped when that size is unchanged; each output's
  taps ``xmin .. xmin + xsize`` and normalized triangle weights come from iotas in the graph. The
  kernel rounds the filter argument ``(j + xmin - center + 0.5) * invscale`` from double to float
  once, here twice, so a downsampling weight can differ in the last bit. Eager has no
  bfloat16/float16 kernel (it raises), so those stay whole and raise as in eager.

Backward: the samplers' gradients are the kernels' formulas (``apply_get_grad``, ``*_set_grad``):
an out-of-bounds corner gets and gives nothing, the border clip passes no gradient at the border
itself, reflection flips its sign, nearest mode has a zero grid gradient. bfloat16 gradients are
computed in float32 and rounded once (as PyTorch's own decomposition does): eager accumulates them
in bfloat16 in an order no graph reproduces, and the grid's gradient, a difference of corner
values, loses most of its bits that way; float32 is closer to the exact gradient (the
conformance harness's float64 reference) than eager. A NaN grid coordinate is not matched in the
backward. The antialiased backward spreads each output's gradient over both dims' taps, even a
dim the forward left unchanged (as eager's kernel does); the nearest backwards sum each input
cell's outputs one dim at a time, with the kernels' float source indices.
"""

from __future__ import annotations

import functools
import itertools
import math
import struct
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torch._prims_common import suggest_memory_format

aten = torch.ops.aten

_BILINEAR, _NEAREST, _BICUBIC = 0, 1, 2
_ZEROS, _BORDER, _REFLECTION = 0, 1, 2

_MODES_2D = (_BILINEAR, _NEAREST, _BICUBIC)
_MODES_3D = (_BILINEAR, _NEAREST)  # bicubic is 2-D only: eager raises
_PADDINGS = (_ZEROS, _BORDER, _REFLECTION)


# --------------------------------------------------------------------------- shared pieces


def _const(v: float, dtype: torch.dtype) -> float:
    """``v`` rounded to ``dtype``: the kernels hold their constants in ``scalar_t``."""
    if dtype == torch.float64:
        return v
    f = struct.unpack("<f", struct.pack("<f", v))[0]
    if dtype == torch.bfloat16:  # round to nearest even on the top 16 bits, as c10::BFloat16
        bits = struct.unpack("<I", struct.pack("<f", f))[0]
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]
    if dtype == torch.float16:
        return struct.unpack("<e", struct.pack("<e", f))[0]
    return f


def _pick(cond: Tensor, a: float | Tensor, b: float | Tensor, like: Tensor) -> Tensor:
    """``where`` with Python-number branches kept in ``like``'s dtype."""
    full = lambda v: v if isinstance(v, Tensor) else torch.full_like(like, v)  # noqa: E731
    return torch.where(cond, full(a), full(b))


def _clip(x: Tensor, size: int, nan_to_max: bool) -> tuple[Tensor, Tensor]:
    """Clip to ``[0, size - 1]``, and where ``x`` was strictly inside (the kernels' clip gradient
    is 1 there, 0 at and past the borders). NaN: 0 in the vectorized kernel, size - 1 in the scalar."""
    hi = _const(size - 1, x.dtype)
    inside = (x > 0) & (x < hi)
    outside = _pick(x <= 0, 0.0, hi, x) if nan_to_max else _pick(x >= hi, hi, 0.0, x)
    return torch.where(inside, x, outside), inside


def _cubic(t: Tensor, grad: bool = False) -> list[Tensor]:
    """Cubic convolution weights (A = -0.75) of the taps at -1, 0, 1, 2 for fraction ``t``, or
    with ``grad`` the kernel's ``get_cubic_coefficients_grad`` (minus their derivatives)."""
    a = -0.75
    if grad:
        return [
            ((-1 - t) * (-3 * a) - 10 * a) * (-1 - t) - 8 * a,
            ((-t) * (-3 * (a + 2)) - 2 * (a + 3)) * (-t),
            ((1 - t) * (3 * (a + 2)) - 2 * (a + 3)) * (1 - t),
            ((2 - t) * (3 * a) - 10 * a) * (2 - t) + 8 * a,
        ]

    def outer(x: Tensor) -> Tensor:  # 1 < x < 2
        return ((x * a - 5 * a) * x + 8 * a) * x - 4 * a

    def inner(x: Tensor) -> Tensor:  # x <= 1
        return ((x * (a + 2) - (a + 3)) * x) * x + 1

    return [outer(t + 1), inner(t), inner(1 - t), outer(2 - t)]


class _Taps:
    """Reads of ``input`` (N, C, *spatial) at integer-valued float coordinates (N, *out), one per
    spatial dim in the input's order, and the scatter-add back. Out-of-bounds (or NaN)
    coordinates read 0 and receive nothing, as in the kernels' masked gathers."""

    def __init__(self, input: Tensor, out_shape: Sequence[int]) -> None:
        self.n, self.c = input.shape[0], input.shape[1]
        self.sizes = list(input.shape[2:])
        self.out_shape = list(out_shape)
        self.count = math.prod(out_shape)
        self.flat = input.reshape(self.n, self.c, math.prod(self.sizes))

    def valid(self, coords: Sequence[Tensor]) -> Tensor:
        oks = [(c >= 0) & (c < size) for c, size in zip(coords, self.sizes, strict=True)]
        return functools.reduce(torch.logical_and, oks)  # on floats: NaN and huge are outside

    def _index(self, coords: Sequence[Tensor], ok: Tensor) -> Tensor:
        linear, stride = None, 1
        for c, size in reversed(list(zip(coords, self.sizes, strict=True))):
            idx = torch.where(ok, c, torch.zeros_like(c)).to(torch.int64) * stride
            linear = idx if linear is None else linear + idx
            stride *= size
        assert linear is not None
        return linear.reshape(self.n, 1, self.count).expand(self.n, self.c, self.count)

    def read(self, coords: Sequence[Tensor], ok: Tensor | None = None, mask: bool = True) -> Tensor:
        """Values (N, C, *out); where not ``ok`` (default: in bounds) 0, or anything if not ``mask``."""
        ok = self.valid(coords) if ok is None else ok
        vals = torch.gather(self.flat, 2, self._index(coords, ok))
        vals = vals.reshape(self.n, self.c, *self.out_shape)
        return torch.where(ok.unsqueeze(1), vals, torch.zeros_like(vals)) if mask else vals

    def scatter(self, pieces: Sequence[tuple[Sequence[Tensor], Tensor]]) -> Tensor:
        """Gradient of the input: each (coords, values (N, C, *out)) added where in bounds."""
        index, src = [], []
        for coords, vals in pieces:
            ok = self.valid(coords)
            index.append(self._index(coords, ok))
            vals = torch.where(ok.unsqueeze(1), vals, torch.zeros_like(vals))
            src.append(vals.reshape(self.n, self.c, self.count))
        src_all = torch.cat(src, 2)
        acc = torch.zeros_like(self.flat, dtype=src_all.dtype)
        acc = acc.scatter_add(2, torch.cat(index, 2), src_all)
        return acc.reshape(self.n, self.c, *self.sizes)


def _opmath(t: Tensor) -> Tensor:
    """float32 for a bfloat16/float16 tensor (the sampler backwards compute in it)."""
    return t.float() if t.dtype in (torch.bfloat16, torch.float16) else t


# --------------------------------------------------------------------------- grid_sampler_2d


def _unnormalize_2d(g: Tensor, size: int, align_corners: bool) -> tuple[Tensor, float]:
    """The vectorized kernel's ``(g + 1) * s - 0.5`` (``- 0.5`` without ``align_corners``)."""
    sf = _const((size - 1) / 2 if align_corners else size / 2, g.dtype)
    return ((g + 1) * sf if align_corners else (g + 1) * sf - 0.5), sf


def _location_2d(
    g: Tensor, size: int, padding: int, align_corners: bool, grad: bool
) -> tuple[Tensor, Tensor | None]:
    """``ComputeLocation::apply_get_grad`` of the vectorized kernel: the source coordinate and,
    with ``grad``, its gradient multiplier."""
    x, sf = _unnormalize_2d(g, size, align_corners)
    if padding == _ZEROS:
        return x, (torch.full_like(x, sf) if grad else None)
    sign: Tensor | float = 1.0
    if padding == _REFLECTION:
        x, sign = _reflect_2d(x, size, align_corners)
    x, inside = _clip(x, size, nan_to_max=False)
    if not grad:
        return x, None
    return x, _pick(inside, sign * sf if isinstance(sign, Tensor) else sf, 0.0, x)


def _reflect_2d(x: Tensor, size: int, align_corners: bool) -> tuple[Tensor, Tensor]:
    """``reflect_coordinates_get_grad``: fold by whole double spans (``trunc``), reflect once
    more if past the span; the gradient sign flips for a negative input or that last reflection."""
    if align_corners and size <= 1:
        return torch.zeros_like(x), torch.zeros_like(x)
    twice_span = _const(2 * (size - 1) if align_corners else 2 * size, x.dtype)
    shifted = x if align_corners else x + 0.5  # subtract low = -0.5
    a = shifted.abs()
    extra = a - torch.trunc(a / twice_span) * twice_span
    reflected = twice_span - extra
    flip = extra > reflected
    folded = torch.where(flip, reflected, extra)
    sign = _pick(flip ^ (shifted < 0), -1.0, 1.0, x)
    return (folded if align_corners else folded - 0.5), sign


def _pad_taps_2d(x: Tensor, size: int, padding: int, align_corners: bool) -> Tensor:
    """``compute_coordinates`` of a bicubic tap (padding only, no gradient)."""
    if padding == _REFLECTION:
        x = _reflect_2d(x, size, align_corners)[0]
    return _clip(x, size, nan_to_max=False)[0] if padding != _ZEROS else x


def _grid_sample_2d(
    input: Tensor,
    grid: Tensor,
    mode: int,
    padding: int,
    align_corners: bool,
    grad_output: Tensor | None = None,
) -> Any:
    """The forward, or with ``grad_output`` the kernel's backward: (grad_input, grad_grid).

    The taps of an output point (4 corners, 16 for bicubic) are stacked along new dims after N
    and read with one gather (a graph per tap compiles far slower); sums over them are unrolled
    in the kernel's order."""
    _, _, h, w = input.shape
    out = list(grid.shape[1:3])
    gout = grad_output
    if mode == _BICUBIC:  # padding applies to each tap, not to the location
        x, sf_x = _unnormalize_2d(grid[..., 0], w, align_corners)
        y, sf_y = _unnormalize_2d(grid[..., 1], h, align_corners)
        x0, y0 = torch.floor(x), torch.floor(y)
        xs = _pad_taps_2d(torch.stack([x0 - 1, x0, x0 + 1, x0 + 2], 1), w, padding, align_corners)
        ys = _pad_taps_2d(torch.stack([y0 - 1, y0, y0 + 1, y0 + 2], 1), h, padding, align_corners)
        taps = _Taps(input, [4, 4, *out])  # (y tap j, x tap i)
        at = [ys.unsqueeze(2), xs.unsqueeze(1)]
        vals = taps.read(at)  # (N, C, 4, 4, *out)
        cx = torch.stack(_cubic(x - x0), 1)[:, None, None]  # (N, 1, 1, 4, *out)
        cy = torch.stack(_cubic(y - y0), 1)[:, None, :, None]  # (N, 1, 4, 1, *out)
        if gout is None:
            xt = cx * vals
            rows = _sum_in_order([xt.select(3, i) for i in range(4)])  # (N, C, 4, *out)
            yt = cy.squeeze(3) * rows
            return _sum_in_order([yt.select(2, j) for j in range(4)])
        dx = torch.stack(_cubic(x - x0, grad=True), 1)[:, None, None]
        dy = torch.stack(_cubic(y - y0, grad=True), 1)[:, None, :, None]
        g4 = gout[:, :, None, None]
        vg = vals * g4
        gx = -(vg * dx * cy).sum((1, 2, 3)) * sf_x
        gy = -(vg * dy * cx).sum((1, 2, 3)) * sf_y
        return taps.scatter([(at, g4 * cx * cy)]), torch.stack([gx, gy], -1)
    x, gx_mult = _location_2d(grid[..., 0], w, padding, align_corners, gout is not None)
    y, gy_mult = _location_2d(grid[..., 1], h, padding, align_corners, gout is not None)
    if mode == _NEAREST:
        at = [torch.round(y), torch.round(x)]  # half to even, as the kernel's round
        taps = _Taps(input, out)
        if gout is None:
            return taps.read(at)
        return taps.scatter([(at, gout)]), torch.zeros_like(grid)
    x_w, y_n = torch.floor(x), torch.floor(y)
    dw = x - x_w  # distances to the west/north edges, then east/south
    de = 1 - dw
    dn = y - y_n
    ds = 1 - dn
    x_e, y_s = x_w + 1, y_n + 1
    taps = _Taps(input, [4, *out])  # corners nw, ne, sw, se
    at = [torch.stack([y_n, y_n, y_s, y_s], 1), torch.stack([x_w, x_e, x_w, x_e], 1)]
    weight = torch.stack([ds * de, ds * dw, dn * de, dn * dw], 1).unsqueeze(1)
    vals = taps.read(at)  # (N, C, 4, *out)
    if gout is None:
        terms = vals * weight
        return _sum_in_order([terms.select(2, k) for k in range(4)])
    nw, ne, sw, se = vals.unbind(2)
    s_, n_, w_, e_ = (t.unsqueeze(1) for t in (ds, dn, dw, de))
    assert gx_mult is not None and gy_mult is not None
    gx = (((ne - nw) * s_ + (se - sw) * n_) * gout).sum(1) * gx_mult
    gy = (((sw - nw) * e_ + (se - ne) * w_) * gout).sum(1) * gy_mult
    grad_input = taps.scatter([(at, gout.unsqueeze(2) * weight)])
    return grad_input, torch.stack([gx, gy], -1)


def _sum_in_order(terms: Sequence[Tensor]) -> Tensor:
    """Left-to-right sum, the kernels' accumulation order."""
    return functools.reduce(torch.add, terms)


# --------------------------------------------------------------------------- grid_sampler_3d


def _location_3d(
    g: Tensor, size: int, padding: int, align_corners: bool, grad: bool
) -> tuple[Tensor, Tensor | None]:
    """``grid_sampler_compute_source_index_set_grad`` of ``GridSampler.h``: unnormalize
    ``((g + 1) / 2) * (size - 1)`` or ``((g + 1) * size - 1) / 2``, then pad."""
    dt = g.dtype
    if align_corners:
        x, mult = ((g + 1) / 2) * _const(size - 1, dt), _const(_const(size - 1, dt) / 2, dt)
    else:
        x, mult = ((g + 1) * _const(size, dt) - 1) / 2, _const(_const(size, dt) / 2, dt)
    if padding == _ZEROS:
        return x, (torch.full_like(x, mult) if grad else None)
    sign: Tensor | float = 1.0
    if padding == _REFLECTION:
        if align_corners:
            x, sign = _reflect_3d(x, 0, 2 * (size - 1))
        else:
            x, sign = _reflect_3d(x, -1, 2 * size - 1)
    x, inside = _clip(x, size, nan_to_max=True)
    if not grad:
        return x, None
    return x, _pick(inside, sign * mult if isinstance(sign, Tensor) else mult, 0.0, x)


def _reflect_3d(x: Tensor, twice_low: int, twice_high: int) -> tuple[Tensor, Tensor]:
    """``reflect_coordinates_set_grad``: ``fmod`` by the span, reflected when the number of whole
    spans is odd; the gradient sign flips for an input below ``low`` and for an odd count."""
    if twice_low == twice_high:
        return torch.zeros_like(x), torch.zeros_like(x)
    low = _const(twice_low / 2, x.dtype)
    span = _const((twice_high - twice_low) / 2, x.dtype)
    shifted = x - low
    a = shifted.abs()
    extra = torch.fmod(a, span)
    even = torch.fmod(torch.floor(a / span), 2) == 0
    out = torch.where(even, extra + low, (span - extra) + low)
    return out, _pick(even ^ (shifted < 0), 1.0, -1.0, x)


def _grid_sample_3d(
    input: Tensor,
    grid: Tensor,
    mode: int,
    padding: int,
    align_corners: bool,
    grad_output: Tensor | None = None,
) -> Any:
    """The forward, or with ``grad_output`` the kernel's backward: (grad_input, grad_grid)."""
    _, _, d, h, w = input.shape
    grad = grad_output is not None
    x, gx_mult = _location_3d(grid[..., 0], w, padding, align_corners, grad)
    y, gy_mult = _location_3d(grid[..., 1], h, padding, align_corners, grad)
    z, gz_mult = _location_3d(grid[..., 2], d, padding, align_corners, grad)
    gout = grad_output
    if mode == _NEAREST:  # std::nearbyint: half to even, as torch.round
        at = [torch.round(z), torch.round(y), torch.round(x)]
        taps = _Taps(input, grid.shape[1:4])
        if gout is None:
            return taps.read(at)
        return taps.scatter([(at, gout)]), torch.zeros_like(grid)
    # The 8 corners along a new dim 1, in the kernel's order (t/b = z0/z1, n/s = y0/y1, w/e =
    # x0/x1, x fastest): one gather for all of them keeps the graph small. A corner's weight is
    # the product over x, y, z of (c1 - c) at its low side or (c - c0) at its high side.
    bits = list(itertools.product((0, 1), repeat=3))  # (z, y, x) of each corner
    coords, factors, signs = [], [], []
    for k, c in enumerate((z, y, x)):
        lo = torch.floor(c)
        hi = lo + 1
        coords.append(torch.stack([hi if b[k] else lo for b in bits], 1))
        factors.append(torch.stack([(c - lo) if b[k] else (hi - c) for b in bits], 1))
        if grad:
            one = torch.ones_like(c)
            signs.append(torch.stack([one if b[k] else -one for b in bits], 1))
    fz, fy, fx = factors
    weight = fx * fy * fz  # (N, 8, *out)
    corner_taps = _Taps(input, [8, *grid.shape[1:4]])
    if gout is None:
        # The kernel skips out-of-bounds corners altogether: a NaN/inf weight there must not
        # leak in, so the mask goes on the product.
        ok = corner_taps.valid(coords)
        vals = corner_taps.read(coords, ok, mask=False) * weight.unsqueeze(1)  # (N, C, 8, *out)
        terms = torch.where(ok.unsqueeze(1), vals, torch.zeros_like(vals))
        return _sum_in_order([terms.select(2, k) for k in range(8)])
    gout8 = gout.unsqueeze(2)
    vg = (corner_taps.read(coords) * gout8).sum(1)  # (N, 8, *out)
    assert gx_mult is not None and gy_mult is not None and gz_mult is not None
    gz = (vg * (fx * fy) * signs[0]).sum(1) * gz_mult
    gy = (vg * (fx * fz) * signs[1]).sum(1) * gy_mult
    gx = (vg * (fy * fz) * signs[2]).sum(1) * gx_mult
    grad_input = corner_taps.scatter([(coords, gout8 * weight.unsqueeze(1))])
    return grad_input, torch.stack([gx, gy, gz], -1)


def _sampler_ops(impl: Any, modes: tuple[int, ...]) -> tuple[Any, Any]:
    """``aten.grid_sampler_{2,3}d`` and its ``_backward`` on ``impl``. Other modes (3-D bicubic)
    stay whole, for eager to raise its own error."""

    def forward(
        input: Tensor, grid: Tensor, interpolation_mode: int, padding_mode: int, align_corners: bool
    ) -> Tensor:
        if interpolation_mode not in modes or padding_mode not in _PADDINGS:
            return NotImplemented
        return impl(input, grid, interpolation_mode, padding_mode, align_corners)

    def backward(
        grad_output: Tensor,
        input: Tensor,
        grid: Tensor,
        interpolation_mode: int,
        padding_mode: int,
        align_corners: bool,
        output_mask: Sequence[bool],
    ) -> Any:
        if interpolation_mode not in modes or padding_mode not in _PADDINGS:
            return NotImplemented
        up = (_opmath(input), _opmath(grid), interpolation_mode, padding_mode, align_corners)
        gi, gg = impl(*up, _opmath(grad_output))
        return (gi.to(input.dtype) if output_mask[0] else None), gg.to(grid.dtype)

    return forward, backward


grid_sampler_2d, grid_sampler_2d_backward = _sampler_ops(_grid_sample_2d, _MODES_2D)
grid_sampler_3d, grid_sampler_3d_backward = _sampler_ops(_grid_sample_3d, _MODES_3D)


# --------------------------------------------------------------------------- _upsample_bilinear2d_aa


def _aa_scale(
    in_size: int, out_size: int, align_corners: bool, scale: float | None, f: Any
) -> float:
    """``area_pixel_compute_scale`` in the kernel's ``scalar_t`` (``f`` rounds to it)."""
    if align_corners:
        return f(f(in_size - 1) / (out_size - 1)) if out_size > 1 else 0.0
    if scale is not None and scale > 0:
        return f(1.0 / scale)
    return f(f(in_size) / out_size)


def _trunc_half_up(v: Tensor) -> Tensor:
    """``int64(v + 0.5)`` with the sum exact (the kernel adds the double 0.5), for the ``v`` whose
    result is clamped at 0 anyway: floor of the rounded sum, less 1 where rounding crossed up."""
    r = torch.floor(v + 0.5)
    return r - ((r - 0.5) > v).to(v.dtype)


def _aa_taps(
    like: Tensor, in_size: int, out_size: int, align_corners: bool, scale: float | None
) -> tuple[Tensor, Tensor, Tensor, int]:
    """``_compute_indices_min_size_weights_aa`` for every output index at once, from iotas in
    ``like``'s dtype: the tap indices (out * width,), normalized weights (out, width), which
    taps are used (out, width), and the width (the kernel's ``max_interp_size``)."""
    dtype = like.dtype
    f = lambda v: _const(v, dtype)  # noqa: E731
    s = _aa_scale(in_size, out_size, align_corners, scale, f)
    support = f(s) if s >= 1.0 else 1.0  # interp_size * 0.5 = 1 for the triangle filter
    width = math.ceil(support) * 2 + 1
    invscale = f(1.0 / s) if s >= 1.0 else 1.0
    i = torch.arange(out_size, dtype=dtype, device=like.device).unsqueeze(1)  # (out, 1)
    j = torch.arange(width, dtype=dtype, device=like.device).unsqueeze(0)  # (1, width)
    center = (i + 0.5) * s
    xmin = torch.clamp(_trunc_half_up(center - support), min=0)
    xmax = torch.clamp(_trunc_half_up(center + support), max=in_size)
    xsize = torch.clamp(xmax - xmin, 0, width)
    # filter((j + xmin - center + 0.5) * invscale), the triangle filter max(0, 1 - |t|)
    t = torch.abs(((xmin + j) - center + 0.5) * invscale)
    used = j < xsize
    w = torch.where(used & (t < 1.0), 1 - t, torch.zeros_like(t))
    total = _sum_in_order([w[:, k] for k in range(width)]).unsqueeze(1)  # the kernel's running sum
    w = torch.where(total != 0, w / total, w)
    index = torch.clamp(xmin + j, max=in_size - 1).to(torch.int64).reshape(-1)
    return index, w, used, width


def _aa_pass(
    x: Tensor, dim: int, out_size: int, align_corners: bool, scale: float | None
) -> Tensor:
    """One separable pass along ``dim``: out[i] = sum_j x[xmin_i + j] * w_ij over the used taps,
    in the kernel's order (``t0 * w0``, then ``+= t_j * w_j``)."""
    index, w, used, width = _aa_taps(x, x.shape[dim], out_size, align_corners, scale)
    shape = list(x.shape)
    shape[dim : dim + 1] = [out_size, width]
    bshape = [1] * len(shape)
    bshape[dim], bshape[dim + 1] = out_size, width
    terms = torch.index_select(x, dim, index).reshape(shape) * w.reshape(bshape)
    # Taps past an index's count are not read by the kernel: an inf/NaN there must not leak in.
    terms = torch.where(used.reshape(bshape), terms, torch.zeros_like(terms))
    return _sum_in_order([terms.select(dim + 1, k) for k in range(width)])


def _aa_pass_backward(
    g: Tensor, dim: int, in_size: int, align_corners: bool, scale: float | None
) -> Tensor:
    """The adjoint of ``_aa_pass``: each output's gradient times w_ij added at its taps."""
    out_size = g.shape[dim]
    index, w, used, width = _aa_taps(g, in_size, out_size, align_corners, scale)
    bshape = [1] * (g.dim() + 1)
    bshape[dim], bshape[dim + 1] = out_size, width
    src = g.unsqueeze(dim + 1) * torch.where(used, w, torch.zeros_like(w)).reshape(bshape)
    shape = list(g.shape)
    shape[dim] = out_size * width
    acc_shape = list(g.shape)
    acc_shape[dim] = in_size
    return g.new_zeros(acc_shape).index_add(dim, index, src.reshape(shape))


def upsample_bilinear2d_aa(
    input: Tensor,
    output_size: Sequence[int],
    align_corners: bool,
    scales_h: float | None = None,
    scales_w: float | None = None,
) -> Tensor:
    """``aten._upsample_bilinear2d_aa.default``: width pass, then height pass, each only where
    that size changes (an unchanged image is copied whatever the scales say, as eager does); the
    result takes the input's suggested memory format, as eager's."""
    if input.dtype not in (torch.float32, torch.float64) or input.dim() != 4:
        return NotImplemented  # eager has no kernel for these: let it raise
    out_h, out_w = output_size
    x = input
    if out_w != x.shape[3]:
        x = _aa_pass(x, 3, out_w, align_corners, scales_w)
    if out_h != x.shape[2]:
        x = _aa_pass(x, 2, out_h, align_corners, scales_h)
    return x.clone(memory_format=suggest_memory_format(input))


def upsample_bilinear2d_aa_backward(
    grad_output: Tensor,
    output_size: Sequence[int],
    input_size: Sequence[int],
    align_corners: bool,
    scales_h: float | None = None,
    scales_w: float | None = None,
) -> Tensor:
    """``aten._upsample_bilinear2d_aa_backward``: eager's backward kernel spreads each output's
    gradient over both dims' taps, even a dim whose size the forward left unchanged."""
    if grad_output.dtype not in (torch.float32, torch.float64) or grad_output.dim() != 4:
        return NotImplemented
    g = _aa_pass_backward(grad_output, 2, input_size[2], align_corners, scales_h)
    return _aa_pass_backward(g, 3, input_size[3], align_corners, scales_w)


# --------------------------------------------------------------------------- upsample_nearest*_backward


def _nearest_index(in_size: int, out_size: int, scale: float | None, exact: bool) -> Tensor:
    """Source index of each output index: ``nearest_idx`` (``floorf(i * s)``, with its copy and
    ``i >> 1`` special cases) or ``nearest_exact_idx`` (``floorf((i + 0.5) * s)``), in float
    as the kernels compute it (``compute_scales_value<float>``), clamped to ``in_size - 1``."""
    i = torch.arange(out_size)
    if not exact and out_size in (in_size, 2 * in_size):
        return i if out_size == in_size else i // 2
    f32 = torch.float32
    given = scale is not None and scale > 0
    s = _const(1.0 / scale, f32) if given else _const(_const(in_size, f32) / out_size, f32)
    x = i.to(f32)
    src = torch.floor((x + 0.5) * s if exact else x * s)
    return torch.clamp(src, max=in_size - 1).to(torch.int64)


def _nearest_backward(exact: bool) -> Any:
    """``upsample_nearest{1,2,3}d_backward`` (or ``_exact``): each input cell sums the gradients
    of the outputs that read it, one dim at a time (float32 for bfloat16)."""

    def backward(
        grad_output: Tensor,
        output_size: Sequence[int],
        input_size: Sequence[int],
        *scales: float | None,
    ) -> Tensor:
        g = _opmath(grad_output)
        for k, out_size in enumerate(output_size):
            dim = 2 + k
            scale = scales[k] if k < len(scales) else None
            index = _nearest_index(input_size[dim], out_size, scale, exact).to(g.device)
            shape = list(g.shape)
            shape[dim] = input_size[dim]
            g = g.new_zeros(shape).index_add(dim, index, g)
        return g.to(grad_output.dtype)

    return backward


_NEAREST_BACKWARD = (
    aten.upsample_nearest1d_backward,
    aten.upsample_nearest2d_backward,
    aten.upsample_nearest3d_backward,
)
_NEAREST_EXACT_BACKWARD = (
    aten._upsample_nearest_exact1d_backward,
    aten._upsample_nearest_exact2d_backward,
    aten._upsample_nearest_exact3d_backward,
)

DECOMPOSITIONS: dict[Any, Any] = {
    aten.grid_sampler_2d.default: grid_sampler_2d,
    aten.grid_sampler_2d_backward.default: grid_sampler_2d_backward,
    aten.grid_sampler_3d.default: grid_sampler_3d,
    aten.grid_sampler_3d_backward.default: grid_sampler_3d_backward,
    aten._upsample_bilinear2d_aa.default: upsample_bilinear2d_aa,
    aten._upsample_bilinear2d_aa_backward.default: upsample_bilinear2d_aa_backward,
    **{op.default: _nearest_backward(exact=False) for op in _NEAREST_BACKWARD},
    **{op.default: _nearest_backward(exact=True) for op in _NEAREST_EXACT_BACKWARD},
}
