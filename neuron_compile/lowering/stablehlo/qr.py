"""Householder QR: ``geqrf``, ``linalg_qr``, ``linalg_householder_product`` (LAPACK's orgqr) and
``ormqr``, float32.

``geqrf`` is LAPACK's unblocked ``sgeqr2`` in one ``stablehlo.while`` over the columns: for column
k, ``slarfg`` picks beta = -sign(alpha) * ||(alpha, x)|| and tau = (beta - alpha) / beta (tau = 0
when x = 0), stores v / (alpha - beta) below the diagonal, and applies H = I - tau v vᵀ to the
columns right of k. Following LAPACK's sign convention makes the factors the ones eager returns
(QR is unique once R's diagonal signs are fixed), not merely a valid QR. Reflectors are applied
as masked full-matrix rank-1 updates, like the LU loop in ``linalg.py``.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from ..context import LoweringContext
from ..emit import Value
from ..registry import lowering
from ..rules import INDEX, float32_only
from .linalg import broadcast_leading, pick

aten = torch.ops.aten


def _bcast(ctx: LoweringContext, s: Value, shape: tuple[int, ...]) -> Value:
    return ctx.emit.broadcast_in_dim(s, shape, [])


def _matrix_f32(node: fx.Node) -> str | None:
    why = float32_only(node)
    if why:
        return why
    a = node.args[0].meta["val"]
    if a.ndim < 2:
        return "needs a (..., m, n) matrix"
    return None


def _counted_while(ctx: LoweringContext, steps: int, carry: list[Value], step) -> list[Value]:
    """``carry = step(k, *carry)`` for k = 0 .. steps - 1 (a ``stablehlo.while``)."""
    e = ctx.emit

    def cond(k: Value, *_: Value) -> list[Value]:
        return [e.compare(k, e.scalar(steps, INDEX), "LT")]

    def body(k: Value, *rest: Value) -> list[Value]:
        return [e.binary("add", k, e.scalar(1, INDEX)), *step(k, *rest)]

    return e.while_([e.scalar(0, INDEX), *carry], cond, body)[1:]


def _reflector(ctx: LoweringContext, packed: Value, k: Value) -> Value:
    """v_k (..., m): 1 at row k, the stored entries below it, 0 above."""
    e = ctx.emit
    r = packed.rank
    vec = packed.shape[:-1]
    col = e.iota(packed.shape, r - 1, INDEX)
    column = pick(ctx, e.compare(col, _bcast(ctx, k, packed.shape), "EQ"), packed, r - 1)
    rows = e.iota(vec, r - 2, INDEX)
    kv = _bcast(ctx, k, vec)
    v = e.select(e.compare(rows, kv, "GT"), column, ctx.full_like(0.0, column))
    return e.select(e.compare(rows, kv, "EQ"), ctx.full_like(1.0, column), v)


def _apply_left(ctx: LoweringContext, c: Value, v: Value, tau: Value) -> Value:
    """(I - tau v vᵀ) C for C (..., m, p), v (..., m), tau (...,)."""
    e = ctx.emit
    r = c.rank
    batch = list(range(r - 2))
    w = e.dot_general(v, c, ((r - 2,), (r - 2,)), (batch, batch))  # vᵀ C: (..., p)
    tw = e.binary("multiply", w, broadcast_leading(ctx, tau, w.shape))
    outer = e.binary(
        "multiply",
        e.broadcast_in_dim(v, c.shape, list(range(r - 1))),
        e.broadcast_in_dim(tw, c.shape, [*batch, r - 1]),
    )
    return e.binary("subtract", c, outer)


def geqrf(ctx: LoweringContext, a: Value) -> tuple[Value, Value]:
    """(packed R and reflectors, tau (..., min(m, n)))."""
    e = ctx.emit
    r = a.rank
    m, n = a.shape[-2:]
    steps = min(m, n)
    vec = a.shape[:-1]
    batch = a.shape[:-2]

    def step(k: Value, a: Value, taus: Value) -> list[Value]:
        col = e.iota(a.shape, r - 1, INDEX)
        is_k = e.compare(col, _bcast(ctx, k, a.shape), "EQ")
        column = pick(ctx, is_k, a, r - 1)  # (..., m)
        rows = e.iota(vec, r - 2, INDEX)
        kv = _bcast(ctx, k, vec)
        below = e.compare(rows, kv, "GT")
        alpha = pick(ctx, e.compare(rows, kv, "EQ"), column, r - 2)  # (...,)
        x = e.select(below, column, ctx.full_like(0.0, column))
        xnorm = e.unary("sqrt", e.reduce_simple(e.binary("multiply", x, x), 0.0, [r - 2], "add"))
        norm = e.unary(
            "sqrt",
            e.binary("add", e.binary("multiply", alpha, alpha), e.binary("multiply", xnorm, xnorm)),
        )
        # LAPACK's SIGN(norm, alpha): +0 counts as positive, so beta = -norm there
        negative = e.compare(alpha, ctx.full_like(0.0, alpha), "LT")
        beta = e.select(negative, norm, e.unary("negate", norm))
        reflect = e.compare(xnorm, ctx.full_like(0.0, xnorm), "NE")
        one = ctx.full_like(1.0, beta)
        safe_beta = e.select(reflect, beta, one)
        tau = e.binary("divide", e.binary("subtract", safe_beta, alpha), safe_beta)
        tau = e.select(reflect, tau, ctx.full_like(0.0, tau))
        scale = e.binary("divide", one, e.select(reflect, e.binary("subtract", alpha, beta), one))
        v_below = e.binary("multiply", x, broadcast_leading(ctx, scale, vec))
        v = e.select(
            below, v_below, e.select(e.compare(rows, kv, "EQ"), e.full(1.0, vec, a.dtype), x)
        )
        updated = _apply_left(ctx, a, v, tau)
        right = e.compare(col, _bcast(ctx, k, a.shape), "GT")
        a = e.select(right, updated, a)
        new_col = e.select(
            below, v_below, broadcast_leading(ctx, e.select(reflect, beta, alpha), vec)
        )
        rows_mat = e.iota(a.shape, r - 2, INDEX)
        at_or_below = e.compare(rows_mat, _bcast(ctx, k, a.shape), "GE")
        a = e.select(
            e.binary("and", is_k, at_or_below),
            e.broadcast_in_dim(new_col, a.shape, list(range(r - 1))),
            a,
        )
        slot = e.iota(taus.shape, r - 2, INDEX)
        taus = e.select(
            e.compare(slot, _bcast(ctx, k, taus.shape), "EQ"),
            broadcast_leading(ctx, tau, taus.shape),
            taus,
        )
        return [a, taus]

    a, taus = _counted_while(ctx, steps, [a, e.full(0.0, (*batch, steps), a.dtype)], step)
    return a, taus


def _apply_reflectors(
    ctx: LoweringContext, packed: Value, tau: Value, c: Value, reverse: bool
) -> Value:
    """H_0 H_1 ... H_{k-1} C (``reverse``: applied last-first, which computes exactly that
    product) or H_{k-1} ... H_0 C, for C (..., m, p)."""
    e = ctx.emit
    k_count = tau.shape[-1]
    r = packed.rank

    def step(i: Value, c: Value) -> list[Value]:
        k = e.binary("subtract", e.scalar(k_count - 1, INDEX), i) if reverse else i
        v = _reflector(ctx, packed, k)
        slot = e.iota(tau.shape, r - 2, INDEX)
        t = pick(ctx, e.compare(slot, _bcast(ctx, k, tau.shape), "EQ"), tau, r - 2)
        return [_apply_left(ctx, c, v, t)]

    return _counted_while(ctx, k_count, [c], step)[0]


def _eye(ctx: LoweringContext, shape: tuple[int, ...]) -> Value:
    e = ctx.emit
    r = len(shape)
    return e.convert(
        e.compare(e.iota(shape, r - 2, INDEX), e.iota(shape, r - 1, INDEX), "EQ"), torch.float32
    )


def householder_product(ctx: LoweringContext, packed: Value, tau: Value, cols: int) -> Value:
    """The first ``cols`` columns of Q = H_0 ... H_{k-1} (m x m)."""
    m = packed.shape[-2]
    return _apply_reflectors(ctx, packed, tau, _eye(ctx, (*packed.shape[:-2], m, cols)), True)


@lowering(aten.geqrf.default, supports=_matrix_f32)
def _lower_geqrf(ctx: LoweringContext, a: Value) -> tuple[Value, Value]:
    return geqrf(ctx, a)


def _qr_support(node: fx.Node) -> str | None:
    return _matrix_f32(node)


@lowering(aten.linalg_qr.default, supports=_qr_support)
def _lower_linalg_qr(ctx: LoweringContext, a: Value, mode: str = "reduced") -> tuple[Value, Value]:
    """geqrf, then Q from the reflectors (``householder_product``) and R = triu of the packed
    factor: (m, k) / (k, n) reduced, (m, m) / (m, n) complete, Q empty for mode="r"."""
    e = ctx.emit
    packed, tau = geqrf(ctx, a)
    q_want, r_want = ctx.out_type(0), ctx.out_type(1)
    r = a.rank
    rows = r_want.shape[-2]
    rpart = e.slice(packed, [0] * r, (*a.shape[:-2], rows, a.shape[-1]), [1] * r)
    upper = e.compare(e.iota(rpart.shape, r - 2, INDEX), e.iota(rpart.shape, r - 1, INDEX), "LE")
    rmat = e.select(upper, rpart, ctx.full_like(0.0, rpart))
    if mode == "r":
        return e.full(0, q_want.shape, q_want.dtype), rmat
    return householder_product(ctx, packed, tau, q_want.shape[-1]), rmat


def _hp_support(node: fx.Node) -> str | None:
    why = _matrix_f32(node)
    if why:
        return why
    a, tau = (v.meta["val"] for v in node.args[:2])
    if tuple(tau.shape[:-1]) != tuple(a.shape[:-2]):
        return "tau must have the input's batch dims"
    return None


@lowering(aten.linalg_householder_product.default, supports=_hp_support)
def _lower_householder_product(ctx: LoweringContext, a: Value, tau: Value) -> Value:
    return householder_product(ctx, a, tau, a.shape[-1])


def _ormqr_support(node: fx.Node) -> str | None:
    why = _hp_support(node)
    if why:
        return why
    a, c = node.args[0].meta["val"], node.args[2].meta["val"]
    if tuple(c.shape[:-2]) != tuple(a.shape[:-2]):
        return "input and other must have the same batch dims"
    return None


@lowering(aten.ormqr.default, supports=_ormqr_support)
def _lower_ormqr(
    ctx: LoweringContext,
    a: Value,
    tau: Value,
    c: Value,
    left: bool = True,
    transpose: bool = False,
) -> Value:
    """op(Q) C (``left``) or C op(Q), Q = H_0 ... H_{k-1}. Right products go through the
    transpose: C Q = (Qᵀ Cᵀ)ᵀ."""
    e = ctx.emit
    r = c.rank
    swap = [*range(r - 2), r - 1, r - 2]
    if left:  # Q C applies H_{k-1} first; Qᵀ C applies H_0 first
        return _apply_reflectors(ctx, a, tau, c, reverse=not transpose)
    ct = e.transpose(c, swap)
    return e.transpose(_apply_reflectors(ctx, a, tau, ct, reverse=transpose), swap)
