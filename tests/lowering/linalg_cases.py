"""LINALG_CASES: linear-algebra entries of the OP_CASES table (issue 3): Cholesky, triangular
solves, and the LU-based solve / inv / det / slogdet / lu_factor. Inputs are well conditioned
(symmetric positive-definite ``M Mᵀ + n·I``, or triangular with a dominant diagonal) so float32
results agree with eager's LAPACK to ~1e-4."""

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
]
