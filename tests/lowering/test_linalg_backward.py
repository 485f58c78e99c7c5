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
    "det": (lambda a: torch.linalg.det(a), (lambda: _general(2, 4, 4),)),
    "lu-factor": (lambda a: torch.linalg.lu_factor(a).LU, (lambda: _general(2, 4, 4),)),
    "slogdet": (lambda a: torch.linalg.slogdet(a).logabsdet, (lambda: _general(2, 4, 4),)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_linalg_gradients_match_eager(name: str) -> None:
    fn, factories = CASES[name]
    torch.manual_seed(0)
    assert_compiled_gradients_match(fn, [make() for make in factories], **TOL)
