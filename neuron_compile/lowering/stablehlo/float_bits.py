"""Ops defined on a float's bit pattern: ``nextafter`` and ``frexp``.

Both work on the IEEE-754 bits as integers (``bitcast_convert``) and never multiply by powers
of two: XLA's CPU client may flush subnormals to zero in float arithmetic, while eager's results
(and inputs) include subnormals, which integer arithmetic on the bits keeps exact.
``nextafter`` steps the bits of the input's own width (bf16/f16 as int16, as c10's 16-bit
``nextafter`` does); ``frexp`` of a bf16/f16 value is the float32 one, exactly representable
in the input dtype (eager computes it on the value widened to float).
"""

from __future__ import annotations

import math

import torch

from ..context import LoweringContext
from ..emit import Value
from ..registry import lowering
from ..rules import dtypes_in

aten = torch.ops.aten
_I32 = torch.int32
_MANTISSA = 0x007FFFFF
_SIGN = -0x80000000  # 0x80000000 as int32


#: The integer type of a float's bits, and its sign bit as a value of that type.
_BITS = {torch.float32: (_I32, _SIGN), torch.bfloat16: (torch.int16, -0x8000)}
_BITS[torch.float16] = _BITS[torch.bfloat16]


def _i(ctx: LoweringContext, value: int, like: Value) -> Value:
    return ctx.emit.full(value, like.shape, like.dtype)


@lowering(aten.nextafter.default, supports=dtypes_in(*_BITS))
def _lower_nextafter(ctx: LoweringContext, x: Value, y: Value) -> Value:
    """The float after ``x`` towards ``y``: the bit pattern of a non-zero ``x`` moves by one
    (up in magnitude when heading away from zero); from +-0 it is the smallest subnormal with
    ``y``'s sign; ``y`` itself when equal, NaN when either is NaN (C99 ``nextafterf``).

    Comparisons run on the bits too: XLA's CPU client compares subnormals as zero."""
    e = ctx.emit
    x, y = ctx.promote(x, y, dtype=ctx.out_dtype)
    int_type, sign_bit = _BITS[x.dtype]
    bits, y_bits = e.bitcast_convert(x, int_type), e.bitcast_convert(y, int_type)
    zero = _i(ctx, 0, bits)
    x_key, y_key = _ordered(ctx, bits, sign_bit), _ordered(ctx, y_bits, sign_bit)
    # |next| > |x| when heading up from a positive x or down from a negative one
    away = e.binary("xor", e.compare(x_key, y_key, "LT"), e.compare(x_key, zero, "LT"))
    step = e.select(away, _i(ctx, 1, bits), _i(ctx, -1, bits))
    moved = e.bitcast_convert(e.binary("add", bits, step), x.dtype)
    y_sign = e.binary("and", y_bits, _i(ctx, sign_bit, bits))
    tiny = e.bitcast_convert(e.binary("or", y_sign, _i(ctx, 1, bits)), x.dtype)
    out = e.select(e.compare(x_key, zero, "EQ"), tiny, moved)
    out = e.select(e.compare(x_key, y_key, "EQ"), y, out)
    either_nan = e.binary("or", e.compare(x, x, "NE"), e.compare(y, y, "NE"))
    return e.select(either_nan, ctx.full_like(math.nan, x), out)


def _ordered(ctx: LoweringContext, bits: Value, sign_bit: int) -> Value:
    """An integer that orders as the float whose ``bits`` these are (NaN aside): the
    magnitude, negated for negative floats (so +0 and -0 are both 0)."""
    e = ctx.emit
    magnitude = e.binary("and", bits, _i(ctx, ~sign_bit, bits))
    negative = e.compare(bits, _i(ctx, 0, bits), "LT")
    return e.select(negative, e.unary("negate", magnitude), magnitude)


@lowering(aten.frexp.Tensor, supports=dtypes_in(*_BITS))
def _lower_frexp(ctx: LoweringContext, x: Value) -> tuple[Value, Value]:
    """(mantissa in +-[0.5, 1), int32 exponent) with x = mantissa * 2^exponent; zeros,
    infinities and NaN come back unchanged with exponent 0, as eager returns them."""
    e = ctx.emit
    narrow = x.dtype
    x = e.convert(x, torch.float32)  # exact; the mantissa fits ``narrow`` again
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
    return e.convert(mantissa, narrow), e.convert(exponent, ctx.out_type(1).dtype)
