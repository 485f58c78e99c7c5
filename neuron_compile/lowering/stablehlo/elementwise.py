"""Elementwise ops: arithmetic, comparisons, logic, casts (activations live in ``activations.py``).

Transcendental functions on bfloat16/float16 compute in float32 and round once at the end, as
eager PyTorch's "opmath" does; otherwise bf16 results drift from eager by more than bf16 tolerance.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.fx as fx
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as Kind

from ..context import LoweringContext
from ..emit import Value, is_unsigned
from ..registry import lowering
from ..rules import (
    INTS,
    any_dtype,
    arith,
    binary,
    compare,
    dtypes_in,
    exact_divide,
    float_unary,
    polynomial,
    unary,
    unary_formula,
)

aten = torch.ops.aten

# ---- unary float functions with a direct StableHLO op: computed in float32, rounded once -----
unary(aten.exp, "exponential", opmath=True)
unary(aten.log, "log", opmath=True)
unary(aten.tanh, "tanh", opmath=True)
unary(aten.sigmoid, "logistic", opmath=True)
unary(aten.sqrt, "sqrt", opmath=True)
unary(aten.rsqrt, "rsqrt", opmath=True)
unary(aten.sin, "sine", opmath=True)
unary(aten.cos, "cosine", opmath=True)
unary(aten.log1p, "log_plus_one", opmath=True)
unary(aten.expm1, "exponential_minus_one", opmath=True)

# ---- unary ops that keep their dtype (integer rounding is the identity) ----------------------
unary(aten.neg, "negate")
unary(aten.abs, "abs")
unary(aten.floor, "floor")
unary(aten.ceil, "ceil")
unary(aten.round, "round_nearest_even")


@lowering(aten.sign.default, supports=any_dtype)
def _lower_sign(ctx: LoweringContext, x: Value) -> Value:
    """``(x > 0) - (x < 0)``: like eager, sign(NaN) is 0 and sign(-0.0) is +0 (stablehlo.sign
    would return NaN and -0.0)."""
    e = ctx.emit
    if x.dtype == torch.bool:
        return x
    zero = ctx.full_like(0, x)
    pos = e.convert(e.compare(x, zero, "GT"), x.dtype)
    if is_unsigned(x.dtype):
        return pos
    return e.binary("subtract", pos, e.convert(e.compare(x, zero, "LT"), x.dtype))


@lowering(aten.trunc.default, supports=any_dtype)
def _lower_trunc(ctx: LoweringContext, x: Value) -> Value:
    if not x.dtype.is_floating_point:
        return x
    e = ctx.emit
    negative = e.compare(x, ctx.full_like(0, x), "LT")
    return e.select(negative, e.unary("ceil", x), e.unary("floor", x))


unary_formula(aten.reciprocal.default, lambda o, x: o.div(1.0, x))


# XLA's f32 rational approximation of erf (xla/hlo/builder/lib/math.cc, ErfImpl32): StableHLO has
# no erf op, and neuronx-cc lowers this polynomial form efficiently.
_ERF_ALPHA = (
    -2.72614225801306e-10,
    2.77068142495902e-08,
    -2.10102402082508e-06,
    -5.69250639462346e-05,
    -7.34990630326855e-04,
    -2.95459980854025e-03,
    -1.60960333262415e-02,
)
_ERF_BETA = (
    -1.45660718464996e-05,
    -2.13374055278905e-04,
    -1.68282697438203e-03,
    -7.37332916720468e-03,
    -1.42647390514189e-02,
)


def erf(ctx: LoweringContext, x: Value) -> Value:
    """erf for float32 ``x`` (shared with gelu)."""
    e = ctx.emit
    x = e.clamp(e.scalar(-4.0, x.dtype), x, e.scalar(4.0, x.dtype))
    x2 = e.binary("multiply", x, x)
    num = e.binary("multiply", x, polynomial(ctx, x2, _ERF_ALPHA))
    return e.binary("divide", num, polynomial(ctx, x2, _ERF_BETA))


unary_formula(aten.erf.default, lambda o, x: erf(o.ctx, x))


# Cephes' f32 erfc for |x| > 1 (XLA's ErfcImpl32): erfc(x) = exp(-x^2) / |x| * P(1 / x^2), with one
# polynomial for |x| < 2 and another beyond. 1 - erf(x) would lose all relative precision there.
ERFC_P = (
    +2.326819970068386e-2, -1.387039388740657e-1, +3.687424674597105e-1, -5.824733027278666e-1,
    +6.210004621745983e-1, -4.944515323274145e-1, +3.404879937665872e-1, -2.741127028184656e-1,
    +5.638259427386472e-1,
)  # fmt: skip
ERFC_R = (
    -1.047766399936249e1, +1.297719955372516e1, -7.495518717768503e0, +2.921019019210786e0,
    -1.015265279202700e0, +4.218463358204948e-1, -2.820767439740514e-1, +5.641895067754075e-1,
)  # fmt: skip


def erfc(ctx: LoweringContext, x: Value) -> Value:
    """erfc for float32 ``x``: 1 - erf(x) for |x| <= 1, Cephes' tail approximation beyond."""
    e = ctx.emit
    a = e.unary("abs", x)
    z = e.unary("exponential", e.unary("negate", e.binary("multiply", x, x)))
    q = e.binary("divide", ctx.full_like(1.0, x), a)
    y = e.binary("multiply", q, q)
    near = e.compare(a, ctx.full_like(2.0, a), "LT")
    p = e.select(near, polynomial(ctx, y, ERFC_P), polynomial(ctx, y, ERFC_R))
    tail = e.binary("multiply", e.binary("multiply", z, q), p)  # exp underflows to 0 far out
    tail = e.select(
        e.compare(x, ctx.full_like(0, x), "LT"),
        e.binary("subtract", ctx.full_like(2.0, x), tail),
        tail,
    )
    small = e.binary("subtract", ctx.full_like(1.0, x), erf(ctx, x))
    return e.select(e.compare(a, ctx.full_like(1.0, a), "GT"), tail, small)


unary_formula(aten.erfc.default, lambda o, x: erfc(o.ctx, x))


# ---- binary arithmetic ----------------------------------------------------------------------
def _scaled_sum(ctx: LoweringContext, hlo: str, a, b, alpha) -> Value:
    """``a + alpha * b`` (``hlo`` add or subtract) as eager's kernel computes it: the operands
    and ``alpha`` cast to their common dtype first (an int32 ``b`` or ``alpha=0.1`` beside a
    bfloat16 ``a`` is rounded to bfloat16), then the product and sum in the compute dtype."""
    if alpha is None or alpha == 1:
        return arith(ctx, hlo, a, b)
    a, b, factor = ctx.promote(a, b, alpha)
    scaled = ctx.emit.binary("multiply", b, factor)
    return ctx.emit.convert(ctx.emit.binary(hlo, a, scaled), ctx.out_dtype)


@lowering(aten.add.Tensor, aten.add.Scalar, supports=any_dtype)
def _lower_add(ctx: LoweringContext, a, b, alpha=None) -> Value:
    if ctx.out_dtype == torch.bool:
        return arith(ctx, "or", a, b)
    return _scaled_sum(ctx, "add", a, b, alpha)


@lowering(aten.sub.Tensor, aten.sub.Scalar, aten.rsub.Scalar, supports=any_dtype)
def _lower_sub(ctx: LoweringContext, a, b, alpha=None) -> Value:
    if ctx.node.target is aten.rsub.Scalar:  # other - alpha * self
        return _scaled_sum(ctx, "subtract", b, a, alpha)
    return _scaled_sum(ctx, "subtract", a, b, alpha)


@lowering(aten.mul.Tensor, aten.mul.Scalar, supports=any_dtype)
def _lower_mul(ctx: LoweringContext, a, b) -> Value:
    hlo = "and" if ctx.out_dtype == torch.bool else "multiply"
    return arith(ctx, hlo, a, b, opmath_scalars=True)


@lowering(aten.div.Tensor, aten.div.Scalar, supports=any_dtype)
def _lower_div(ctx: LoweringContext, a, b) -> Value:
    """Eager divides every element, also by a scalar divisor (``exact_divide``)."""
    a, b = ctx.promote(a, b, kind=Kind.INT_TO_FLOAT, opmath_scalars=True)
    return ctx.emit.convert(exact_divide(ctx, a, b), ctx.out_dtype)


@lowering(aten.div.Tensor_mode, aten.div.Scalar_mode, supports=any_dtype)
def _lower_div_mode(ctx: LoweringContext, a, b, rounding_mode=None) -> Value:
    e = ctx.emit
    if rounding_mode is None:
        return _lower_div(ctx, a, b)
    b_in = b
    # ints stay ints; bf16/f16 come back as their float32 opmath; a scalar divisor unrounded
    a, b = ctx.promote(a, b, opmath_scalars=True)
    if not a.dtype.is_floating_point:
        q = e.binary("divide", a, b)  # integer divide truncates
        if rounding_mode == "floor" and not is_unsigned(a.dtype):
            # One less when the signs differ and the division is inexact (eager's
            # div_floor_integer; exact for every int32, unlike a float32 detour).
            zero = ctx.full_like(0, a)
            inexact = e.compare(e.binary("remainder", a, b), zero, "NE")
            signs_differ = e.binary("xor", e.compare(a, zero, "LT"), e.compare(b, zero, "LT"))
            fix = e.binary("and", inexact, signs_differ)
            q = e.select(fix, e.binary("subtract", q, ctx.full_like(1, q)), q)
        return e.convert(q, ctx.out_dtype)

    # Floats: eager rounds a bf16/f16 quotient to its dtype before truncating or flooring it
    # (1076.66 -> 1080 -> 1080, not 1076). Compute in float32 with an explicit rounding step:
    # XLA would fold a bf16 -> f32 -> bf16 convert pair and skip that rounding. Except when the
    # divisor is one number broadcast over the whole result (a Python scalar, a 0-d or one-element
    # tensor): eager's kernel then takes the divisor's original value in float32 and computes
    # the whole quotient in float32 (BinaryOpsKernel.cpp, ``iter.is_scalar(2)``), so there is no
    # rounding step, and ``promote`` above already gave the divisor in float32 unrounded.
    scalar_divisor = not isinstance(b_in, Value) or math.prod(b_in.shape) == 1
    # XLA rewrites a division by a constant into a multiplication by its reciprocal, which is
    # off by an ulp often enough to move a quotient across an integer (x / -0.3 truncated):
    # the barrier hides the divisor's value from that rewrite.
    b = e.op1("optimization_barrier", [b], b.type)

    def rounded(v: Value) -> Value:
        return v if scalar_divisor else e.round_to_precision(v, ctx.out_dtype)

    if rounding_mode == "floor":
        q = _div_floor_float(ctx, a, b, rounded)
    else:  # trunc: round the quotient toward zero
        q = rounded(e.binary("divide", a, b))
        q = e.select(
            e.compare(q, ctx.full_like(0, q), "LT"), e.unary("ceil", q), e.unary("floor", q)
        )
    return e.convert(q, ctx.out_dtype)


def _div_floor_float(
    ctx: LoweringContext, a: Value, b: Value, rounded: Callable[[Value], Value]
) -> Value:
    """Eager's div_floor_floating (c10/util/generic_math.h): floor of ``(a - fmod(a, b)) / b``
    with a sign fix, which is exact where ``floor(a / b)`` can be off by one after rounding.
    ``rounded`` reproduces the low-precision rounding of each intermediate."""
    e = ctx.emit
    zero = ctx.full_like(0, a)
    mod = e.binary("remainder", a, b)
    div = rounded(e.binary("divide", rounded(e.binary("subtract", a, mod)), b))
    mod_sign_fix = e.binary(
        "and",
        e.compare(mod, zero, "NE"),
        e.binary("xor", e.compare(b, zero, "LT"), e.compare(mod, zero, "LT")),
    )
    div = e.select(mod_sign_fix, rounded(e.binary("subtract", div, ctx.full_like(1, div))), div)
    floordiv = e.unary("floor", div)
    round_up = e.compare(e.binary("subtract", div, floordiv), ctx.full_like(0.5, div), "GT")
    floordiv = e.select(round_up, e.binary("add", floordiv, ctx.full_like(1, div)), floordiv)
    # div == 0: a signed zero with the sign of a / b; b == 0: the IEEE quotient.
    quotient = rounded(e.binary("divide", a, b))
    signed_zero = e.binary("multiply", zero, quotient)
    floordiv = e.select(e.compare(div, zero, "EQ"), signed_zero, floordiv)
    return e.select(e.compare(b, zero, "EQ"), quotient, floordiv)


#: Result dtypes whose eager ``pow(x, ±0.5)`` is ``sqrt``/``rsqrt``, ``pow(x, -1)`` is ``1 / x``,
#: and ``pow(x, 3)`` and ``pow(x, -2)`` are ``x * x * x`` and ``1 / (x * x)`` rounded after each
#: operation, not ``pow`` (ATen's PowKernel.cpp).
_EAGER_POWERS = (torch.float32, torch.float64, torch.bfloat16)


def _pow_support(node: fx.Node) -> str | None:
    why = any_dtype(node)
    if why or node.target is not aten.pow.Tensor_Scalar:
        return why
    base, exp = node.args[0].meta.get("val"), node.args[1]
    integral = isinstance(base, torch.Tensor) and not (
        base.is_floating_point() or base.is_complex()
    )
    if integral and type(exp) is int and exp < 0:  # eager raises; run eagerly, it raises the same
        return "integers to negative integer powers are not allowed (eager raises)"
    return None


@lowering(aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, aten.pow.Scalar, supports=_pow_support)
def _lower_pow(ctx: LoweringContext, a, b) -> Value:
    e, out = ctx.emit, ctx.out_dtype
    scalar_exp = ctx.node.target is aten.pow.Tensor_Scalar
    if scalar_exp and b in (0, 1):  # eager fills ones or copies, for every dtype
        return e.full(1, ctx.out_shape, out) if b == 0 else ctx.promote(a, dtype=out)[0]
    if scalar_exp and (b == 2 or (b in (3, -1, -2) and out in _EAGER_POWERS)):
        # Eager's own products and quotient, so its bits: its pow(x, 3.0) is x * x * x rounded
        # twice, not the cube rounded once. XLA would call libm's powf for every element.
        (a,) = ctx.promote(a, dtype=out)
        if b == -1:
            return e.binary("divide", ctx.full_like(1, a), a)
        square = e.binary("multiply", a, a)
        if b == 3:
            return e.binary("multiply", square, a)
        return square if b == 2 else e.binary("divide", ctx.full_like(1, square), square)
    if scalar_exp and b in (0.5, -0.5) and out in _EAGER_POWERS:
        # Eager's kernel takes these as sqrt and 1 / sqrt: pow(-inf, 0.5) is NaN, pow(-0.0, 0.5)
        # -0.0, where IEEE pow gives inf and +0.0 (float16 keeps pow, as eager's kernel does).
        # exact_divide: XLA would turn 1 / sqrt into its rsqrt, an ulp off eager's.
        def root(x: Value) -> Value:
            sqrt = ctx.emit.unary("sqrt", x)
            return sqrt if b == 0.5 else exact_divide(ctx, ctx.full_like(1.0, sqrt), sqrt)

        return float_unary(ctx, a, root)
    if out.is_floating_point or out.is_complex or out == torch.bool:
        return arith(ctx, "power", a, b)
    return _integer_power(ctx, *ctx.promote(a, b, dtype=out))


def _integer_power(ctx: LoweringContext, base: Value, exp: Value) -> Value:
    """``base ** exp`` on integers, wrapping like eager, by square-and-multiply over every bit of
    the exponent. Not ``stablehlo.power``: XLA CPU's integer power squares only six times (it
    assumes an exponent >= 64 overflows, but eager wraps: 3 ** 64 is 1 in uint8, 0 ** 64 is 0),
    reads an unsigned exponent as signed, and its two code generators disagree on negative
    exponents. A constant exponent folds to its multiplications in XLA.

    Negative exponents follow ATen's ``powi``: 1 for base 1, -1 or 1 by the exponent's parity
    for base -1, 0 otherwise."""
    e = ctx.emit
    one, zero = ctx.full_like(1, base), ctx.full_like(0, base)
    bits = exp.dtype.itemsize * 8 - exp.dtype.is_signed  # a negative exponent is handled below
    result, square = one, base
    for bit in range(bits):
        set_ = e.compare(e.binary("and", exp, ctx.full_like(1 << bit, exp)), zero, "NE")
        result = e.select(set_, e.binary("multiply", result, square), result)
        if bit + 1 < bits:
            square = e.binary("multiply", square, square)
    if not exp.dtype.is_signed:
        return result
    minus_one = ctx.full_like(-1, base)
    odd = e.compare(e.binary("and", exp, one), zero, "NE")
    negative = e.select(
        e.compare(base, one, "EQ"),
        one,
        e.select(e.compare(base, minus_one, "EQ"), e.select(odd, minus_one, one), zero),
    )
    return e.select(e.compare(exp, zero, "LT"), negative, result)


binary(aten.maximum, "maximum", overloads=("default",))
binary(aten.minimum, "minimum", overloads=("default",))


@lowering(aten.clamp.default, aten.clamp.Tensor, supports=any_dtype)
def _lower_clamp(ctx: LoweringContext, x, min=None, max=None) -> Value:  # noqa: A002
    e = ctx.emit
    # A tensor bound may be larger than x (clamp broadcasts all three): work in the out shape.
    x = ctx.broadcast_to(ctx.promote(x, dtype=ctx.out_dtype)[0], ctx.out_shape)
    if min is not None:
        (lo,) = (
            ctx.promote(min, dtype=x.dtype) if isinstance(min, Value) else [ctx.full_like(min, x)]
        )
        x = e.binary("maximum", x, ctx.broadcast_to(lo, x.shape))
    if max is not None:
        (hi,) = (
            ctx.promote(max, dtype=x.dtype) if isinstance(max, Value) else [ctx.full_like(max, x)]
        )
        x = e.binary("minimum", x, ctx.broadcast_to(hi, x.shape))
    return x


# ---- comparisons and logic ------------------------------------------------------------------
compare(aten.eq, "EQ")
compare(aten.ne, "NE")
compare(aten.lt, "LT")
compare(aten.le, "LE")
compare(aten.gt, "GT")
compare(aten.ge, "GE")

binary(aten.logical_and, "and", overloads=("default",), logical=True)
binary(aten.logical_or, "or", overloads=("default",), logical=True)
binary(aten.logical_xor, "xor", overloads=("default",), logical=True)
binary(aten.bitwise_and, "and")
binary(aten.bitwise_or, "or")
binary(aten.bitwise_xor, "xor")


@lowering(aten.logical_not.default, aten.bitwise_not.default, supports=any_dtype)
def _lower_not(ctx: LoweringContext, x: Value) -> Value:
    (x,) = ctx.promote(x, dtype=ctx.out_dtype)
    return ctx.emit.unary("not", x)


@lowering(aten.isnan.default, supports=any_dtype)
def _lower_isnan(ctx: LoweringContext, x: Value) -> Value:
    return ctx.emit.compare(x, x, "NE")


@lowering(aten.where.self, supports=any_dtype)
def _lower_where(ctx: LoweringContext, cond: Value, a, b) -> Value:
    a, b = ctx.promote(a, b, dtype=ctx.out_dtype)
    shape = ctx.out_shape
    cond = ctx.broadcast_to(ctx.emit.convert(cond, torch.bool), shape)
    return ctx.emit.select(cond, ctx.broadcast_to(a, shape), ctx.broadcast_to(b, shape))


# ---- casts and constants --------------------------------------------------------------------
@lowering(aten._to_copy.default, supports=any_dtype)
def _lower_to_copy(ctx: LoweringContext, x: Value | bool | int | float, **_: object) -> Value:
    if not isinstance(x, Value):
        # A Python number: torch.func's decompositions (vmap of a loss's mean) pass one. As
        # ``torch.tensor(x)`` it has its own dtype first (bool, int64 run as int32, float32).
        own = torch.bool if isinstance(x, bool) else torch.int32 if isinstance(x, int) else None
        x = ctx.emit.scalar(x, own or torch.float32)
    return ctx.emit.convert(x, ctx.out_dtype)  # float -> narrow int wraps as eager's (emit.py)


@lowering(aten.scalar_tensor.default, supports=any_dtype)
def _lower_scalar_tensor(ctx: LoweringContext, value, **_: object) -> Value:
    return ctx.emit.scalar(value, ctx.out_dtype)


# ---- float classification and sign bits ------------------------------------------------------
@lowering(aten.isinf.default, supports=any_dtype)
def _lower_isinf(ctx: LoweringContext, x: Value) -> Value:
    if not x.dtype.is_floating_point:
        return ctx.emit.full(False, x.shape, torch.bool)
    return ctx.emit.compare(ctx.emit.unary("abs", x), ctx.full_like(math.inf, x), "EQ")


_SAME_WIDTH_INT = {
    torch.float32: torch.int32,
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
}


def signbit(ctx: LoweringContext, x: Value) -> Value:
    """True where the sign bit is set (-0.0 and negative NaNs included), as C's ``signbit``."""
    e = ctx.emit
    if is_unsigned(x.dtype):
        return ctx.emit.full(False, x.shape, torch.bool)
    if x.dtype.is_floating_point:
        x = e.bitcast_convert(x, _SAME_WIDTH_INT[x.dtype])
    return e.compare(x, ctx.full_like(0, x), "LT")


@lowering(aten.signbit.default, supports=any_dtype)
def _lower_signbit(ctx: LoweringContext, x: Value) -> Value:
    return signbit(ctx, x)


@lowering(aten.copysign.Tensor, aten.copysign.Scalar, supports=any_dtype)
def _lower_copysign(ctx: LoweringContext, a, b) -> Value:
    e = ctx.emit
    a, b = ctx.promote(a, b, dtype=ctx.out_dtype)
    magnitude = e.unary("abs", a)
    return e.select(signbit(ctx, b), e.unary("negate", magnitude), magnitude)


@lowering(aten.fmax.default, aten.fmin.default, supports=any_dtype)
def _lower_fmax_fmin(ctx: LoweringContext, a: Value, b: Value) -> Value:
    """maximum/minimum that ignore a NaN operand (NaN only when both are NaN)."""
    e = ctx.emit
    a, b = ctx.promote(a, b, dtype=ctx.out_dtype)
    out = e.binary("maximum" if ctx.node.target is aten.fmax.default else "minimum", a, b)
    if not a.dtype.is_floating_point:
        return out
    return e.select(e.compare(a, a, "NE"), b, e.select(e.compare(b, b, "NE"), a, out))


# ---- modular arithmetic and shifts -----------------------------------------------------------
def _fmod(ctx: LoweringContext, a: Value, b: Value) -> Value:
    """C ``fmod`` (result has the dividend's sign): stablehlo.remainder; low-precision floats
    go through float32, where the result is exact and rounds back exactly."""
    e = ctx.emit
    compute = ctx.compute_dtype(a.dtype)
    r = e.binary("remainder", e.convert(a, compute), e.convert(b, compute))
    return e.convert(r, a.dtype)


@lowering(aten.fmod.Tensor, aten.fmod.Scalar, supports=any_dtype)
def _lower_fmod(ctx: LoweringContext, a, b) -> Value:
    a, b = ctx.promote(a, b, dtype=ctx.out_dtype)
    return _fmod(ctx, a, b)


@lowering(
    aten.remainder.Tensor,
    aten.remainder.Scalar,
    aten.remainder.Scalar_Tensor,
    supports=any_dtype,
)
def _lower_remainder(ctx: LoweringContext, a, b) -> Value:
    """Python's ``%`` (result has the divisor's sign), from fmod as eager's CPU kernel does."""
    e = ctx.emit
    a, b = ctx.promote(a, b, dtype=ctx.out_dtype)
    r = _fmod(ctx, a, b)
    if is_unsigned(r.dtype):
        return r
    zero = ctx.full_like(0, r)
    signs_differ = e.binary("xor", e.compare(r, zero, "LT"), e.compare(b, zero, "LT"))
    fix = e.binary("and", e.compare(r, zero, "NE"), signs_differ)
    return e.select(fix, e.binary("add", r, b), r)


@lowering(
    aten.__lshift__.Scalar,
    aten.__lshift__.Tensor,
    aten.bitwise_left_shift.Tensor,
    aten.bitwise_left_shift.Tensor_Scalar,
    aten.bitwise_left_shift.Scalar_Tensor,
    supports=dtypes_in(*INTS),
)
def _lower_left_shift(ctx: LoweringContext, a, b) -> Value:
    a, b = ctx.promote(a, b, dtype=ctx.out_dtype)
    return ctx.emit.binary("shift_left", a, b)


@lowering(
    aten.__rshift__.Scalar,
    aten.__rshift__.Tensor,
    aten.bitwise_right_shift.Tensor,
    aten.bitwise_right_shift.Tensor_Scalar,
    aten.bitwise_right_shift.Scalar_Tensor,
    supports=dtypes_in(*INTS),
)
def _lower_right_shift(ctx: LoweringContext, a, b) -> Value:
    a, b = ctx.promote(a, b, dtype=ctx.out_dtype)
    return right_shift(ctx, a, b)


def right_shift(ctx: LoweringContext, a: Value, b: Value) -> Value:
    """``a >> b`` for operands of one integer dtype: arithmetic for signed types, logical for
    unsigned (as C++ ``>>``). StableHLO fills with the sign (or zeros) for counts outside
    ``[0, bits)``, as eager does (the trn form in ``trainium/lowering_shifts.py`` relies on it)."""
    hlo = "shift_right_logical" if is_unsigned(a.dtype) else "shift_right_arithmetic"
    return ctx.emit.binary(hlo, a, b)


# ---- rounding to decimals, angle, ldexp -----------------------------------------------------
@lowering(aten.round.decimals, supports=any_dtype)
def _lower_round_decimals(ctx: LoweringContext, x: Value, *, decimals: int = 0) -> Value:
    """Eager's kernel: round-half-even of ``x * 10^d`` divided back (or ``x / 10^-d`` times back
    for negative ``d``), in opmath (float32 for bfloat16/float16), the division exact (XLA's
    reciprocal multiply was an ulp off in a quarter of float32 results)."""
    e = ctx.emit
    if decimals == 0:
        return e.unary("round_nearest_even", ctx.promote(x, dtype=ctx.out_dtype)[0])

    def body(x: Value) -> Value:
        scale = ctx.full_like(10.0 ** abs(decimals), x)
        if decimals > 0:
            return exact_divide(ctx, e.unary("round_nearest_even", e.binary("multiply", x, scale)),
                                scale)  # fmt: skip
        return e.binary("multiply", e.unary("round_nearest_even", exact_divide(ctx, x, scale)),
                        scale)  # fmt: skip

    return float_unary(ctx, x, body)


@lowering(aten.angle.default, supports=any_dtype)
def _lower_angle(ctx: LoweringContext, x: Value) -> Value:
    """Real input: pi for negatives, 0 otherwise, NaN stays NaN."""
    e = ctx.emit
    (x,) = ctx.promote(x, dtype=ctx.out_dtype)
    out = e.select(
        e.compare(x, ctx.full_like(0, x), "LT"), ctx.full_like(math.pi, x), ctx.full_like(0, x)
    )
    return e.select(e.compare(x, x, "NE"), x, out)


@lowering(aten.ldexp.Tensor, supports=any_dtype)
def _lower_ldexp(ctx: LoweringContext, x: Value, exponent: Value) -> Value:
    """``x * 2^exponent`` (as eager: a multiply by a float power of two)."""
    e = ctx.emit
    x, exponent = ctx.promote(x, exponent, dtype=ctx.compute_dtype(ctx.out_dtype))
    scaled = e.binary("multiply", x, e.binary("power", ctx.full_like(2.0, exponent), exponent))
    return e.convert(scaled, ctx.out_dtype)
