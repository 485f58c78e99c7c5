"""Trigonometric, hyperbolic and other transcendental functions StableHLO has no op for.

StableHLO itself has only ``tan``, ``atan2``, ``exponential``, ``log`` and friends; the inverse
trigonometric and hyperbolic functions are CHLO ops, which the emitter does not produce (pure
``stablehlo`` keeps portable serialization and neuronx-cc input simple). Each one is written with
the numerically careful identities XLA's CHLO legalization uses (``log1p``/``expm1`` near zero,
scaled forms for large arguments), computed in float32 for low-precision inputs and rounded once.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..context import LoweringContext
from ..emit import Value
from ..registry import ALL_DTYPES, dtypes_in, lowering
from .elementwise import _float_unary

aten = torch.ops.aten
float_result = dtypes_in(*ALL_DTYPES)
_LN2 = math.log(2.0)


class _Ops:
    """Scalar-broadcasting arithmetic shorthand over one emitter (keeps formulas readable)."""

    def __init__(self, ctx: LoweringContext, like: Value) -> None:
        self.ctx, self.e, self.like = ctx, ctx.emit, like

    def c(self, value: float) -> Value:
        return self.ctx.full_like(value, self.like)

    def add(self, a: Value, b: Value | float) -> Value:
        return self.e.binary("add", a, b if isinstance(b, Value) else self.c(b))

    def sub(self, a: Value | float, b: Value | float) -> Value:
        a = a if isinstance(a, Value) else self.c(a)
        return self.e.binary("subtract", a, b if isinstance(b, Value) else self.c(b))

    def mul(self, a: Value, b: Value | float) -> Value:
        return self.e.binary("multiply", a, b if isinstance(b, Value) else self.c(b))

    def div(self, a: Value | float, b: Value) -> Value:
        return self.e.binary("divide", a if isinstance(a, Value) else self.c(a), b)

    def lt(self, a: Value, b: float) -> Value:
        return self.e.compare(a, self.c(b), "LT")

    def __getattr__(self, hlo: str) -> Callable[[Value], Value]:
        # o.sqrt(x), o.log(x), o.abs(x), o.log_plus_one(x), ...: unary StableHLO ops.
        return lambda x: self.e.unary(hlo, x)


def _register(op, fn: Callable[[_Ops, Value], Value]) -> None:
    @lowering(op, supports=float_result)
    def _lower(ctx: LoweringContext, x: Value) -> Value:
        return _float_unary(ctx, x, lambda v: fn(_Ops(ctx, v), v))

    _lower.__name__ = _lower.__qualname__ = f"_lower_{op.__name__.split('.')[0]}"


def _one_minus_x_squared(o: _Ops, x: Value) -> Value:
    return o.mul(o.sub(1.0, x), o.add(x, 1.0))  # (1 - x)(1 + x): no cancellation near |x| = 1


def _atan2(o: _Ops, y: Value, x: Value) -> Value:
    return o.e.binary("atan2", y, x)


def _sinh(o: _Ops, x: Value) -> Value:
    # Small |x|: expm1 avoids cancellation. Otherwise e^(|x| - ln 2) - e^(-|x| - ln 2), which
    # stays finite as long as sinh itself does.
    a = o.abs(x)
    small = o.mul(o.sub(o.exponential_minus_one(x), o.exponential_minus_one(o.negate(x))), 0.5)
    large = o.sub(o.exponential(o.sub(a, _LN2)), o.exponential(o.sub(o.negate(a), _LN2)))
    large = o.e.select(o.lt(x, 0.0), o.negate(large), large)
    return o.e.select(o.lt(a, 1.0), small, large)


def _cosh(o: _Ops, x: Value) -> Value:
    a = o.abs(x)
    return o.add(o.exponential(o.sub(a, _LN2)), o.exponential(o.sub(o.negate(a), _LN2)))


def _asinh(o: _Ops, x: Value) -> Value:
    # sign(x) * log1p(|x| + x^2 / (1 + sqrt(1 + x^2))); log(2|x|) once x^2 would overflow.
    a = o.abs(x)
    a2 = o.mul(a, a)
    moderate = o.log_plus_one(o.add(a, o.div(a2, o.add(o.sqrt(o.add(a2, 1.0)), 1.0))))
    huge = o.add(o.log(a), _LN2)
    y = o.e.select(o.lt(a, 1e18), moderate, huge)
    return o.e.select(o.lt(x, 0.0), o.negate(y), y)


def _acosh(o: _Ops, x: Value) -> Value:
    # log1p((x - 1) + sqrt((x - 1)(x + 1))) is exact near 1; log(2x) once x^2 would overflow.
    # x < 1 gives sqrt(negative) = NaN, as eager does.
    xm1 = o.sub(x, 1.0)
    moderate = o.log_plus_one(o.add(xm1, o.sqrt(o.mul(xm1, o.add(x, 1.0)))))
    return o.e.select(o.lt(x, 1e18), moderate, o.add(o.log(x), _LN2))


def _atanh(o: _Ops, x: Value) -> Value:
    return o.mul(o.log_plus_one(o.div(o.mul(x, 2.0), o.sub(1.0, x))), 0.5)


# Giles' single-precision erfinv approximation, as in XLA's ErfInv32 (xla/hlo/builder/lib/math.cc).
_ERFINV_SMALL = (
    2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
    -0.00125372503, -0.00417768164, 0.246640727, 1.50140941,
)  # fmt: skip
_ERFINV_LARGE = (
    -0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
    -0.0076224613, 0.00943887047, 1.00167406, 2.83297682,
)  # fmt: skip


def _erfinv(o: _Ops, x: Value) -> Value:
    e = o.e
    w = o.negate(o.log_plus_one(o.negate(o.mul(x, x))))
    small = o.lt(w, 5.0)
    w = e.select(small, o.sub(w, 2.5), o.sub(o.sqrt(w), 3.0))
    p = e.select(small, o.c(_ERFINV_SMALL[0]), o.c(_ERFINV_LARGE[0]))
    for lo, hi in zip(_ERFINV_SMALL[1:], _ERFINV_LARGE[1:], strict=True):
        p = o.add(o.mul(p, w), e.select(small, o.c(lo), o.c(hi)))
    at_pole = e.compare(o.abs(x), o.c(1.0), "EQ")  # erfinv(+-1) = +-inf
    return e.select(at_pole, o.mul(x, math.inf), o.mul(p, x))


_register(aten.tan.default, lambda o, x: o.tan(x))
_register(aten.atan.default, lambda o, x: _atan2(o, x, o.c(1.0)))
_register(aten.asin.default, lambda o, x: _atan2(o, x, o.sqrt(_one_minus_x_squared(o, x))))
_register(aten.acos.default, lambda o, x: _atan2(o, o.sqrt(_one_minus_x_squared(o, x)), x))
_register(aten.sinh.default, _sinh)
_register(aten.cosh.default, _cosh)
_register(aten.asinh.default, _asinh)
_register(aten.acosh.default, _acosh)
_register(aten.atanh.default, _atanh)
_register(aten.log2.default, lambda o, x: o.mul(o.log(x), 1.0 / _LN2))
_register(aten.log10.default, lambda o, x: o.mul(o.log(x), 1.0 / math.log(10.0)))
_register(aten.exp2.default, lambda o, x: o.e.binary("power", o.c(2.0), x))
_register(aten.erfinv.default, _erfinv)


# ---- binary ---------------------------------------------------------------------------------
def _float_binary(ctx: LoweringContext, a, b, fn: Callable[[_Ops, Value, Value], Value]) -> Value:
    out = ctx.out_dtype
    a, b = ctx.promote(a, b, dtype=ctx.compute_dtype(out))
    return ctx.emit.convert(fn(_Ops(ctx, a), a, b), out)


@lowering(aten.atan2.default, supports=float_result)
def _lower_atan2(ctx: LoweringContext, a, b) -> Value:
    return _float_binary(ctx, a, b, _atan2)


def _hypot(o: _Ops, a: Value, b: Value) -> Value:
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


@lowering(aten.hypot.default, supports=float_result)
def _lower_hypot(ctx: LoweringContext, a: Value, b: Value) -> Value:
    return _float_binary(ctx, a, b, _hypot)
