"""Ops defined on a float's bit pattern: ``nextafter`` and ``frexp`` (float32 only).

Both work on the IEEE-754 bits as int32 (``bitcast_convert``) and never multiply by powers of
two: XLA's CPU client may flush subnormals to zero in float arithmetic, while eager's results
(and inputs) include subnormals, which integer arithmetic on the bits keeps exact.
"""

from __future__ import annotations

import math

import torch

from ..context import LoweringContext
from ..emit import Value
from ..registry import lowering
from ..rules import float32_only

aten = torch.ops.aten
_I32 = torch.int32
_MANTISSA = 0x007FFFFF
_SIGN = -0x80000000  # 0x80000000 as int32


def _i(ctx: LoweringContext, value: int, like: Value) -> Value:
    return ctx.emit.full(value, like.shape, _I32)


@lowering(aten.nextafter.default, supports=float32_only)
def _lower_nextafter(ctx: LoweringContext, x: Value, y: Value) -> Value:
    """The float after ``x`` towards ``y``: the bit pattern of a non-zero ``x`` moves by one
    (up in magnitude when heading away from zero); from +-0 it is the smallest subnormal with
    ``y``'s sign; ``y`` itself when equal, NaN when either is NaN (C99 ``nextafterf``)."""
    e = ctx.emit
    x, y = ctx.promote(x, y)
    bits = e.bitcast_convert(x, _I32)
    zero = ctx.full_like(0.0, x)
    away = e.binary("xor", e.compare(x, y, "LT"), e.compare(x, zero, "LT"))  # |next| > |x|
    step = e.select(away, _i(ctx, 1, bits), _i(ctx, -1, bits))
    moved = e.bitcast_convert(e.binary("add", bits, step), x.dtype)
    y_sign = e.binary("and", e.bitcast_convert(y, _I32), _i(ctx, _SIGN, bits))
    tiny = e.bitcast_convert(e.binary("or", y_sign, _i(ctx, 1, bits)), x.dtype)
    out = e.select(e.compare(x, zero, "EQ"), tiny, moved)
    out = e.select(e.compare(x, y, "EQ"), y, out)
    either_nan = e.binary("or", e.compare(x, x, "NE"), e.compare(y, y, "NE"))
    return e.select(either_nan, ctx.full_like(math.nan, x), out)


@lowering(aten.frexp.Tensor, supports=float32_only)
def _lower_frexp(ctx: LoweringContext, x: Value) -> tuple[Value, Value]:
    """(mantissa in +-[0.5, 1), int32 exponent) with x = mantissa * 2^exponent; zeros,
    infinities and NaN come back unchanged with exponent 0, as eager returns them."""
    e = ctx.emit
    bits = e.bitcast_convert(x, _I32)
    biased = e.binary(
        "and", e.binary("shift_right_logical", bits, _i(ctx, 23, bits)), _i(ctx, 0xFF, bits)
    )
    frac = e.binary("and", bits, _i(ctx, _MANTISSA, bits))
    sign = e.binary("and", bits, _i(ctx, _SIGN, bits))
    half = _i(ctx, 126 << 23, bits)  # exponent field of [0.5, 1)
    normal_exp = e.binary("subtract", biased, _i(ctx, 126, bits))
    # a subnormal m * 2^-149 with its top bit at 31 - clz(m) is 0.1... * 2^(-117 - clz(m))
    clz = e.unary("count_leading_zeros", frac)
    sub_exp = e.binary("subtract", _i(ctx, -117, bits), clz)
    shifted = e.binary("shift_left", frac, e.binary("subtract", clz, _i(ctx, 8, bits)))
    sub_frac = e.binary("and", shifted, _i(ctx, _MANTISSA, bits))
    subnormal = e.compare(biased, _i(ctx, 0, bits), "EQ")
    exponent = e.select(subnormal, sub_exp, normal_exp)
    frac_out = e.select(subnormal, sub_frac, frac)
    mantissa = e.bitcast_convert(e.binary("or", e.binary("or", sign, half), frac_out), x.dtype)
    # +-0, +-inf and NaN: the input itself and exponent 0
    special = e.binary(
        "or",
        e.compare(e.binary("or", biased, frac), _i(ctx, 0, bits), "EQ"),
        e.compare(biased, _i(ctx, 0xFF, bits), "EQ"),
    )
    mantissa = e.select(special, x, mantissa)
    exponent = e.select(special, _i(ctx, 0, bits), exponent)
    return mantissa, e.convert(exponent, ctx.out_type(1).dtype)
