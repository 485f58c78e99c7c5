"""Orthogonal polynomials of integer degree: Chebyshev T/U/V/W (plain and shifted to [0, 1]),
physicists' and probabilists' Hermite, Laguerre and Legendre.

PyTorch's CPU kernels (aten/src/ATen/native/Math.h) evaluate the three-term recurrence in the
element's own dtype up to its own degree ``n`` (a tensor, truncated to an integer), after a few
special cases (n < 0 -> 0, x = +-1 closed forms, and for Chebyshev a trigonometric closed form once
n is large and |x| < 1). Here one ``stablehlo.while`` runs the recurrence up to the largest degree
in the tensor; each element only takes the steps below its own degree (a select), so the float
operations per element are the same ones eager performs. The special cases are selects on top.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..emit import Value
from ..rules import Ops, binary_formula, one_minus_x_squared

aten = torch.ops.aten

# The recurrence step: (o, x, j, p, q) -> next value, for j = 1 .. n - 1 (p = P_{j-1}, q = P_j).
Step = Callable[[Ops, Value, Value, Value, Value], Value]


def _cheb_step(o: Ops, t: Value, j: Value, p: Value, q: Value) -> Value:
    return o.sub(o.mul(o.add(t, t), q), p)


def _hermite_h_step(o: Ops, x: Value, j: Value, p: Value, q: Value) -> Value:
    return o.sub(o.mul(o.add(x, x), q), o.mul(o.add(j, j), p))  # eager's k = 2j


def _hermite_he_step(o: Ops, x: Value, j: Value, p: Value, q: Value) -> Value:
    return o.sub(o.mul(x, q), o.mul(j, p))


def _laguerre_step(o: Ops, x: Value, j: Value, p: Value, q: Value) -> Value:
    num = o.sub(o.mul(o.add(o.add(j, j), o.sub(1.0, x)), q), o.mul(j, p))
    return o.div(num, o.add(j, 1.0))


def _legendre_step(o: Ops, x: Value, j: Value, p: Value, q: Value) -> Value:
    num = o.sub(o.mul(o.mul(o.add(o.add(j, j), 1.0), x), q), o.mul(j, p))
    return o.div(num, o.add(j, 1.0))


def _recurrence(o: Ops, x: Value, n: Value, q0: Value, step: Step, limit: float | None) -> Value:
    """P_n(x) for n >= 1 (P_0 = 1, P_1 = q0), ``n`` a float tensor of non-negative integers.
    ``limit`` caps the trip count (degrees above it are handled by the caller)."""
    e = o.e
    n_top = e.reduce_simple(n, 0.0, list(range(n.rank)), "maximum")
    if limit is not None:
        n_top = e.binary("minimum", n_top, e.scalar(limit, n.dtype))
    one = e.scalar(1.0, n.dtype)

    def cond(j: Value, p: Value, q: Value) -> list[Value]:
        return [e.compare(j, n_top, "LT")]

    def body(j: Value, p: Value, q: Value) -> list[Value]:
        jb = o.ctx.broadcast_to(j, x.shape)
        r = step(o, x, jb, p, q)
        live = e.compare(jb, n, "LT")  # this element still has steps to take
        return [e.binary("add", j, one), e.select(live, q, p), e.select(live, r, q)]

    return e.while_([one, o.c(1.0), q0], cond, body)[2]


def _parity_sign(o: Ops, n: Value) -> Value:
    """(-1)^n for integer-valued float ``n``."""
    odd = o.eq(o.sub(n, o.mul(o.floor(o.mul(n, 0.5)), 2.0)), 1.0)
    return o.e.select(odd, o.c(-1.0), o.c(1.0))


def _degree(o: Ops, n: Value) -> tuple[Value, Value]:
    """(valid, n): eager casts n to int64 (truncating); NaN, inf and values beyond int64 become
    INT64_MIN there, i.e. negative: all of those (and n < 0) give 0."""
    e = o.e
    t = e.select(o.lt(n, 0.0), o.ceil(n), o.floor(n))
    valid = o.and_(o.isfinite(n), o.and_(e.compare(t, o.c(0.0), "GE"), o.lt(t, 2.0**63)))
    return valid, e.select(valid, t, o.c(0.0))


@dataclass(frozen=True)
class _Chebyshev:
    """One Chebyshev kind: ``q0(o, t)`` is P_1 at t; ``at_one(o, n)`` / ``at_minus_one(o, n)`` the
    closed forms at t = +-1; ``trig(o, theta, n)`` the large-degree closed form with
    t = cos(theta); ``threshold`` / ``shifted_threshold`` the degree beyond which eager uses it."""

    q0: Callable[[Ops, Value], Value]
    at_one: Callable[[Ops, Value], Value]
    at_minus_one: Callable[[Ops, Value], Value]
    trig: Callable[[Ops, Value, Value, Value, bool], Value]
    threshold: int
    shifted_threshold: int


def _trig_t(o: Ops, theta: Value, n: Value, x: Value, shifted: bool) -> Value:
    return o.cosine(o.mul(n, theta))


def _trig_u(o: Ops, theta: Value, n: Value, t: Value, shifted: bool) -> Value:
    n1 = o.add(n, 1.0)
    s = o.sine(theta)
    main = o.div(o.sine(o.mul(n1, theta)), s)
    degenerate = o.div(o.mul(n1, o.cosine(o.mul(n1, theta))), t)
    return o.e.select(o.eq(s, 0.0), degenerate, main)


def _trig_v(o: Ops, theta: Value, n: Value, t: Value, shifted: bool) -> Value:
    half = o.mul(theta, 0.5)
    main = o.div(o.cosine(o.mul(o.add(n, 0.5), theta)), o.cosine(half))
    edge = o.mul(_parity_sign(o, n), o.add(o.add(n, n), 1.0))
    return o.e.select(o.eq(o.sine(half), 1.0), edge, main)


def _trig_w(o: Ops, theta: Value, n: Value, t: Value, shifted: bool) -> Value:
    half = o.mul(theta, 0.5)
    main = o.div(o.sine(o.mul(o.add(n, 0.5), theta)), o.sine(half))
    edge = _parity_sign(o, n)
    if not shifted:  # eager's unshifted kernel checks x > 0 first here
        edge = o.e.select(o.lt(t, 0.0), edge, o.add(o.add(n, n), 1.0))
    return o.e.select(o.eq(o.cosine(half), 1.0), edge, main)


_CHEBYSHEV = {
    "t": _Chebyshev(
        q0=lambda o, t: t,
        at_one=lambda o, n: o.c(1.0),
        at_minus_one=_parity_sign,
        trig=_trig_t,
        threshold=6,
        shifted_threshold=6,
    ),
    "u": _Chebyshev(
        q0=lambda o, t: o.add(t, t),
        at_one=lambda o, n: o.add(n, 1.0),
        at_minus_one=lambda o, n: o.mul(_parity_sign(o, n), o.add(n, 1.0)),
        trig=_trig_u,
        threshold=8,
        shifted_threshold=6,
    ),
    "v": _Chebyshev(
        q0=lambda o, t: o.sub(o.add(t, t), 1.0),
        at_one=lambda o, n: o.c(1.0),
        at_minus_one=lambda o, n: o.mul(_parity_sign(o, n), o.add(o.add(n, n), 1.0)),
        trig=_trig_v,
        threshold=8,
        shifted_threshold=6,
    ),
    "w": _Chebyshev(
        q0=lambda o, t: o.add(o.add(t, t), 1.0),
        at_one=lambda o, n: o.add(o.add(n, n), 1.0),
        at_minus_one=_parity_sign,
        trig=_trig_w,
        threshold=8,
        shifted_threshold=4,
    ),
}


def _acos(o: Ops, t: Value) -> Value:
    return o.e.binary("atan2", o.sqrt(one_minus_x_squared(o, t)), t)


def _chebyshev(kind: str, shifted: bool) -> Callable[[Ops, Value, Value], Value]:
    spec = _CHEBYSHEV[kind]

    def fn(o: Ops, x: Value, n_raw: Value) -> Value:
        e = o.e
        valid, n = _degree(o, n_raw)
        # the shifted kernels test x itself (x = 1, x = 0), not t = 2x - 1
        t = o.sub(o.add(x, x), 1.0) if shifted else x
        at_one = o.eq(x, 1.0)
        at_minus_one = o.eq(x, 0.0) if shifted else o.eq(x, -1.0)
        y = _recurrence(o, t, n, spec.q0(o, t), _cheb_step, None)
        y = e.select(o.eq(n, 0.0), o.c(1.0), y)
        threshold = spec.shifted_threshold if shifted else spec.threshold
        use_trig = o.and_(e.compare(n, o.c(float(threshold)), "GT"), o.lt(o.abs(t), 1.0))
        y = e.select(use_trig, spec.trig(o, _acos(o, t), n, t, shifted), y)
        y = e.select(at_minus_one, spec.at_minus_one(o, n), y)
        y = e.select(at_one, spec.at_one(o, n), y)
        return e.select(valid, y, o.c(0.0))

    return fn


def _simple(
    q0: Callable[[Ops, Value], Value],
    step: Step,
    *,
    nan_above: float | None = None,
    edges: Callable[[Ops, Value, Value, Value], Value] | None = None,
) -> Callable[[Ops, Value, Value], Value]:
    """A polynomial with no trigonometric form; ``nan_above``: eager returns NaN beyond that
    degree (Hermite, float32); ``edges(o, x, n, y)`` applies closed forms at special x."""

    def fn(o: Ops, x: Value, n_raw: Value) -> Value:
        e = o.e
        valid, n = _degree(o, n_raw)
        y = _recurrence(o, x, n, q0(o, x), step, nan_above)
        y = e.select(o.eq(n, 0.0), o.c(1.0), y)
        if nan_above is not None:
            y = e.select(e.compare(n, o.c(nan_above), "GT"), o.c(math.nan), y)
        if edges is not None:
            y = edges(o, x, n, y)
        return e.select(valid, y, o.c(0.0))

    return fn


def _legendre_edges(o: Ops, x: Value, n: Value, y: Value) -> Value:
    e = o.e
    y = e.select(o.eq(x, -1.0), _parity_sign(o, n), y)
    return e.select(o.eq(x, 1.0), o.c(1.0), y)


def _laguerre_edges(o: Ops, x: Value, n: Value, y: Value) -> Value:
    return o.e.select(o.eq(x, 0.0), o.c(1.0), y)


_HERMITE_LIMIT = 128.0  # eager's getHermitianLimit<float>()

_POLYNOMIALS = {
    "hermite_polynomial_h": _simple(
        lambda o, x: o.add(x, x), _hermite_h_step, nan_above=_HERMITE_LIMIT
    ),
    "hermite_polynomial_he": _simple(lambda o, x: x, _hermite_he_step, nan_above=_HERMITE_LIMIT),
    "laguerre_polynomial_l": _simple(
        lambda o, x: o.sub(1.0, x), _laguerre_step, edges=_laguerre_edges
    ),
    "legendre_polynomial_p": _simple(lambda o, x: x, _legendre_step, edges=_legendre_edges),
}
for _kind in "tuvw":
    _POLYNOMIALS[f"chebyshev_polynomial_{_kind}"] = _chebyshev(_kind, shifted=False)
    _POLYNOMIALS[f"shifted_chebyshev_polynomial_{_kind}"] = _chebyshev(_kind, shifted=True)


for _name, _fn in _POLYNOMIALS.items():
    _packet = getattr(aten, f"special_{_name}")
    binary_formula((_packet.default, _packet.x_scalar, _packet.n_scalar), _fn, name=_name)
