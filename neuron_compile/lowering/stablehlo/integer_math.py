"""Integer number theory: ``gcd`` and ``lcm``.

Eager's kernels (``aten/src/ATen/native/Math.h`` ``calc_gcd``/``calc_lcm``) run Euclid's algorithm
on ``|a|`` and ``|b|``: ``while a != 0: a, b = b % a, a``, returning ``b``; ``lcm`` is
``abs(a / gcd * b)``, 0 when the gcd is 0. Here Euclid is one ``stablehlo.while`` over the whole
tensor that runs until every element's ``a`` is 0 (at most ~47 steps for 32-bit values); finished
elements keep their values and never divide by zero.

Sign and wrap-around conventions follow eager's C++: ``abs`` of the most negative value stays
negative (two's complement wrap), ``%`` truncates like C's. C++ promotes 8- and 16-bit operands to
``int`` before arithmetic, so ``lcm`` on those dtypes computes ``abs(a / g * b)`` in int32 and
truncates the result to the narrow dtype once, as eager's implicit conversion does.
"""

from __future__ import annotations

import torch

from ..context import LoweringContext
from ..emit import Value
from ..registry import lowering
from ..rules import INTS, dtypes_in

aten = torch.ops.aten


def _was_int64(ctx: LoweringContext) -> bool:
    val = ctx.node.meta.get("val")
    return isinstance(val, torch.Tensor) and val.dtype == torch.int64


def _magnitudes(ctx: LoweringContext, a: Value, b: Value) -> tuple[Value, Value]:
    """``abs`` of both operands as eager takes them. int64 narrowed to int32 takes the
    magnitudes as uint32, so that ``|-2**31|`` is 2**31 as in eager's int64 arithmetic (an
    int32 ``abs`` would wrap it, which is right only for real int32 operands)."""
    e = ctx.emit
    if a.dtype == torch.uint8:  # abs is the identity on unsigned values
        return a, b
    a, b = e.unary("abs", a), e.unary("abs", b)
    if _was_int64(ctx):
        a, b = e.bitcast_convert(a, torch.uint32), e.bitcast_convert(b, torch.uint32)
    return a, b


def _gcd(ctx: LoweringContext, a: Value, b: Value) -> Value:
    """Element-wise ``calc_gcd`` of ``|a|`` and ``|b|`` (same type and shape)."""
    e = ctx.emit
    zero = ctx.full_like(0, a)
    one = ctx.full_like(1, a)

    def cond(x: Value, y: Value) -> list[Value]:
        return [e.reduce_simple(e.compare(x, zero, "NE"), False, list(range(x.rank)), "or")]

    def body(x: Value, y: Value) -> list[Value]:
        live = e.compare(x, zero, "NE")
        # x == 0 elements are finished: divide them by 1 so the remainder is well defined.
        r = e.binary("remainder", y, e.select(live, x, one))
        return [e.select(live, r, zero), e.select(live, x, y)]

    return e.while_([a, b], cond, body)[1]


def _from_magnitude(ctx: LoweringContext, g: Value) -> Value:
    """A gcd computed on uint32 magnitudes back as the int32 result (2**31 wraps, as any int64
    result beyond int32 does under the 64-bit policy)."""
    return ctx.emit.bitcast_convert(g, torch.int32) if g.dtype == torch.uint32 else g


def _operands(ctx: LoweringContext, a: Value | int, b: Value | int) -> tuple[Value, Value]:
    (a, b) = ctx.promote(a, b, dtype=ctx.out_dtype)
    return a, b


@lowering(aten.gcd.default, supports=dtypes_in(*INTS))
def _lower_gcd(ctx: LoweringContext, a: Value, b: Value) -> Value:
    a, b = _operands(ctx, a, b)
    g = _gcd(ctx, *_magnitudes(ctx, a, b))
    return _from_magnitude(ctx, g)


@lowering(aten.lcm.default, supports=dtypes_in(*INTS))
def _lower_lcm(ctx: LoweringContext, a: Value, b: Value) -> Value:
    e = ctx.emit
    out = ctx.out_dtype
    a, b = _operands(ctx, a, b)
    g = _from_magnitude(ctx, _gcd(ctx, *_magnitudes(ctx, a, b)))
    if out != torch.int32:
        # C++ integer promotion: the arithmetic below happens in int, truncated once at the end.
        a, b, g = (e.convert(v, torch.int32) for v in (a, b, g))
    zero = ctx.full_like(0, g)
    is_zero = e.compare(g, zero, "EQ")
    safe_g = e.select(is_zero, ctx.full_like(1, g), g)
    lcm = e.unary("abs", e.binary("multiply", e.binary("divide", a, safe_g), b))
    return e.convert(e.select(is_zero, zero, lcm), out)
