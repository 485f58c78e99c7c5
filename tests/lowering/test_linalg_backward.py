"""Gradients of the linear-algebra rules through ``torch.compile(fn, backend="neuron")`` vs eager.

The backward graphs of cholesky / solve / inv / det / slogdet are built from the same ops
(triangular solves, LU solves with the saved factors, matmuls), so a wrong forward output or a
missing backward rule fails here. Same harness as ``test_backward_numerics.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from tests.parity import assert_compiled_gradients_match

TOL = {"rtol": 1e-4, "atol": 1e-4}


def _spd(*shape: int) -> torch.Tensor:
    m = torch.randn(shape)
    return m @ m.mT + shape[-1] * torch.eye(shape[-1])


def _general(*shape: int) -> torch.Tensor:
    return torch.randn(shape) + 2 * torch.eye(shape[-1])


def _lower(*shape: int) -> torch.Tensor:
    return torch.randn(shape).tril() * 0.3 + 2 * torch.eye(shape[-1])


CASES: dict[str, tuple[Callable[..., Any], tuple[Callable[[], torch.Tensor], ...]]] = {
    "cholesky": (lambda a: torch.linalg.cholesky(a), (lambda: _spd(2, 4, 4),)),
    "cholesky-upper": (lambda a: torch.linalg.cholesky(a, upper=True), (lambda: _spd(4, 4),)),
    "solve-triangular": (
        lambda a, b: torch.linalg.solve_triangular(a, b, upper=False),
        (lambda: _lower(2, 4, 4), lambda: torch.randn(2, 4, 3)),
    ),
    "solve": (
        lambda a, b: torch.linalg.solve(a, b),
        (lambda: _general(2, 4, 4), lambda: torch.randn(2, 4, 3)),
    ),
    "inv": (lambda a: torch.linalg.inv(a), (lambda: _general(3, 4, 4),)),
    # Two effect tokens in one forward, each unlifted after partitioning (saved.py).
    "inv-twice": (
        lambda a: torch.linalg.inv(a) + torch.linalg.inv(a + 1),
        (lambda: _general(3, 4, 4),),
    ),
    "det": (lambda a: torch.linalg.det(a), (lambda: _general(2, 4, 4),)),
    "lu-factor": (lambda a: torch.linalg.lu_factor(a).LU, (lambda: _general(2, 4, 4),)),
    "slogdet": (lambda a: torch.linalg.slogdet(a).logabsdet, (lambda: _general(2, 4, 4),)),
    "cholesky-solve": (
        lambda b, a: torch.cholesky_solve(b, torch.linalg.cholesky(a)),
        (lambda: torch.randn(2, 4, 3), lambda: _spd(2, 4, 4)),
    ),
    "cholesky-inverse-upper": (
        lambda a: torch.cholesky_inverse(torch.linalg.cholesky(a, upper=True), upper=True),
        (lambda: _spd(4, 4),),
    ),
    "linalg-lu": (lambda a: sum(torch.linalg.lu(a)[1:]), (lambda: _general(2, 4, 4),)),
    # Jacobi eigh / SVD: sign-invariant outputs only (the vectors' signs are not LAPACK's)
    "eigvalsh": (lambda a: torch.linalg.eigvalsh(a), (lambda: torch.randn(2, 4, 4),)),
    "eigh-abs": (
        lambda a: torch.linalg.eigh(a).eigenvectors.abs(),
        (lambda: torch.randn(4, 4),),
    ),
    "svdvals": (lambda a: torch.linalg.svdvals(a), (lambda: torch.randn(2, 5, 3),)),
    "svd-product": (
        lambda a: (lambda u, s, vh: u @ vh + s.sum())(*torch.linalg.svd(a, full_matrices=False)),
        (lambda: torch.randn(3, 5),),
    ),
    "pinv": (lambda a: torch.linalg.pinv(a), (lambda: torch.randn(2, 5, 3),)),
    "qr": (lambda a: sum(torch.linalg.qr(a)), (lambda: torch.randn(4, 4),)),
    "qr-tall-batched": (lambda a: torch.linalg.qr(a).R, (lambda: torch.randn(2, 5, 3),)),
    "householder-product": (
        lambda a, tau: torch.linalg.householder_product(a, tau),
        (lambda: torch.randn(5, 3), lambda: torch.rand(3) + 0.5),
    ),
    "matrix-exp": (lambda a: torch.linalg.matrix_exp(a), (lambda: torch.randn(2, 3, 3),)),
    "pinv-hermitian": (
        lambda a: torch.linalg.pinv(a + a.mT, hermitian=True),
        (lambda: _general(4, 4),),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_linalg_gradients_match_eager(name: str) -> None:
    fn, factories = CASES[name]
    torch.manual_seed(0)
    assert_compiled_gradients_match(fn, [make() for make in factories], **TOL)
