"""Regularized incomplete gamma functions ``igamma`` (P) and ``igammac`` (Q = 1 - P).

Cephes' method as eager's CPU kernel (aten/src/ATen/native/Math.h ``calc_igamma``): the power
series for P when x <= max(a, 1), the continued fraction for Q otherwise, each times the prefactor
x^a e^-x / Gamma(a), with eager's edge cases (NaN for negative arguments, a = 0, infinities).
Each sum is one ``stablehlo.while`` that stops once every element met eager's own stopping test
(term <= eps * sum, or successive convergents agree to eps), at most 2000 steps like eager.
Eager's Temme asymptotic expansion for a ~ x > 20 is not reproduced: there the series and the
continued fraction still converge, to float32 accuracy, in a few dozen more steps.
"""

from __future__ import annotations

import math

import torch

from ..emit import Value
from ..rules import Ops, binary_formula
from .special import lgamma

aten = torch.ops.aten
_MACHEP = 5.9604644775390625e-8  # eager's float32 MACHEP
_BIG, _BIGINV = 16777216.0, 5.9604644775390625e-8
_MAXLOG = 88.72283905206835
_MAXITER = 2000


def _prefactor(o: Ops, a: Value, x: Value) -> Value:
    """x^a e^-x / Gamma(a), 0 once it underflows."""
    ax = o.sub(o.sub(o.mul(a, o.log(x)), x), lgamma(o, a))
    return o.e.select(o.lt(ax, -_MAXLOG), o.c(0.0), o.exponential(ax))


def _loop(o: Ops, live: Value, carry: list[Value], step) -> list[Value]:
    """Run ``step(carry) -> (carry', still_going)`` while any ``live`` element goes on; finished
    elements keep their values."""
    e = o.e
    dims = list(range(live.rank))

    def cond(i: Value, live: Value, *_: Value) -> list[Value]:
        more = e.compare(i, e.scalar(_MAXITER, torch.int32), "LT")
        return [e.binary("and", more, e.reduce_simple(live, False, dims, "or"))]

    def body(i: Value, live: Value, *carry: Value) -> list[Value]:
        new, going = step(*carry)
        kept = [e.select(live, n, c) for n, c in zip(new, carry, strict=True)]
        return [e.binary("add", i, e.scalar(1, torch.int32)), o.and_(live, going), *kept]

    return e.while_([e.scalar(0, torch.int32), live, *carry], cond, body)[2:]


def _series(o: Ops, a: Value, x: Value, live: Value) -> Value:
    """P(a, x) = prefactor / a * sum_n x^n / ((a + 1) ... (a + n))."""

    def step(r: Value, c: Value, ans: Value) -> tuple[list[Value], Value]:
        r = o.add(r, 1.0)
        c = o.mul(c, o.div(x, r))
        ans = o.add(ans, c)
        return [r, c, ans], o.e.compare(c, o.mul(ans, _MACHEP), "GT")

    _, _, ans = _loop(o, live, [a, o.c(1.0), o.c(1.0)], step)
    return o.div(o.mul(ans, _prefactor(o, a, x)), a)


def _continued_fraction(o: Ops, a: Value, x: Value, live: Value) -> Value:
    """Q(a, x) by Cephes' continued fraction (rescaled when the convergents grow large)."""
    e = o.e
    y = o.sub(1.0, a)
    z = o.add(o.add(x, y), 1.0)
    pkm1, qkm1 = o.add(x, 1.0), o.mul(z, x)

    def step(c, y, z, pkm2, pkm1, qkm2, qkm1, ans) -> tuple[list[Value], Value]:
        c, y, z = o.add(c, 1.0), o.add(y, 1.0), o.add(z, 2.0)
        yc = o.mul(y, c)
        pk = o.sub(o.mul(pkm1, z), o.mul(pkm2, yc))
        qk = o.sub(o.mul(qkm1, z), o.mul(qkm2, yc))
        nonzero = e.compare(qk, o.c(0.0), "NE")
        r = o.div(pk, e.select(nonzero, qk, o.c(1.0)))
        t = e.select(nonzero, o.abs(o.div(o.sub(ans, r), r)), o.c(1.0))
        ans = e.select(nonzero, r, ans)
        big = e.compare(o.abs(pk), o.c(_BIG), "GT")
        scaled = [e.select(big, o.mul(v, _BIGINV), v) for v in (pkm1, pk, qkm1, qk)]
        return [c, y, z, *scaled, ans], e.compare(t, o.c(_MACHEP), "GT")

    carry = [o.c(0.0), y, z, o.c(1.0), pkm1, x, qkm1, o.div(pkm1, qkm1)]
    ans = _loop(o, live, carry, step)[-1]
    return o.mul(ans, _prefactor(o, a, x))


def _igamma(o: Ops, a: Value, x: Value, upper: bool) -> Value:
    e = o.e
    use_cf = o.and_(e.compare(x, o.c(1.0), "GT"), e.compare(x, a, "GT"))
    finite = o.and_(o.and_(e.compare(a, o.c(0.0), "GT"), e.compare(x, o.c(0.0), "GT")),
                  o.and_(o.lt(a, math.inf), o.lt(x, math.inf)))  # fmt: skip
    # loop only over the elements that use each sum (the others would only slow it down)
    # and feed them harmless arguments
    safe_a = e.select(finite, a, o.c(1.0))
    safe_x = e.select(finite, x, o.c(1.0))
    p = _series(o, safe_a, safe_x, o.and_(finite, e.unary("not", use_cf)))
    q = _continued_fraction(o, safe_a, safe_x, o.and_(finite, use_cf))
    y = e.select(use_cf, q, o.sub(1.0, p)) if upper else e.select(use_cf, o.sub(1.0, q), p)
    # eager's special cases, first match wins (applied here last to first)
    lo, hi = (1.0, 0.0) if upper else (0.0, 1.0)
    y = e.select(o.eq(x, math.inf), o.c(hi), y)
    inf_a = o.eq(a, math.inf)
    y = e.select(inf_a, e.select(o.eq(x, math.inf), o.c(math.nan), o.c(lo)), y)
    y = e.select(o.eq(x, 0.0), o.c(lo), y)
    a_zero = o.eq(a, 0.0)
    y = e.select(a_zero, e.select(e.compare(x, o.c(0.0), "GT"), o.c(hi), o.c(math.nan)), y)
    negative = o.or_(o.lt(x, 0.0), o.lt(a, 0.0))
    return e.select(
        o.or_(negative, o.or_(e.compare(a, a, "NE"), e.compare(x, x, "NE"))), o.c(math.nan), y
    )


binary_formula(aten.igamma.default, lambda o, a, x: _igamma(o, a, x, upper=False))
binary_formula(aten.igammac.default, lambda o, a, x: _igamma(o, a, x, upper=True))
