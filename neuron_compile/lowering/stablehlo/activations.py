"""Activation functions: relu, gelu (exact and tanh), silu, elu (selu/celu use it), leaky_relu,
hardtanh. Their backward ops, and hardswish/hardsigmoid/mish/softplus, reach the backend already
decomposed into elementwise ops.

Low-precision inputs compute in float32 and round once (``float_unary``), as eager's opmath does.
"""

from __future__ import annotations

import math

import torch

from ..context import LoweringContext
from ..emit import Value
from ..registry import lowering
from ..rules import any_dtype, float_unary, unary_formula
from .elementwise import erf

aten = torch.ops.aten


@lowering(aten.relu.default, supports=any_dtype)
def _lower_relu(ctx: LoweringContext, x: Value) -> Value:
    return ctx.emit.binary("maximum", x, ctx.full_like(0, x))


@lowering(aten.gelu.default, supports=any_dtype)
def _lower_gelu(ctx: LoweringContext, x: Value, approximate: str = "none") -> Value:
    e = ctx.emit

    def body(v: Value) -> Value:
        half = e.binary("multiply", v, ctx.full_like(0.5, v))
        if approximate == "tanh":
            cube = e.binary("multiply", e.binary("multiply", v, v), v)
            inner = e.binary("add", v, e.binary("multiply", cube, ctx.full_like(0.044715, v)))
            inner = e.binary("multiply", inner, ctx.full_like(math.sqrt(2.0 / math.pi), v))
            t = e.unary("tanh", inner)
        else:
            t = erf(ctx, e.binary("multiply", v, ctx.full_like(1.0 / math.sqrt(2.0), v)))
        return e.binary("multiply", half, e.binary("add", t, ctx.full_like(1.0, v)))

    return float_unary(ctx, x, body)


unary_formula(aten.silu.default, lambda o, x: o.mul(x, o.logistic(x)))


@lowering(aten.elu.default, supports=any_dtype)
def _lower_elu(
    ctx: LoweringContext, x: Value, alpha: float = 1.0, scale: float = 1.0, input_scale: float = 1.0
) -> Value:
    """``scale * (x if x > 0 else alpha * expm1(x * input_scale))`` (selu and celu use it too)."""
    e = ctx.emit

    def body(v: Value) -> Value:
        neg = e.unary(
            "exponential_minus_one", e.binary("multiply", v, ctx.full_like(input_scale, v))
        )
        neg = e.binary("multiply", neg, ctx.full_like(alpha, v))
        y = e.select(e.compare(v, ctx.full_like(0, v), "GT"), v, neg)
        return y if scale == 1 else e.binary("multiply", y, ctx.full_like(scale, v))

    return float_unary(ctx, x, body)


@lowering(aten.leaky_relu.default, supports=any_dtype)
def _lower_leaky_relu(ctx: LoweringContext, x: Value, negative_slope: float = 0.01) -> Value:
    """bf16/f16 multiply in float32 by the float32 slope and round once, as eager's kernel does
    (a bf16 product with the slope rounded to bf16 differs in about a quarter of elements)."""
    e = ctx.emit

    def body(v: Value) -> Value:
        scaled = e.binary("multiply", v, ctx.full_like(negative_slope, v))
        return e.select(e.compare(v, ctx.full_like(0, v), "GT"), v, scaled)

    return float_unary(ctx, x, body)


@lowering(aten.hardtanh.default, supports=any_dtype)
def _lower_hardtanh(
    ctx: LoweringContext, x: Value, min_val: float = -1.0, max_val: float = 1.0
) -> Value:
    e = ctx.emit
    (x,) = ctx.promote(x, dtype=ctx.out_dtype)
    lo, hi = ctx.full_like(min_val, x), ctx.full_like(max_val, x)
    return e.binary("minimum", e.binary("maximum", x, lo), hi)
