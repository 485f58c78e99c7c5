"""Trigonometric, hyperbolic and other transcendental functions StableHLO has no op for.

StableHLO itself has only ``tan``, ``atan2``, ``exponential``, ``log`` and friends; the inverse
trigonometric and hyperbolic functions are CHLO ops, which the emitter does not produce (pure
``stablehlo`` keeps portable serialization and neuronx-cc input simple). Each one is written with
the numerically careful identities XLA's CHLO legalization uses (``log1p``/``expm1`` near zero,
scaled forms for large arguments), computed in float32 for low-precision inputs and rounded once.
"""

from __future__ import annotations

import math

import torch

from ..emit import Value
from ..rules import Ops, binary_formula, one_minus_x_squared, unary_formula

aten = torch.ops.aten
_LN2 = math.log(2.0)


def _atan2(o: Ops, y: Value, x: Value) -> Value:
    return o.e.binary("atan2", y, x)


def _sinh(o: Ops, x: Value) -> Value:
    # Small |x|: expm1 avoids cancellation. Otherwise e^(|x| - ln 2) - e^(-|x| - ln 2), which
    # stays finite as long as sinh itself does.
    a = o.abs(x)
    small = o.mul(o.sub(o.exponential_minus_one(x), o.exponential_minus_one(o.negate(x))), 0.5)
    large = o.sub(o.exponential(o.sub(a, _LN2)), o.exponential(o.sub(o.negate(a), _LN2)))
    large = o.e.select(o.lt(x, 0.0), o.negate(large), large)
    return o.e.select(o.lt(a, 1.0), small, large)


def _cosh(o: Ops, x: Value) -> Value:
    a = o.abs(x)
    return o.add(o.exponential(o.sub(a, _LN2)), o.exponential(o.sub(o.negate(a), _LN2)))


def _asinh(o: Ops, x: Value) -> Value:
    # sign(x) * log1p(|x| + x^2 / (1 + sqrt(1 + x^2))); log(2|x|) once x^2 would overflow.
    a = o.abs(x)
    a2 = o.mul(a, a)
    moderate = o.log_plus_one(o.add(a, o.div(a2, o.add(o.sqrt(o.add(a2, 1.0)), 1.0))))
    huge = o.add(o.log(a), _LN2)
    y = o.e.select(o.lt(a, 1e18), moderate, huge)
    return o.e.select(o.lt(x, 0.0), o.negate(y), y)


def _acosh(o: Ops, x: Value) -> Value:
    # log1p((x - 1) + sqrt((x - 1)(x + 1))) is exact near 1; log(2x) once x^2 would overflow.
    # Outside the domain (x < 1) NaN, as eager: the formula is NaN only for -1 < x < 1 (below -1
    # the product is positive again: acosh(-1e10) was 0, acosh(-1e20) inf).
    xm1 = o.sub(x, 1.0)
    moderate = o.log_plus_one(o.add(xm1, o.sqrt(o.mul(xm1, o.add(x, 1.0)))))
    y = o.e.select(o.lt(x, 1e18), moderate, o.add(o.log(x), _LN2))
    return o.e.select(o.lt(x, 1.0), o.c(math.nan), y)


def _atanh(o: Ops, x: Value) -> Value:
    return o.mul(o.log_plus_one(o.div(o.mul(x, 2.0), o.sub(1.0, x))), 0.5)


# Giles' single-precision erfinv approximation, as in XLA's ErfInv32 (xla/hlo/builder/lib/math.cc).
ERFINV_SMALL = (
    2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
    -0.00125372503, -0.00417768164, 0.246640727, 1.50140941,
)  # fmt: skip
ERFINV_LARGE = (
    -0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
    -0.0076224613, 0.00943887047, 1.00167406, 2.83297682,
)  # fmt: skip


def _erfinv(o: Ops, x: Value) -> Value:
    e = o.e
    w = o.negate(o.log_plus_one(o.negate(o.mul(x, x))))
    small = o.lt(w, 5.0)
    w = e.select(small, o.sub(w, 2.5), o.sub(o.sqrt(w), 3.0))
    p = e.select(small, o.c(ERFINV_SMALL[0]), o.c(ERFINV_LARGE[0]))
    for lo, hi in zip(ERFINV_SMALL[1:], ERFINV_LARGE[1:], strict=True):
        p = o.add(o.mul(p, w), e.select(small, o.c(lo), o.c(hi)))
    at_pole = e.compare(o.abs(x), o.c(1.0), "EQ")  # erfinv(+-1) = +-inf
    return e.select(at_pole, o.mul(x, math.inf), o.mul(p, x))


unary_formula(aten.tan.default, lambda o, x: o.tan(x))
unary_formula(aten.atan.default, lambda o, x: _atan2(o, x, o.c(1.0)))
unary_formula(aten.asin.default, lambda o, x: _atan2(o, x, o.sqrt(one_minus_x_squared(o, x))))
unary_formula(aten.acos.default, lambda o, x: _atan2(o, o.sqrt(one_minus_x_squared(o, x)), x))
unary_formula(aten.sinh.default, _sinh)
unary_formula(aten.cosh.default, _cosh)
unary_formula(aten.asinh.default, _asinh)
unary_formula(aten.acosh.default, _acosh)
unary_formula(aten.atanh.default, _atanh)
unary_formula(aten.log2.default, lambda o, x: o.mul(o.log(x), 1.0 / _LN2))
unary_formula(aten.log10.default, lambda o, x: o.mul(o.log(x), 1.0 / math.log(10.0)))
unary_formula(aten.exp2.default, lambda o, x: o.e.binary("power", o.c(2.0), x))
unary_formula(aten.erfinv.default, _erfinv)


# ---- binary ---------------------------------------------------------------------------------
binary_formula(aten.atan2.default, _atan2)


def _hypot(o: Ops, a: Value, b: Value) -> Value:
    """``max * sqrt(1 + (min/max)^2)``: no overflow of the squares; inf if either is inf."""
    e = o.e
    a, b = o.abs(a), o.abs(b)
    hi, lo = e.binary("maximum", a, b), e.binary("minimum", a, b)
    r = o.div(lo, hi)
    y = o.mul(hi, o.sqrt(o.add(o.mul(r, r), 1.0)))
    y = e.select(e.compare(hi, o.c(0.0), "EQ"), o.c(0.0), y)
    # hypot(inf, NaN) is inf (C99); maximum(inf, NaN) would be NaN.
    either_inf = e.binary(
        "or", e.compare(a, o.c(math.inf), "EQ"), e.compare(b, o.c(math.inf), "EQ")
    )
    return e.select(either_inf, o.c(math.inf), y)


binary_formula(aten.hypot.default, _hypot)
