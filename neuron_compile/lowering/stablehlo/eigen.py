"""Symmetric eigendecomposition (``_linalg_eigh``), SVD (``_linalg_svd``) and the pseudo-inverse
built on them (``linalg_pinv``), all float32, by Jacobi rotations.

XLA's CPU client has no eigen/SVD custom call reachable from pure StableHLO, so both are one
``stablehlo.while`` of cyclic Jacobi rotations on small matrices:

* eigh: two-sided Jacobi, A <- Jᵀ A J and V <- V J with each rotation zeroing one off-diagonal
  pair (p, q) (Golub & Van Loan, Alg. 8.5.2 and ``sym.schur2``);
* SVD: one-sided (Hestenes) Jacobi on the columns of A (m >= n; A is transposed otherwise):
  the same rotation, computed from the Gram entries of columns p and q, orthogonalizes them, so
  the small singular values keep their relative accuracy (unlike eigh of AᵀA, which squares the
  condition number - the pseudo-inverse of a rank-deficient matrix depends on that).

Every rotation is a full-matrix product with an iota-built rotation matrix, so batch dims need no
special handling. The loop stops when the off-diagonal part is below float32 resolution or after
``_MAX_SWEEPS`` sweeps. Results are sorted like LAPACK's (eigenvalues ascending, singular values
descending). Eigen/singular vectors are only defined up to sign, and these signs are not
LAPACK's: anything built from them that is sign-invariant (eigvalsh, svdvals, norms, rank, cond,
pinv, and every gradient through them) agrees with eager; raw vectors may differ in sign.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.fx as fx

from ..context import LoweringContext
from ..emit import TensorType, Value
from ..registry import lowering
from ..rules import INDEX, float32_only
from .linalg import broadcast_leading, square_float32
from .qr import geqrf, householder_product

aten = torch.ops.aten
_MAX_SWEEPS = 15
_EPS = float(torch.finfo(torch.float32).eps)


def _swap_last(x: Value) -> list[int]:
    return [*range(x.rank - 2), x.rank - 1, x.rank - 2]


def _matmul(ctx: LoweringContext, a: Value, b: Value, ta: bool = False) -> Value:
    """``a @ b`` (``aᵀ @ b`` with ``ta``) over matching batch dims."""
    r = a.rank
    batch = list(range(r - 2))
    return ctx.emit.dot_general(a, b, (((r - 2) if ta else (r - 1),), (r - 2,)), (batch, batch))


def _pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    pairs = [(p, q) for p in range(n) for q in range(p + 1, n)]
    return np.array([p for p, _ in pairs], np.int32), np.array([q for _, q in pairs], np.int32)


def _entry(ctx: LoweringContext, x: Value, row: Value, col: Value, i: Value, j: Value) -> Value:
    """x[..., i, j] for scalar indices (masked sum; ``row``/``col`` are iotas of x's shape)."""
    e = ctx.emit
    mask = e.binary(
        "and",
        e.compare(row, e.broadcast_in_dim(i, x.shape, []), "EQ"),
        e.compare(col, e.broadcast_in_dim(j, x.shape, []), "EQ"),
    )
    return e.reduce_simple(
        e.select(mask, x, ctx.full_like(0.0, x)), 0.0, [x.rank - 2, x.rank - 1], "add"
    )


def _rotation(ctx: LoweringContext, app: Value, aqq: Value, apq: Value) -> tuple[Value, Value]:
    """(c, s) with [[c, s], [-s, c]] diagonalizing the symmetric 2x2 [[app, apq], [apq, aqq]]:
    t = sign(tau) / (|tau| + sqrt(1 + tau^2)), tau = (aqq - app) / (2 apq); none when apq = 0."""
    e = ctx.emit

    def c(v: float) -> Value:
        return ctx.full_like(v, app)

    tau = e.binary("divide", e.binary("subtract", aqq, app), e.binary("multiply", apq, c(2.0)))
    at = e.unary("abs", tau)
    root = e.unary("sqrt", e.binary("add", e.binary("multiply", at, at), c(1.0)))
    # beyond 1e18 tau^2 overflows; t = 1 / (2 |tau|) to float32 precision there
    denom = e.select(
        e.compare(at, c(1e18), "LT"), e.binary("add", at, root), e.binary("multiply", at, c(2.0))
    )
    t = e.binary("divide", c(1.0), denom)
    t = e.select(e.compare(tau, c(0.0), "LT"), e.unary("negate", t), t)
    zero = e.compare(apq, c(0.0), "EQ")
    t = e.select(zero, c(0.0), t)
    cos = e.unary("rsqrt", e.binary("add", e.binary("multiply", t, t), c(1.0)))
    return cos, e.binary("multiply", t, cos)


def _rotation_matrix(
    ctx: LoweringContext, shape: tuple[int, ...], p: Value, q: Value, cos: Value, sin: Value
) -> Value:
    """Identity with [[c, s], [-s, c]] in rows/cols (p, q); ``cos``/``sin`` per batch element."""
    e = ctx.emit
    r = len(shape)
    row, col = e.iota(shape, r - 2, INDEX), e.iota(shape, r - 1, INDEX)
    eye = e.convert(e.compare(row, col, "EQ"), torch.float32)
    pb, qb = (e.broadcast_in_dim(v, shape, []) for v in (p, q))
    cb, sb = (e.broadcast_in_dim(v, shape, list(range(r - 2))) for v in (cos, sin))
    is_p_row, is_q_row = e.compare(row, pb, "EQ"), e.compare(row, qb, "EQ")
    is_p_col, is_q_col = e.compare(col, pb, "EQ"), e.compare(col, qb, "EQ")
    j = e.select(
        e.binary("or", e.binary("and", is_p_row, is_p_col), e.binary("and", is_q_row, is_q_col)),
        cb,
        eye,
    )
    j = e.select(e.binary("and", is_p_row, is_q_col), sb, j)
    return e.select(e.binary("and", is_q_row, is_p_col), e.unary("negate", sb), j)


def _jacobi(ctx: LoweringContext, x: Value, one_sided: bool) -> tuple[Value, Value]:
    """Run the sweeps: returns (A diagonalized, V) for two-sided, (A V, V) for one-sided."""
    e = ctx.emit
    n = x.shape[-1]
    batch = x.shape[:-2]
    vshape = (*batch, n, n)
    ptab, qtab = _pairs(n)
    npairs = len(ptab)
    tabs = [e.constant(t, TensorType((npairs,), INDEX)) for t in (ptab, qtab)]
    slot = e.iota((npairs,), 0, INDEX)
    row, col = e.iota(vshape, len(vshape) - 2, INDEX), e.iota(vshape, len(vshape) - 1, INDEX)
    off_mask = e.compare(row, col, "NE")
    all_dims = list(range(len(vshape)))

    def gram(a: Value) -> Value:
        return _matmul(ctx, a, a, ta=True) if one_sided else a

    def converged(a: Value) -> Value:
        g = gram(a)
        if one_sided:
            # every pair of columns orthogonal to working precision, relative to their norms:
            # |G_pq| <= tol sqrt(G_pp G_qq) (what keeps small singular values accurate)
            d = _diag(ctx, g)
            scale = e.unary("sqrt", e.binary(
                "multiply",
                e.broadcast_in_dim(d, vshape, [*range(len(batch)), len(batch)]),
                e.broadcast_in_dim(d, vshape, [*range(len(batch)), len(batch) + 1]),
            ))  # fmt: skip
            tol = e.binary("multiply", scale, ctx.full_like(_EPS * max(x.shape[-2], 1), scale))
            bad = e.binary("and", off_mask, e.compare(e.unary("abs", g), tol, "GT"))
            return e.unary("not", e.reduce_simple(bad, False, all_dims, "or"))
        # two-sided: the off-diagonal mass below float32 resolution of the whole matrix
        sq = e.binary("multiply", g, g)
        off = e.reduce_simple(e.select(off_mask, sq, ctx.full_like(0.0, sq)), 0.0, all_dims, "add")
        total = e.reduce_simple(sq, 0.0, all_dims, "add")
        limit = e.binary("multiply", total, e.scalar((_EPS * _EPS) / 16.0, torch.float32))
        return e.compare(off, limit, "LE")

    def cond(k: Value, done: Value, a: Value, v: Value) -> list[Value]:
        more = e.compare(k, e.scalar(_MAX_SWEEPS * npairs, INDEX), "LT")
        return [e.binary("and", more, e.unary("not", done))]

    def body(k: Value, done: Value, a: Value, v: Value) -> list[Value]:
        idx = e.binary("remainder", k, e.scalar(npairs, INDEX))
        hit = e.compare(slot, e.broadcast_in_dim(idx, (npairs,), []), "EQ")
        p, q = (
            e.reduce_simple(e.select(hit, t, e.full(0, (npairs,), INDEX)), 0, [0], "add")
            for t in tabs
        )
        g = gram(a)
        app, aqq, apq = (_entry(ctx, g, row, col, i, j) for i, j in ((p, p), (q, q), (p, q)))
        cos, sin = _rotation(ctx, app, aqq, apq)
        rot = _rotation_matrix(ctx, vshape, p, q, cos, sin)
        a = _matmul(ctx, a, rot)
        if not one_sided:
            a = _matmul(ctx, rot, a, ta=True)
        v = _matmul(ctx, v, rot)
        # checked once per sweep: the convergence test costs as much as a rotation
        sweep_end = e.compare(idx, e.scalar(npairs - 1, INDEX), "EQ")
        done = e.binary("and", sweep_end, converged(a))
        return [e.binary("add", k, e.scalar(1, INDEX)), done, a, v]

    eye = e.convert(e.compare(row, col, "EQ"), torch.float32)
    inits = [e.scalar(0, INDEX), converged(x), x, eye]
    _, _, a, v = e.while_(inits, cond, body)
    return a, v


def _diag(ctx: LoweringContext, x: Value) -> Value:
    e = ctx.emit
    r = x.rank
    eye = e.compare(e.iota(x.shape, r - 2, INDEX), e.iota(x.shape, r - 1, INDEX), "EQ")
    return e.reduce_simple(e.select(eye, x, ctx.full_like(0.0, x)), 0.0, [r - 1], "add")


def _sort_with_columns(
    ctx: LoweringContext, w: Value, cols: list[Value], descending: bool
) -> tuple[Value, list[Value]]:
    """Sort ``w`` (..., n) and permute the columns of each (..., m, n) matrix in ``cols`` alike."""
    e = ctx.emit
    r = w.rank
    idx = e.iota(w.shape, r - 1, INDEX)
    direction = "GT" if descending else "LT"
    w, perm = e.sort([w, idx], r - 1, lambda a, b, *_: [e.compare(a, b, direction)])
    out = []
    for m in cols:
        n = m.shape[-1]
        pshape = (*w.shape[:-1], n, n)  # P[i, j] = (perm[j] == i): M P takes column perm[j]
        p = e.compare(
            e.broadcast_in_dim(perm, pshape, [*range(r - 1), r]), e.iota(pshape, r - 1, INDEX), "EQ"
        )
        out.append(_matmul(ctx, m, e.convert(p, m.dtype)))
    return w, out


def _empty_outputs(ctx: LoweringContext, count: int) -> tuple[Value, ...]:
    """Outputs of an empty input: empty, except that a non-empty square factor (U of an (m, 0)
    matrix with full_matrices) is the identity, as eager returns it."""
    e = ctx.emit
    outs = []
    for i in range(count):
        t = ctx.out_type(i)
        if 0 not in t.shape and t.rank >= 2:
            r = t.rank
            eye = e.compare(e.iota(t.shape, r - 2, INDEX), e.iota(t.shape, r - 1, INDEX), "EQ")
            outs.append(e.convert(eye, t.dtype))
        else:
            outs.append(e.full(0, t.shape, t.dtype))
    return tuple(outs)


def _fit(ctx: LoweringContext, v: Value, index: int) -> Value:
    """``v`` as output ``index``, or that output's empty placeholder when it was not asked for."""
    want = ctx.out_type(index)
    return v if want.shape == v.shape else ctx.emit.full(0, want.shape, want.dtype)


# ---- eigh -----------------------------------------------------------------------------------
def eigh(ctx: LoweringContext, a: Value, lower: bool) -> tuple[Value, Value]:
    """(eigenvalues ascending, eigenvectors as columns) of the symmetric matrix whose ``lower``
    (or upper) triangle ``a`` holds."""
    e = ctx.emit
    r = a.rank
    row, col = e.iota(a.shape, r - 2, INDEX), e.iota(a.shape, r - 1, INDEX)
    keep = e.compare(row, col, "GE" if lower else "LE")
    sym = e.select(keep, a, e.transpose(a, _swap_last(a)))
    d, v = _jacobi(ctx, sym, one_sided=False)
    w, (v,) = _sort_with_columns(ctx, _diag(ctx, d), [v], descending=False)
    return w, v


@lowering(aten._linalg_eigh.default, supports=square_float32)
def _lower_linalg_eigh(
    ctx: LoweringContext,
    a: Value,
    UPLO: str = "L",
    compute_v: bool = True,  # noqa: N803
) -> tuple[Value, Value]:
    if 0 in a.shape:
        return _empty_outputs(ctx, 2)
    w, v = eigh(ctx, a, UPLO.upper() == "L")
    return w, _fit(ctx, v, 1)


# ---- SVD ------------------------------------------------------------------------------------
def _svd_support(node: fx.Node) -> str | None:
    why = float32_only(node)
    if why:
        return why
    a = node.args[0].meta["val"]
    if a.ndim < 2:
        return "needs a (..., m, n) matrix"
    full = node.kwargs.get("full_matrices", node.args[1] if len(node.args) > 1 else False)
    compute_uv = node.kwargs.get("compute_uv", node.args[2] if len(node.args) > 2 else True)
    if full and compute_uv and a.shape[-1] != a.shape[-2] and 0 not in a.shape:
        return "full_matrices=True for a non-square matrix is not lowered"
    return None


def svd(ctx: LoweringContext, a: Value) -> tuple[Value, Value, Value]:
    """Thin SVD (U (..., m, k), S (..., k) descending, V (..., n, k)), k = min(m, n)."""
    e = ctx.emit
    m, n = a.shape[-2:]
    if m < n:  # Aᵀ = U' S V'ᵀ  =>  A = V' S U'ᵀ
        u, s, v = svd(ctx, e.transpose(a, _swap_last(a)))
        return v, s, u
    av, v = _jacobi(ctx, a, one_sided=True)
    s = e.unary("sqrt", e.reduce_simple(e.binary("multiply", av, av), 0.0, [av.rank - 2], "add"))
    s, (av, v) = _sort_with_columns(ctx, s, [av, v], descending=True)
    columns = [*range(av.rank - 2), av.rank - 1]
    # U = A V / s where s is above rounding (eps * max(m, n) * the largest s: below it A V's
    # column is rounding noise). Each other column of U is any unit vector orthogonal to the rest,
    # as LAPACK's is: that column of the Householder QR of U, whose Q keeps the kept columns' span.
    top = e.reduce_simple(s, 0.0, [s.rank - 1], "maximum")
    tol = e.binary("multiply", top, ctx.full_like(max(m, n) * torch.finfo(torch.float32).eps, top))
    kept = e.compare(s, broadcast_leading(ctx, tol, s.shape), "GT")
    safe = e.select(kept, s, ctx.full_like(1.0, s))
    kept_columns = e.broadcast_in_dim(kept, av.shape, columns)
    u = e.binary("divide", av, e.broadcast_in_dim(safe, av.shape, columns))
    u = e.select(kept_columns, u, ctx.full_like(0.0, u))
    packed, tau = geqrf(ctx, u)
    completed = householder_product(ctx, packed, tau, u.shape[-1])
    return e.select(kept_columns, u, completed), s, v


@lowering(aten._linalg_svd.default, supports=_svd_support)
def _lower_linalg_svd(
    ctx: LoweringContext,
    a: Value,
    full_matrices: bool = False,
    compute_uv: bool = True,
    *,
    driver: str | None = None,
) -> tuple[Value, Value, Value]:
    if 0 in a.shape:
        return _empty_outputs(ctx, 3)
    u, s, v = svd(ctx, a)
    return _fit(ctx, u, 0), s, _fit(ctx, ctx.emit.transpose(v, _swap_last(v)), 2)


# ---- pinv -----------------------------------------------------------------------------------
def _pinv_support(node: fx.Node) -> str | None:
    why = float32_only(node)
    if why:
        return why
    if node.args[0].meta["val"].ndim < 2:
        return "needs a (..., m, n) matrix"
    return None


@lowering(aten.linalg_pinv.atol_rtol_tensor, supports=_pinv_support)
def _lower_linalg_pinv(
    ctx: LoweringContext,
    a: Value,
    *,
    atol: Value | None = None,
    rtol: Value | None = None,
    hermitian: bool = False,
) -> Value:
    """Eager's formula (LinearAlgebra.cpp ``linalg_pinv``): singular values (|eigenvalues| when
    ``hermitian``) above max(atol, rtol * largest) are inverted, the rest dropped; rtol defaults to
    eps * max(m, n), or to 0 where a positive atol was given."""
    e = ctx.emit
    out = ctx.out_type()
    m, n = a.shape[-2:]
    if 0 in a.shape:
        return e.full(0, out.shape, out.dtype)
    if hermitian:
        s, u = eigh(ctx, a, lower=True)
        mag = e.unary("abs", s)
        v = u
    else:
        u, s, v = svd(ctx, a)
        mag = s
    r = mag.rank
    batch = mag.shape[:-1]
    largest = e.reduce_simple(mag, 0.0, [r - 1], "maximum")  # (...,)
    default_rtol = _EPS * max(m, n)
    zero = e.full(0.0, batch, torch.float32)
    atol_v = zero if atol is None else ctx.broadcast_to(e.convert(atol, torch.float32), batch)
    if rtol is not None:
        rtol_v = ctx.broadcast_to(e.convert(rtol, torch.float32), batch)
    elif atol is not None:
        positive = e.compare(atol_v, zero, "GT")
        rtol_v = e.select(positive, zero, e.full(default_rtol, batch, torch.float32))
    else:
        rtol_v = e.full(default_rtol, batch, torch.float32)
    tol = e.binary("maximum", atol_v, e.binary("multiply", rtol_v, largest))
    keep = e.compare(mag, e.broadcast_in_dim(tol, mag.shape, list(range(r - 1))), "GT")
    inv = e.select(keep, e.binary("divide", ctx.full_like(1.0, s), s), ctx.full_like(0.0, s))
    # A⁺ = V diag(inv) Uᵀ
    scaled = e.binary("multiply", v, e.broadcast_in_dim(inv, v.shape, [*range(r - 1), r]))
    return _matmul(ctx, scaled, e.transpose(u, _swap_last(u)))
