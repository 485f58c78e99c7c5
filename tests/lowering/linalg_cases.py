"""LINALG_CASES: linear-algebra entries of the OP_CASES table (issue 3): Cholesky, triangular
solves, the LU-based solve / inv / det / slogdet / lu_factor, and the Jacobi eigh / SVD / pinv.
Inputs are well conditioned (symmetric positive-definite ``M Mᵀ + n·I``, or triangular with a
dominant diagonal) so float32 results agree with eager's LAPACK to ~1e-4. Eigen- and singular
vectors are compared through sign-invariant forms (|V|, U Vh): their signs are not LAPACK's."""

from __future__ import annotations

import torch

from tests.lowering.opcase import F32, OpCase, randn

LINALG_TOL = {torch.float32: (1e-4, 1e-4)}


def spd(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Symmetric positive-definite ``M Mᵀ + n·I``."""
    m = torch.randn(shape)
    n = shape[-1]
    return (m @ m.mT + n * torch.eye(n)).to(dtype)


def general(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A non-symmetric, well-conditioned matrix: random plus a shifted diagonal (pivoting still
    happens, the random part is O(1) like the diagonal)."""
    n = shape[-1]
    return (torch.randn(shape) + 2 * torch.eye(n)).to(dtype)


def lower_tri(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    n = shape[-1]
    return (torch.randn(shape).tril() * 0.3 + 2 * torch.eye(n)).to(dtype)


def upper_tri(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return lower_tri(shape, dtype).mT.contiguous()


def _svd_invariants(u, s, vh):
    return u @ vh, s, u.abs(), vh.abs()


def _geqrf_q(a):
    packed, tau = torch.geqrf(a)
    return packed, tau, torch.linalg.householder_product(packed, tau)


def _ormqr_all(a, c):
    packed, tau = torch.geqrf(a)
    return tuple(
        torch.ormqr(packed, tau, c if left else c.mT, left=left, transpose=t)
        for left in (True, False)
        for t in (False, True)
    )


def _case(name, fn, shapes, make) -> OpCase:
    return OpCase(name, fn, shapes, dtypes=F32, make=make, tol=LINALG_TOL)


LINALG_CASES: list[OpCase] = [
    # Cholesky
    _case("linalg-cholesky", torch.linalg.cholesky, ((5, 5),), spd),
    _case("linalg-cholesky-ex-batched", torch.linalg.cholesky_ex, ((2, 3, 4, 4),), spd),
    _case(
        "linalg-cholesky-upper", lambda a: torch.linalg.cholesky(a, upper=True), ((2, 4, 4),), spd
    ),
    _case(
        "cholesky-ex-not-pd-info", lambda a: torch.linalg.cholesky_ex(-a).info, ((2, 3, 3),), spd
    ),
    # triangular solves
    _case(
        "triangular-solve-upper",
        lambda a, b: torch.triangular_solve(b, a),
        ((2, 4, 4), (2, 4, 3)),
        (upper_tri, randn),
    ),
    _case(
        "triangular-solve-lower-transpose-unit-broadcast",
        lambda a, b: torch.triangular_solve(b, a, upper=False, transpose=True, unitriangular=True),
        ((4, 4), (3, 4, 2)),
        (lower_tri, randn),
    ),
    _case(
        "linalg-solve-triangular-lower",
        lambda a, b: torch.linalg.solve_triangular(a, b, upper=False),
        ((2, 5, 5), (2, 5, 3)),
        (lower_tri, randn),
    ),
    _case(
        "linalg-solve-triangular-right-unit",
        lambda a, b: torch.linalg.solve_triangular(
            a, b, upper=True, left=False, unitriangular=True
        ),
        ((4, 4), (3, 4)),
        (upper_tri, randn),
    ),
    # LU-based
    _case("linalg-lu-factor", torch.linalg.lu_factor, ((5, 5),), general),
    _case("linalg-lu-factor-ex-batched", torch.linalg.lu_factor_ex, ((2, 3, 4, 4),), general),
    _case("linalg-lu-factor-wide", torch.linalg.lu_factor_ex, ((2, 3, 5),), randn),
    _case("linalg-lu-factor-tall", torch.linalg.lu_factor_ex, ((6, 4),), randn),
    _case(
        "lu-unpack-tall", lambda a: torch.lu_unpack(*torch.linalg.lu_factor(a)), ((2, 5, 3),), randn
    ),
    _case(
        "lu-unpack-wide", lambda a: torch.lu_unpack(*torch.linalg.lu_factor(a)), ((3, 5),), randn
    ),
    _case(
        "linalg-lu-factor-ex-singular",
        torch.linalg.lu_factor_ex,
        ((3, 3),),
        lambda s, d: torch.tensor([[1.0, 2, 3], [2, 4, 6], [1, 0, 1]], dtype=d),
    ),
    _case("linalg-solve", torch.linalg.solve, ((2, 4, 4), (2, 4, 3)), (general, randn)),
    _case("linalg-solve-vector", torch.linalg.solve, ((2, 5, 5), (5,)), (general, randn)),
    _case("linalg-solve-broadcast-b", torch.linalg.solve, ((4, 4), (3, 4, 2)), (general, randn)),
    _case("linalg-solve-ex", torch.linalg.solve_ex, ((3, 3), (3, 1)), (general, randn)),
    _case("linalg-inv", torch.linalg.inv, ((2, 3, 5, 5),), general),
    _case("linalg-inv-ex", torch.linalg.inv_ex, ((4, 4),), general),
    _case("linalg-det", torch.linalg.det, ((2, 4, 4),), general),
    _case(
        "det-singular",
        torch.det,
        ((3, 3),),
        lambda s, d: torch.tensor([[1.0, 2, 3], [2, 4, 6], [1, 0, 1]], dtype=d),
    ),
    _case("linalg-slogdet", torch.linalg.slogdet, ((3, 4, 4),), general),
    _case("logdet-spd", torch.logdet, ((2, 5, 5),), spd),
    _case(
        "linalg-lu-solve-modes",
        lambda a, b: (
            [
                torch.linalg.lu_solve(*torch.linalg.lu_factor(a), b, adjoint=adj)
                for adj in (False, True)
            ]
            + [torch.linalg.lu_solve(*torch.linalg.lu_factor(a), b.mT, left=False)]
        ),
        ((2, 4, 4), (2, 4, 3)),
        (general, randn),
    ),
    # Cholesky-based solves and linalg.lu
    _case(
        "cholesky-solve-lower-broadcast",
        lambda b, a: torch.cholesky_solve(b, torch.linalg.cholesky(a)),
        ((2, 4, 3), (4, 4)),
        (randn, spd),
    ),
    _case(
        "cholesky-solve-upper",
        lambda b, a: torch.cholesky_solve(b, torch.linalg.cholesky(a, upper=True), upper=True),
        ((2, 5, 2), (2, 5, 5)),
        (randn, spd),
    ),
    _case(
        "cholesky-inverse",
        lambda a: (
            torch.cholesky_inverse(torch.linalg.cholesky(a)),
            torch.cholesky_inverse(torch.linalg.cholesky(a, upper=True), upper=True),
        ),
        ((2, 4, 4),),
        spd,
    ),
    _case("linalg-lu-square", torch.linalg.lu, ((2, 4, 4),), general),
    _case(
        "linalg-lu-wide-tall",
        lambda a: (*torch.linalg.lu(a), *torch.linalg.lu(a.mT)),
        ((3, 5),),
        randn,
    ),
    _case(
        "lu-unpack-partial",
        lambda a: (
            torch.lu_unpack(*torch.linalg.lu_factor(a), unpack_data=False).P,
            torch.lu_unpack(*torch.linalg.lu_factor(a), unpack_pivots=False).L,
        ),
        ((2, 4, 4),),
        general,
    ),
    # Jacobi eigh / SVD and what is built on them
    _case("eigvalsh", torch.linalg.eigvalsh, ((3, 5, 5),), randn),
    _case(
        "eigh-abs-vectors-upper",
        lambda a: [t.abs() if i else t for i, t in enumerate(torch.linalg.eigh(a, UPLO="U"))],
        ((2, 4, 4),),
        randn,
    ),
    _case(
        "svdvals-tall-wide",
        lambda a: (torch.linalg.svdvals(a), torch.linalg.svdvals(a.mT)),
        ((2, 6, 4),),
        randn,
    ),
    _case(
        "svd-sign-invariant",
        lambda a: _svd_invariants(*torch.linalg.svd(a, full_matrices=False)),
        ((2, 5, 3),),
        randn,
    ),
    _case("pinv", torch.linalg.pinv, ((2, 6, 4),), randn),
    _case(
        "pinv-rank-deficient",
        lambda a, b: torch.linalg.pinv(a @ b),
        ((7, 2), (2, 5)),
        (randn, randn),
    ),
    _case(
        "pinv-hermitian-atol",
        lambda a: (torch.linalg.pinv(a + a.mT, hermitian=True), torch.linalg.pinv(a, atol=0.5)),
        ((2, 4, 4),),
        randn,
    ),
    _case(
        "matrix-rank-cond-nuc",
        lambda a, b: (
            torch.linalg.matrix_rank(a @ b),
            torch.linalg.matrix_rank(a @ a.mT, hermitian=True),
            torch.linalg.cond(b @ b.mT),
            torch.linalg.matrix_norm(a, "nuc"),
            torch.linalg.matrix_norm(a, 2),
        ),
        ((6, 2), (2, 6)),
        (randn, randn),
    ),
    # Householder QR (LAPACK's sign convention, so Q and R match eager exactly)
    _case(
        "qr-modes",
        lambda a: (
            *torch.linalg.qr(a),
            *torch.linalg.qr(a, mode="complete"),
            torch.linalg.qr(a, mode="r").R,
        ),
        ((2, 5, 3),),
        randn,
    ),
    _case("qr-wide", lambda a: tuple(torch.linalg.qr(a)), ((3, 5),), randn),
    _case("geqrf-householder-product", _geqrf_q, ((2, 5, 3),), randn),
    _case("ormqr-sides", _ormqr_all, ((5, 3), (5, 4)), (randn, randn)),
    _case("matrix-exp", torch.linalg.matrix_exp, ((2, 4, 4),), lambda s, d: torch.randn(s) * 3),
]
