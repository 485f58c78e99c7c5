"""SVD of rank-deficient matrices: U's columns (Vh's rows for wide inputs) stay orthonormal.

Before, a singular value of exactly zero (a zero or repeated column, the all-ones matrix) left a
zero column in U, so U.mT @ U was not the identity and anything built from U or Vh alone (a
polar factor U @ Vh, a projector) was wrong; S and U @ diag(S) @ Vh were right. Eager's columns
for a zero singular value are arbitrary orthonormal completions: so are ours.
"""

from __future__ import annotations

import pytest
import torch


def _svd(a: torch.Tensor):
    return torch.linalg.svd(a, full_matrices=False)


CASES = {
    "ones 3x3": torch.ones(3, 3),
    "rank 1 2x2": torch.tensor([[1.0, 0.0], [0.0, 0.0]]),
    "wide, a zero column pair": torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]),
    "zero matrix": torch.zeros(3, 2),
    "repeated column": torch.randn(6, 4, generator=torch.Generator().manual_seed(0))[
        :, [0, 1, 1, 2]
    ],
    "batched, a zero column": torch.randn(2, 5, 3, generator=torch.Generator().manual_seed(1))
    * torch.tensor([1.0, 0.0, 2.0]),
    "full rank": torch.randn(4, 3, generator=torch.Generator().manual_seed(2)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_singular_vectors_are_orthonormal(name: str) -> None:
    a = CASES[name]
    u, s, vh = torch.compile(_svd, backend="neuron")(a)
    _, s_eager, _ = _svd(a)
    eye = torch.eye(s.shape[-1]).expand(*s.shape[:-1], -1, -1)
    torch.testing.assert_close(u.mT @ u, eye, atol=1e-6, rtol=0)
    torch.testing.assert_close(vh @ vh.mT, eye, atol=1e-6, rtol=0)
    torch.testing.assert_close(s, s_eager, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(u @ torch.diag_embed(s) @ vh, a, atol=1e-5, rtol=1e-5)


def test_the_polar_factor_of_a_singular_matrix_is_orthogonal() -> None:
    def polar(a):
        u, _, vh = torch.linalg.svd(a)
        return u @ vh

    p = torch.compile(polar, backend="neuron")(torch.tensor([[1.0, 0.0], [0.0, 0.0]]))
    torch.testing.assert_close(p @ p.mT, torch.eye(2), atol=1e-6, rtol=0)
    assert p[0, 0].item() == pytest.approx(1.0)  # the kept direction is eager's
