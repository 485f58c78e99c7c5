"""Linear algebra: Cholesky, triangular solves, and everything built on LU with partial pivoting
(lu_factor, lu_solve, lu_unpack, solve, inv, det, slogdet).

Cholesky and triangular solves map onto single StableHLO ops that XLA's CPU client implements
(jaxlib 0.10.2): ``stablehlo.cholesky`` and ``stablehlo.triangular_solve``. Batch dims of a
triangular solve's operands broadcast against each other first (StableHLO wants equal batch dims).
``stablehlo.cholesky`` leaves the unused triangle implementation-defined, so the result is masked
to the requested triangle. Its ``info`` is 0 when every diagonal entry of the factor is finite,
else the 1-based index of the first non-finite one (XLA fills a failed factorization with NaN).

LU is one ``stablehlo.while`` over the columns with iota-masked full-matrix updates (see
``lu_factor``); solves then apply the permutation as a 0/1 matrix product and run two triangular
solves. ``aten._linalg_check_errors`` (plain or wrapped in AOTAutograd's ``with_effects``) lowers
to nothing: where eager raises on ``info != 0`` (singular / not positive-definite input) a compiled
graph returns inf/NaN results instead. Only float32 is lowered (eager has no bf16/f16 kernels).
"""

from __future__ import annotations

import torch
import torch.fx as fx

from ..context import LoweringContext, broadcast_shapes
from ..emit import Value
from ..registry import always, lowering
from ..rules import INDEX, float32_only

aten = torch.ops.aten


def _triangle_mask(ctx: LoweringContext, shape: tuple[int, ...], lower: bool) -> Value:
    """Boolean mask of the lower (row >= col) or upper (row <= col) triangle incl. diagonal."""
    e = ctx.emit
    rank = len(shape)
    row = e.iota(shape, rank - 2, INDEX)
    col = e.iota(shape, rank - 1, INDEX)
    return e.compare(row, col, "GE" if lower else "LE")


def _diagonal(ctx: LoweringContext, x: Value) -> Value:
    """Diagonal of (..., n, n) ``x`` as (..., n): mask off-diagonal entries and sum each row."""
    e = ctx.emit
    rank = x.rank
    eye = e.compare(e.iota(x.shape, rank - 2, INDEX), e.iota(x.shape, rank - 1, INDEX), "EQ")
    masked = e.select(eye, x, ctx.full_like(0.0, x))
    return e.reduce_simple(masked, 0.0, [rank - 1], "add")


@lowering(aten.linalg_cholesky_ex.default, supports=float32_only)
def _lower_cholesky_ex(
    ctx: LoweringContext, a: Value, upper: bool = False, check_errors: bool = False
) -> tuple[Value, Value]:
    e = ctx.emit
    lower = not upper
    factor = e.op1("cholesky", [a], a.type, f"lower = {'true' if lower else 'false'}")
    factor = e.select(_triangle_mask(ctx, a.shape, lower), factor, ctx.full_like(0.0, factor))
    # info: first non-finite diagonal entry (1-based), 0 when the factorization succeeded
    diag = _diagonal(ctx, factor)
    n = a.shape[-1]
    position = e.binary(
        "add", e.iota(diag.shape, diag.rank - 1, INDEX), e.full(1, diag.shape, INDEX)
    )
    sentinel = e.full(n + 1, diag.shape, INDEX)
    first_bad = e.reduce_simple(
        e.select(e.op1("is_finite", [diag], diag.type.with_dtype(torch.bool)), sentinel, position),
        n + 1,
        [diag.rank - 1],
        "minimum",
    )
    info = e.select(
        e.compare(first_bad, e.full(n + 1, first_bad.shape, INDEX), "EQ"),
        e.full(0, first_bad.shape, INDEX),
        first_bad,
    )
    return factor, info


@lowering(aten.cholesky.default, supports=float32_only)
def _lower_cholesky(ctx: LoweringContext, a: Value, upper: bool = False) -> Value:
    return _lower_cholesky_ex(ctx, a, upper)[0]


@lowering(aten._linalg_check_errors.default, supports=always)
def _lower_check_errors(ctx: LoweringContext, info: Value, api_name: str, *, is_matrix: bool):
    return None


def _effectful_check_errors(node) -> str | None:
    if len(node.args) > 1 and node.args[1] is aten._linalg_check_errors.default:
        return None
    return "only with_effects(aten._linalg_check_errors) is lowered"


@lowering(torch.ops.higher_order.with_effects, supports=_effectful_check_errors)
def _lower_with_effects(ctx: LoweringContext, token: Value, op, *args, **kwargs):
    """AOTAutograd threads an effect token through ``_linalg_check_errors``: pass it through
    (the token is an empty constant: ``_make_token`` below, or a token placeholder of a graph
    traced with lifted tokens, see ``lower_graph``)."""
    return token, None


# Our AOTAutograd graphs are traced with ``unlift_effect_tokens`` (backend.compile_frame): the
# token is made and consumed inside the graph, so the graph's inputs and outputs carry none.
@lowering(torch.ops.prims._make_token.default, supports=always)
def _lower_make_token(ctx: LoweringContext) -> Value:
    return ctx.emit.full(0, (0,), torch.float32)


@lowering(torch.ops.prims._sink_tokens.default, supports=always)
def _lower_sink_tokens(ctx: LoweringContext, tokens: list[Value]) -> None:
    return None


def triangular_solve(
    ctx: LoweringContext,
    a: Value,
    b: Value,
    *,
    left: bool,
    lower: bool,
    unit_diagonal: bool,
    transpose: bool = False,
) -> Value:
    """Solve ``op(a) x = b`` (``left``) or ``x op(a) = b`` with batch dims broadcast."""
    e = ctx.emit
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = ctx.broadcast_to(a, batch + a.shape[-2:])
    b = ctx.broadcast_to(b, batch + b.shape[-2:])
    flag = {True: "true", False: "false"}
    attrs = (
        f"left_side = {flag[left]}, lower = {flag[lower]}, "
        f"unit_diagonal = {flag[unit_diagonal]}, "
        f"transpose_a = #stablehlo<transpose {'TRANSPOSE' if transpose else 'NO_TRANSPOSE'}>"
    )
    return e.op1("triangular_solve", [a, b], b.type, attrs)


@lowering(aten.triangular_solve.default, supports=float32_only)
def _lower_triangular_solve(
    ctx: LoweringContext,
    b: Value,
    a: Value,
    upper: bool = True,
    transpose: bool = False,
    unitriangular: bool = False,
) -> tuple[Value, Value]:
    x = triangular_solve(
        ctx, a, b, left=True, lower=not upper, unit_diagonal=unitriangular, transpose=transpose
    )
    # the second result is a copy of A broadcast to the common batch shape
    return x, ctx.broadcast_to(a, ctx.out_type(1).shape)


@lowering(aten.linalg_solve_triangular.default, supports=float32_only)
def _lower_linalg_solve_triangular(
    ctx: LoweringContext,
    a: Value,
    b: Value,
    *,
    upper: bool,
    left: bool = True,
    unitriangular: bool = False,
) -> Value:
    return triangular_solve(ctx, a, b, left=left, lower=not upper, unit_diagonal=unitriangular)


# ---- LU with partial pivoting --------------------------------------------------------------
# One ``stablehlo.while`` over the columns k = 0..n-1 carries (k, A, pivots, perm, info). Every
# step works on the whole (..., n, n) matrix with iota masks instead of dynamic slices, so batch
# dims need no special handling and the loop body is the same for every k:
#   1. pivot row p = first argmax over rows >= k of |A[:, k]| (LAPACK's choice, 0-based);
#   2. swap rows k and p of A and of the permutation vector; pivots[k] = p + 1 (1-based);
#   3. multipliers m = A[k+1:, k] / A[k, k] (0 when the pivot is 0: LAPACK skips that column
#      and reports info = k + 1), A[k+1:, k+1:] -= m * A[k, k+1:], A[k+1:, k] = m.
# That is O(n^3) work per column (O(n^3) total with masks) - fine for the small matrices that
# reach a compiled graph; large factorizations belong on the CPU anyway.


def _bcast_scalar(ctx: LoweringContext, s: Value, shape: tuple[int, ...]) -> Value:
    return ctx.emit.broadcast_in_dim(s, shape, [])


def broadcast_leading(ctx: LoweringContext, x: Value, shape: tuple[int, ...]) -> Value:
    """Broadcast ``x`` along new trailing dims (its dims are the leading dims of ``shape``)."""
    return ctx.emit.broadcast_in_dim(x, shape, list(range(x.rank)))


def pick(ctx: LoweringContext, mask: Value, x: Value, dim: int) -> Value:
    """Sum of ``x`` where ``mask`` along ``dim`` (extracts one row/column selected by mask)."""
    e = ctx.emit
    return e.reduce_simple(e.select(mask, x, ctx.full_like(0, x)), 0, [dim], "add")


def _lu_step(
    ctx: LoweringContext, n: int, k: Value, a: Value, piv: Value, perm: Value, info: Value
):
    e = ctx.emit
    r = a.rank
    vec = a.shape[:-1]  # (..., n): one entry per row
    row = e.iota(a.shape, r - 2, INDEX)
    col = e.iota(a.shape, r - 1, INDEX)
    k_mat = _bcast_scalar(ctx, k, a.shape)
    k_vec = _bcast_scalar(ctx, k, vec)
    idx_vec = e.iota(vec, r - 2, INDEX)
    col_is_k = e.compare(col, k_mat, "EQ")
    # 1. pivot search over rows >= k
    column = pick(ctx, col_is_k, a, r - 1)  # (..., n)
    mag = e.select(
        e.compare(idx_vec, k_vec, "GE"), e.unary("abs", column), e.full(-1.0, vec, a.dtype)
    )
    best = e.reduce_simple(mag, float("-inf"), [r - 2], "maximum")
    hits = e.select(
        e.compare(mag, broadcast_leading(ctx, best, vec), "EQ"), idx_vec, e.full(n, vec, INDEX)
    )
    p = e.reduce_simple(hits, n, [r - 2], "minimum")  # (...,)
    p = e.select(e.compare(p, e.full(n, p.shape, INDEX), "LT"), p, _bcast_scalar(ctx, k, p.shape))
    # 2. swap rows k and p
    p_mat = broadcast_leading(ctx, p, a.shape)
    row_is_k, row_is_p = e.compare(row, k_mat, "EQ"), e.compare(row, p_mat, "EQ")
    row_k = pick(ctx, row_is_k, a, r - 2)  # (..., n) over columns
    row_p = pick(ctx, row_is_p, a, r - 2)
    as_rows = list(range(r - 2)) + [r - 1]
    a = e.select(
        row_is_k,
        e.broadcast_in_dim(row_p, a.shape, as_rows),
        e.select(row_is_p, e.broadcast_in_dim(row_k, a.shape, as_rows), a),
    )
    p_vec = broadcast_leading(ctx, p, vec)
    vec_is_k, vec_is_p = e.compare(idx_vec, k_vec, "EQ"), e.compare(idx_vec, p_vec, "EQ")
    perm_k = pick(ctx, vec_is_k, perm, r - 2)
    perm_p = pick(ctx, vec_is_p, perm, r - 2)
    perm = e.select(
        vec_is_k,
        broadcast_leading(ctx, perm_p, vec),
        e.select(vec_is_p, broadcast_leading(ctx, perm_k, vec), perm),
    )
    one = e.full(1, p.shape, INDEX)
    piv = e.select(vec_is_k, broadcast_leading(ctx, e.binary("add", p, one), vec), piv)
    # 3. eliminate below the pivot
    pivot_row = row_p  # the new row k
    cols_vec = e.iota(pivot_row.shape, r - 2, INDEX)
    d = pick(  # (...,) A[k, k]
        ctx, e.compare(cols_vec, _bcast_scalar(ctx, k, pivot_row.shape), "EQ"), pivot_row, r - 2
    )
    zero_pivot = e.compare(d, e.full(0.0, d.shape, a.dtype), "EQ")
    k1 = e.binary("add", _bcast_scalar(ctx, k, p.shape), one)
    info = e.select(
        e.binary("and", zero_pivot, e.compare(info, e.full(0, info.shape, INDEX), "EQ")), k1, info
    )
    safe_d = e.select(zero_pivot, e.full(1.0, d.shape, a.dtype), d)
    column = pick(ctx, col_is_k, a, r - 1)
    below = e.compare(idx_vec, k_vec, "GT")
    mult = e.select(
        below,
        e.binary("divide", column, broadcast_leading(ctx, safe_d, vec)),
        e.full(0.0, vec, a.dtype),
    )
    mult = e.select(broadcast_leading(ctx, zero_pivot, vec), e.full(0.0, vec, a.dtype), mult)
    outer = e.binary(
        "multiply",
        e.broadcast_in_dim(mult, a.shape, list(range(r - 1))),
        e.broadcast_in_dim(pivot_row, a.shape, as_rows),
    )
    right = e.compare(col, k_mat, "GT")
    a = e.binary("subtract", a, e.select(right, outer, ctx.full_like(0.0, a)))
    below_mat = e.compare(row, k_mat, "GT")
    a = e.select(
        e.binary("and", below_mat, col_is_k),
        e.broadcast_in_dim(mult, a.shape, list(range(r - 1))),
        a,
    )
    return a, piv, perm, info


def lu_factor(ctx: LoweringContext, a: Value) -> tuple[Value, Value, Value, Value]:
    """(LU, pivots (1-based, int32), perm (row i of P A is row perm[i] of A), info) of an
    (..., m, n) matrix: min(m, n) elimination steps, min(m, n) pivots."""
    e = ctx.emit
    m, n = a.shape[-2:]
    steps = min(m, n)
    vec = a.shape[:-1]
    batch = a.shape[:-2]
    inits = [
        e.scalar(0, INDEX),
        a,
        e.full(0, vec, INDEX),
        e.iota(vec, len(vec) - 1, INDEX),
        e.full(0, batch, INDEX),
    ]

    def cond(k: Value, *_: Value) -> list[Value]:
        return [e.compare(k, e.scalar(steps, INDEX), "LT")]

    def body(k: Value, lu: Value, piv: Value, perm: Value, info: Value) -> list[Value]:
        lu, piv, perm, info = _lu_step(ctx, m, k, lu, piv, perm, info)
        return [e.binary("add", k, e.scalar(1, INDEX)), lu, piv, perm, info]

    _, lu, piv, perm, info = e.while_(inits, cond, body)
    if steps < m:
        piv = e.slice(piv, [0] * piv.rank, (*batch, steps), [1] * piv.rank)
    return lu, piv, perm, info


def square_float32(node: fx.Node) -> str | None:
    """Support predicate: a float32 stack of square matrices as the first argument."""
    why = float32_only(node)
    if why:
        return why
    a = node.args[0].meta["val"]
    if a.ndim < 2 or a.shape[-1] != a.shape[-2]:
        return "only square (..., n, n) matrices are lowered"
    return None


def _lu_support(node) -> str | None:
    if node.target is aten.linalg_lu_factor_ex.default:
        why = float32_only(node) or (
            None if node.args[0].meta["val"].ndim >= 2 else "needs a (..., m, n) matrix"
        )
        if why:
            return why
        pivot = node.kwargs.get("pivot", node.args[1] if len(node.args) > 1 else True)
        if not pivot:
            return "LU without pivoting is not lowered"
        return None
    why = square_float32(node)
    if why:
        return why
    if node.target is aten._linalg_solve_ex.default:
        left = node.kwargs.get("left", node.args[2] if len(node.args) > 2 else True)
        if not left:
            return "solve with left=False is not lowered"
    return None


@lowering(aten.linalg_lu_factor_ex.default, supports=_lu_support)
def _lower_lu_factor_ex(
    ctx: LoweringContext, a: Value, pivot: bool = True, check_errors: bool = False
) -> tuple[Value, Value, Value]:
    lu, piv, _, info = lu_factor(ctx, a)
    return lu, piv, info


def _diag_stats(ctx: LoweringContext, lu: Value, piv: Value) -> tuple[Value, Value]:
    """(diagonal of U, sign of the permutation as a float (...,))."""
    e = ctx.emit
    diag = _diagonal(ctx, lu)
    swapped = e.compare(
        piv,
        e.binary("add", e.iota(piv.shape, piv.rank - 1, INDEX), e.full(1, piv.shape, INDEX)),
        "NE",
    )
    flips = e.reduce_simple(e.convert(swapped, INDEX), 0, [piv.rank - 1], "add")
    odd = e.compare(
        e.binary("and", flips, e.full(1, flips.shape, INDEX)), e.full(1, flips.shape, INDEX), "EQ"
    )
    sign = e.select(odd, e.full(-1.0, flips.shape, lu.dtype), e.full(1.0, flips.shape, lu.dtype))
    return diag, sign


def _det_lu(ctx: LoweringContext, a: Value) -> tuple[Value, Value]:
    """LU and pivots as eager's det/slogdet return them: of Aᵀ when A is contiguous (LAPACK
    wants column-major; det(Aᵀ) = det(A)), and the backward formula relies on which one it is."""
    if ctx.node.args[0].meta["val"].is_contiguous():
        r = a.rank
        a = ctx.emit.transpose(a, [*range(r - 2), r - 1, r - 2])
    lu, piv, _, _ = lu_factor(ctx, a)
    return lu, piv


@lowering(aten._linalg_det.default, supports=square_float32)
def _lower_linalg_det(ctx: LoweringContext, a: Value) -> tuple[Value, Value, Value]:
    e = ctx.emit
    lu, piv = _det_lu(ctx, a)
    diag, sign = _diag_stats(ctx, lu, piv)
    det = e.binary("multiply", sign, e.reduce_simple(diag, 1.0, [diag.rank - 1], "multiply"))
    return det, lu, piv


@lowering(aten._linalg_slogdet.default, supports=square_float32)
def _lower_linalg_slogdet(ctx: LoweringContext, a: Value) -> tuple[Value, Value, Value, Value]:
    """sign = perm sign * prod(sign(diag)); logabsdet = sum(log|diag|) (-inf, sign 0 if
    singular, as torch reports)."""
    e = ctx.emit
    lu, piv = _det_lu(ctx, a)
    diag, sign = _diag_stats(ctx, lu, piv)
    diag_sign = e.reduce_simple(e.unary("sign", diag), 1.0, [diag.rank - 1], "multiply")
    sign = e.binary("multiply", sign, diag_sign)
    logabs = e.reduce_simple(e.unary("log", e.unary("abs", diag)), 0.0, [diag.rank - 1], "add")
    return sign, logabs, lu, piv


def lu_solve(
    ctx: LoweringContext, lu: Value, perm: Value, b: Value, adjoint: bool = False
) -> Value:
    """Solve A X = B (or Aᵀ X = B) given P A = L U; ``b`` is (..., n, k) with LU's batch dims."""
    e = ctx.emit
    r = lu.rank
    # permutation matrix P[i, j] = (perm[i] == j)
    perm_mat = e.broadcast_in_dim(perm, lu.shape, list(range(r - 1)))
    p = e.convert(e.compare(perm_mat, e.iota(lu.shape, r - 1, INDEX), "EQ"), lu.dtype)
    batch = list(range(r - 2))
    if not adjoint:  # X = U⁻¹ L⁻¹ P B
        pb = e.dot_general(p, b, ((r - 1,), (r - 2,)), (batch, batch))
        y = triangular_solve(ctx, lu, pb, left=True, lower=True, unit_diagonal=True)
        return triangular_solve(ctx, lu, y, left=True, lower=False, unit_diagonal=False)
    # Aᵀ = Uᵀ Lᵀ P, so X = Pᵀ L⁻ᵀ U⁻ᵀ B
    y = triangular_solve(ctx, lu, b, left=True, lower=False, unit_diagonal=False, transpose=True)
    z = triangular_solve(ctx, lu, y, left=True, lower=True, unit_diagonal=True, transpose=True)
    return e.dot_general(p, z, ((r - 2,), (r - 2,)), (batch, batch))


def _perm_from_pivots(ctx: LoweringContext, piv: Value, m: int | None = None) -> Value:
    """Row permutation of length ``m`` (row i of P A is row perm[i] of A) from LAPACK's 1-based
    swap sequence: a ``stablehlo.while`` applying swap (k, piv[k] - 1) for each pivot k."""
    e = ctx.emit
    steps = piv.shape[-1]
    r = piv.rank
    shape = (*piv.shape[:-1], steps if m is None else m)
    idx = e.iota(piv.shape, r - 1, INDEX)
    rows = e.iota(shape, r - 1, INDEX)

    def cond(k: Value, *_: Value) -> list[Value]:
        return [e.compare(k, e.scalar(steps, INDEX), "LT")]

    def body(k: Value, perm: Value) -> list[Value]:
        is_k_piv = e.compare(idx, _bcast_scalar(ctx, k, piv.shape), "EQ")
        target = e.binary(
            "subtract", pick(ctx, is_k_piv, piv, r - 1), e.full(1, piv.shape[:-1], INDEX)
        )
        is_k = e.compare(rows, _bcast_scalar(ctx, k, shape), "EQ")
        is_t = e.compare(rows, broadcast_leading(ctx, target, shape), "EQ")
        perm_k = broadcast_leading(ctx, pick(ctx, is_k, perm, r - 1), shape)
        perm_t = broadcast_leading(ctx, pick(ctx, is_t, perm, r - 1), shape)
        perm = e.select(is_k, perm_t, e.select(is_t, perm_k, perm))
        return [e.binary("add", k, e.scalar(1, INDEX)), perm]

    return e.while_([e.scalar(0, INDEX), rows], cond, body)[1]


def _lu_unpack_support(node) -> str | None:
    lu = node.args[0].meta["val"]
    if lu.dtype != torch.float32:
        return f"dtype {lu.dtype} not supported"
    return None


@lowering(aten.lu_unpack.default, supports=_lu_unpack_support)
def lu_unpack(
    ctx: LoweringContext,
    lu: Value,
    piv: Value,
    unpack_data: bool = True,
    unpack_pivots: bool = True,
) -> tuple[Value, Value, Value]:
    """(P, L, U) with A = P L U: P[i, j] = (perm[j] == i), L the unit lower (m, k) part and U
    the upper (k, n) part of the packed factors, k = min(m, n). Parts not asked for
    (``unpack_data`` / ``unpack_pivots`` false) come back empty, as eager returns them."""
    e = ctx.emit
    r = lu.rank
    m, n = lu.shape[-2:]
    k = min(m, n)
    batch = lu.shape[:-2]
    perm = _perm_from_pivots(ctx, piv, m)
    p_shape = (*batch, m, m)
    perm_cols = e.broadcast_in_dim(perm, p_shape, [*range(r - 2), r - 1])
    p = e.convert(e.compare(perm_cols, e.iota(p_shape, r - 2, INDEX), "EQ"), lu.dtype)
    zero = [0] * r
    low = e.slice(lu, zero, (*batch, m, k), [1] * r)
    low = e.select(_triangle_mask(ctx, low.shape, True), low, ctx.full_like(0.0, low))
    eye = e.compare(e.iota(low.shape, r - 2, INDEX), e.iota(low.shape, r - 1, INDEX), "EQ")
    low = e.select(eye, ctx.full_like(1.0, low), low)
    up = e.slice(lu, zero, (*batch, k, n), [1] * r)
    up = e.select(_triangle_mask(ctx, up.shape, False), up, ctx.full_like(0.0, up))
    outs = [p, low, up]
    for i, out in enumerate(outs):
        want = ctx.out_type(i)
        if want.shape != out.shape:  # not requested: an empty (0,) tensor
            outs[i] = e.full(0, want.shape, want.dtype)
    return tuple(outs)


def _lu_solve_support(node) -> str | None:
    lu, _, b = node.args[:3]
    bad = {str(v.meta["val"].dtype) for v in (lu, b)} - {str(torch.float32)}
    return f"dtype {', '.join(sorted(bad))} not supported" if bad else None


@lowering(aten.linalg_lu_solve.default, supports=_lu_solve_support)
def _lower_linalg_lu_solve(
    ctx: LoweringContext,
    lu: Value,
    piv: Value,
    b: Value,
    *,
    left: bool = True,
    adjoint: bool = False,
) -> Value:
    """X with op(A) X = B (``left``) or X op(A) = B, for A given by its LU factors."""
    e = ctx.emit
    out = ctx.out_type().shape
    batch = out[:-2]
    lu = ctx.broadcast_to(lu, batch + lu.shape[-2:])
    piv = ctx.broadcast_to(piv, batch + piv.shape[-1:])
    b = ctx.broadcast_to(b, out)
    perm = _perm_from_pivots(ctx, piv)
    if left:
        return lu_solve(ctx, lu, perm, b, adjoint)
    # X A = B  <=>  Aᵀ Xᵀ = Bᵀ
    swap = list(range(len(out) - 2)) + [len(out) - 1, len(out) - 2]
    return e.transpose(lu_solve(ctx, lu, perm, e.transpose(b, swap), not adjoint), swap)


@lowering(aten._linalg_solve_ex.default, supports=_lu_support)
def _lower_linalg_solve_ex(
    ctx: LoweringContext, a: Value, b: Value, *, left: bool = True, check_errors: bool = False
) -> tuple[Value, Value, Value, Value]:
    e = ctx.emit
    lu_shape = ctx.out_type(1).shape
    a = ctx.broadcast_to(a, lu_shape)
    lu, piv, perm, info = lu_factor(ctx, a)
    out_shape = ctx.out_type(0).shape
    vector = len(out_shape) == len(lu_shape) - 1
    if vector:  # torch's vector case: B is (..., n) and solves as a single column
        b = e.reshape(ctx.broadcast_to(b, out_shape), (*out_shape, 1))
    else:
        b = ctx.broadcast_to(b, out_shape)
    batch = b.shape[:-2]  # B's batch dims may broadcast A's
    lu_b = ctx.broadcast_to(lu, batch + lu_shape[-2:])
    perm_b = ctx.broadcast_to(perm, batch + lu_shape[-1:])
    x = lu_solve(ctx, lu_b, perm_b, b)
    if vector:
        x = e.reshape(x, out_shape)
    return x, lu, piv, info


@lowering(aten.linalg_inv_ex.default, supports=square_float32)
def _lower_linalg_inv_ex(
    ctx: LoweringContext, a: Value, *, check_errors: bool = False
) -> tuple[Value, Value]:
    e = ctx.emit
    lu, _, perm, info = lu_factor(ctx, a)
    r = a.rank
    eye = e.convert(
        e.compare(e.iota(a.shape, r - 2, INDEX), e.iota(a.shape, r - 1, INDEX), "EQ"), a.dtype
    )
    return lu_solve(ctx, lu, perm, eye), info
