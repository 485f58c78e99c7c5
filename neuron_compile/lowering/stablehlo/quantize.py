"""Affine quantization: ``quantized_decomposed`` quantize/dequantize and ATen fake-quantize.

* ``quantized_decomposed.{quantize,dequantize}_per_tensor`` (``default``, ``tensor``,
  ``tensor2``) and ``{quantize,dequantize}_per_channel`` lower through a traced reference
  (``lowering/reference.py``). The per-channel and scalar-parameter overloads trace eager's own
  ``CompositeExplicitAutograd`` functions; the tensor-parameter overloads, whose eager functions
  call ``.item()``, trace the same formula on the 0-d parameters: ``1.0 / scale`` in float32 is the
  float32 rounding of eager's double ``1.0 / scale.item()`` (double rounding is innocuous for a
  quotient, 53 >= 2 * 24 + 2), and a 0-d parameter promotes exactly like the Python number.
  Quantizing lowers for int8/uint8/int16 results; an int32 (or float8) result falls back, as
  eager's float -> int32 cast of NaN and of 2**31 (float32's rounding of quant_max) is INT32_MIN.
* ``aten.fake_quantize_per_tensor_affine_cachemask`` (and its ``tensor_qparams`` form) and
  ``aten.fake_quantize_per_channel_affine_cachemask`` follow eager's CPU kernels
  (``aten/src/ATen/native/quantized/cpu/kernels/QuantizedOpKernels.cpp``) in float32:
  ``qf = zero_point + nearbyint(x * (1.0f / scale))`` (round half to even), clamp, then
  ``(q - zero_point) * scale`` and the mask ``quant_min <= qf <= quant_max``. Per tensor, the clamp
  is ``fmin(fmax(qf, ...))`` (a NaN ``qf`` gives ``quant_min``, an infinite one clamps); per
  channel, eager first casts ``qf`` to int64, where x86 turns NaN and anything beyond int64 into
  INT64_MIN (so ``quant_min`` and a false mask). These float32 steps equal eager's int64 steps
  while ``quant_min``/``quant_max`` (and so the zero point) fit float32 exactly (|v| <= 2**24);
  wider ranges, and per-channel float zero points (eager rounds ``(q - zp) * scale`` from double),
  fall back.

fake_quantize's backward is the straight-through estimator, ``grad * mask``: AOTAutograd already
emits it as an ``aten.mul`` with the cached mask; ``fake_quantize_per_tensor_affine_cachemask_
backward`` is lowered too in case a graph carries it whole.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.ao.quantization.fx._decomposed as qdecomp  # registers quantized_decomposed
import torch.fx as fx

from ..context import LoweringContext, canonical_dtype
from ..emit import Value
from ..reference import lower_reference
from ..registry import lowering
from ..rules import FLOATS, INTS

aten = torch.ops.aten
qd = torch.ops.quantized_decomposed

#: float32 holds every integer up to this magnitude exactly.
_F32_EXACT = 2**24


# ---- quantized_decomposed: traced references ------------------------------------------------
def _scalar(t: torch.Tensor) -> torch.Tensor:
    """A one-element parameter tensor as 0-d (it promotes like eager's ``.item()`` number)."""
    return t.reshape(())


def _quantize_tensor_ref(
    x: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor,
    quant_min: int | torch.Tensor,
    quant_max: int | torch.Tensor,
    dtype: torch.dtype,
) -> torch.Tensor:
    if x.dtype in (torch.float16, torch.bfloat16):
        x = x.to(torch.float32)
    inv_scale = 1.0 / _scalar(scale).to(torch.float32)
    lo = _scalar(quant_min) if isinstance(quant_min, torch.Tensor) else quant_min
    hi = _scalar(quant_max) if isinstance(quant_max, torch.Tensor) else quant_max
    return torch.clamp(torch.round(x * inv_scale) + _scalar(zero_point), lo, hi).to(dtype)


def _dequantize_tensor_ref(
    x: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor,
    quant_min: Any,
    quant_max: Any,
    dtype: torch.dtype,
    *,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    out_dtype = out_dtype or torch.float32
    return (x.to(out_dtype) - _scalar(zero_point)) * _scalar(scale).to(torch.float32)


#: Quantized dtypes whose float -> int cast agrees with eager's for every input: the clamped value
#: is in range, and NaN becomes 0 both ways (eager's cast goes through int32's 0x80000000, whose
#: low bits are 0). An int32 result would not (eager's NaN and 2**31 become INT32_MIN).
_NARROW_INTS = (torch.int8, torch.uint8, torch.int16)


def _quantize_supported(node: fx.Node) -> str | None:
    dtype, out = node.args[0].meta["val"].dtype, node.meta["val"].dtype
    if dtype not in (*FLOATS, torch.float64):
        return f"input dtype {dtype} not supported"
    if out not in _NARROW_INTS:
        return f"quantized dtype {out} not supported (eager's out-of-range float cast differs)"
    return None


def _dequantize_supported(node: fx.Node) -> str | None:
    dtype = node.args[0].meta["val"].dtype
    return None if canonical_dtype(dtype) in INTS else f"quantized dtype {dtype} not supported"


@lowering(qd.quantize_per_tensor.default, supports=_quantize_supported)
def _lower_quantize_per_tensor(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Value:
    return lower_reference(ctx, qdecomp.quantize_per_tensor, *args, **kwargs)


@lowering(
    qd.quantize_per_tensor.tensor, qd.quantize_per_tensor.tensor2, supports=_quantize_supported
)
def _lower_quantize_per_tensor_tensor(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Value:
    return lower_reference(ctx, _quantize_tensor_ref, *args, **kwargs)


@lowering(qd.dequantize_per_tensor.default, supports=_dequantize_supported)
def _lower_dequantize_per_tensor(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Value:
    return lower_reference(ctx, qdecomp.dequantize_per_tensor, *args, **kwargs)


@lowering(
    qd.dequantize_per_tensor.tensor,
    qd.dequantize_per_tensor.tensor2,
    supports=_dequantize_supported,
)
def _lower_dequantize_per_tensor_tensor(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Value:
    return lower_reference(ctx, _dequantize_tensor_ref, *args, **kwargs)


@lowering(qd.quantize_per_channel.default, supports=_quantize_supported)
def _lower_quantize_per_channel(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Value:
    return lower_reference(ctx, qdecomp.quantize_per_channel, *args, **kwargs)


@lowering(qd.dequantize_per_channel.default, supports=_dequantize_supported)
def _lower_dequantize_per_channel(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Value:
    return lower_reference(ctx, qdecomp.dequantize_per_channel, *args, **kwargs)


# ---- fake quantize: eager's CPU kernel in float32 -------------------------------------------
def _exact_range(quant_min: int, quant_max: int) -> str | None:
    if max(abs(quant_min), abs(quant_max)) > _F32_EXACT:
        return f"quant range [{quant_min}, {quant_max}] is wider than float32's exact integers"
    return None


def _quant_range(node: fx.Node) -> tuple[int, int]:
    """``(quant_min, quant_max)``: the last two arguments of every fake-quantize overload."""
    args = [*node.args, *(node.kwargs[k] for k in ("quant_min", "quant_max") if k in node.kwargs)]
    return args[-2], args[-1]


def _fq_per_tensor_supported(node: fx.Node) -> str | None:
    x = node.args[0].meta["val"]
    if x.dtype not in FLOATS:
        return f"dtype {x.dtype} not supported"
    qmin, qmax = _quant_range(node)
    if not isinstance(node.args[2], fx.Node):  # a Python zero point
        qmin, qmax = min(qmin, node.args[2]), max(qmax, node.args[2])
    return _exact_range(qmin, qmax)


def _fq_per_channel_supported(node: fx.Node) -> str | None:
    x, zp = node.args[0].meta["val"], node.args[2].meta["val"]
    if x.dtype not in FLOATS:
        return f"dtype {x.dtype} not supported"
    if zp.dtype.is_floating_point:
        return "a floating zero_point (eager rounds (q - zero_point) * scale from double)"
    return _exact_range(*_quant_range(node))


def fake_quantize(
    ctx: LoweringContext,
    x: Value,
    scale: Value,
    zero_point: Value,
    quant_min: int,
    quant_max: int,
    *,
    int64_cast: bool,
) -> tuple[Value, Value]:
    """``(fake-quantized x, mask)``; ``scale``/``zero_point`` are float32, shaped like ``x``.
    ``int64_cast``: the per-channel kernel's cast of ``qf`` to int64 before the clamp."""
    e = ctx.emit
    f32 = torch.float32
    xf = e.convert(x, f32)
    full = lambda v: e.full(v, x.shape, f32)  # noqa: E731
    inv_scale = e.binary("divide", full(1.0), scale)
    rounded = e.unary("round_nearest_even", e.binary("multiply", xf, inv_scale))
    qf = e.binary("add", zero_point, rounded)
    if int64_cast:  # x86's cvttss2si: NaN and |qf| >= 2**63 become INT64_MIN
        in_range = e.compare(e.unary("abs", qf), full(2.0**63), "LT")
    else:  # fmax(NaN, quant_min) is quant_min
        in_range = e.compare(qf, qf, "EQ")
    qf = e.select(in_range, qf, full(-np.inf))
    lo, hi = full(float(quant_min)), full(float(quant_max))
    clamped = e.clamp(lo, qf, hi)
    out = e.binary("multiply", e.binary("subtract", clamped, zero_point), scale)
    mask = e.binary("and", e.compare(lo, qf, "LE"), e.compare(qf, hi, "LE"))
    return e.convert(out, x.dtype), mask


def _param(ctx: LoweringContext, v: Value, like: Value, axis: int | None = None) -> Value:
    """A per-tensor (one element) or per-channel (along ``axis``) parameter as float32 shaped
    like ``like``. A floating zero point becomes an integer first (eager's ``toInt``)."""
    e = ctx.emit
    v = e.convert(v, torch.float32)
    if axis is None:
        return e.broadcast_in_dim(e.reshape(v, []), like.shape, [])
    return e.broadcast_in_dim(v, like.shape, [axis])


def _truncated(ctx: LoweringContext, zp: Value) -> Value:
    """``zero_point.item().toInt()``: a floating zero point truncates toward zero."""
    return ctx.emit.convert(zp, torch.int32) if zp.dtype.is_floating_point else zp


@lowering(aten.fake_quantize_per_tensor_affine_cachemask.default, supports=_fq_per_tensor_supported)
def _lower_fq_per_tensor_cachemask(
    ctx: LoweringContext, x: Value, scale: float, zero_point: int, quant_min: int, quant_max: int
) -> tuple[Value, Value]:
    e = ctx.emit
    s = e.full(float(np.float32(scale)), x.shape, torch.float32)  # eager's ``float sc``
    zp = e.full(float(zero_point), x.shape, torch.float32)
    return fake_quantize(ctx, x, s, zp, quant_min, quant_max, int64_cast=False)


@lowering(aten.fake_quantize_per_tensor_affine.default, supports=_fq_per_tensor_supported)
def _lower_fq_per_tensor(ctx: LoweringContext, x: Value, *params: Any) -> Value:
    return _lower_fq_per_tensor_cachemask(ctx, x, *params)[0]


@lowering(
    aten._fake_quantize_per_tensor_affine_cachemask_tensor_qparams.default,
    supports=_fq_per_tensor_supported,
)
def _lower_fq_per_tensor_cachemask_tensor_qparams(
    ctx: LoweringContext,
    x: Value,
    scale: Value,
    zero_point: Value,
    fake_quant_enabled: Value,
    quant_min: int,
    quant_max: int,
) -> tuple[Value, Value]:
    e = ctx.emit
    s = _param(ctx, scale, x)
    zp = _param(ctx, _truncated(ctx, zero_point), x)
    out, mask = fake_quantize(ctx, x, s, zp, quant_min, quant_max, int64_cast=False)
    # fake_quant_enabled == 0: the input passes through with an all-true mask.
    on = e.reshape(e.convert(fake_quant_enabled, torch.bool), [])
    on = e.broadcast_in_dim(on, x.shape, [])
    out = e.select(on, out, x)
    mask = e.select(on, mask, e.full(True, x.shape, torch.bool))
    return out, mask


@lowering(aten.fake_quantize_per_tensor_affine.tensor_qparams, supports=_fq_per_tensor_supported)
def _lower_fq_per_tensor_tensor_qparams(
    ctx: LoweringContext, x: Value, scale: Value, zero_point: Value, quant_min: int, quant_max: int
) -> Value:
    s = _param(ctx, scale, x)
    zp = _param(ctx, _truncated(ctx, zero_point), x)
    return fake_quantize(ctx, x, s, zp, quant_min, quant_max, int64_cast=False)[0]


@lowering(
    aten.fake_quantize_per_channel_affine_cachemask.default, supports=_fq_per_channel_supported
)
def _lower_fq_per_channel_cachemask(
    ctx: LoweringContext,
    x: Value,
    scale: Value,
    zero_point: Value,
    axis: int,
    quant_min: int,
    quant_max: int,
) -> tuple[Value, Value]:
    axis = axis + x.rank if axis < 0 else axis
    s, zp = _param(ctx, scale, x, axis), _param(ctx, zero_point, x, axis)
    return fake_quantize(ctx, x, s, zp, quant_min, quant_max, int64_cast=True)


@lowering(aten.fake_quantize_per_channel_affine.default, supports=_fq_per_channel_supported)
def _lower_fq_per_channel(ctx: LoweringContext, x: Value, *params: Any) -> Value:
    return _lower_fq_per_channel_cachemask(ctx, x, *params)[0]


def _grad_dtype(node: fx.Node) -> str | None:
    dtype = node.args[0].meta["val"].dtype
    return None if dtype in FLOATS else f"dtype {dtype} not supported"


@lowering(aten.fake_quantize_per_tensor_affine_cachemask_backward.default, supports=_grad_dtype)
def _lower_fq_cachemask_backward(ctx: LoweringContext, grad: Value, mask: Value) -> Value:
    """The straight-through estimator: the gradient where the value was in range, else 0."""
    e = ctx.emit
    (mask,) = ctx.promote(mask, dtype=grad.dtype)
    return e.binary("multiply", grad, ctx.broadcast_to(mask, grad.shape))
