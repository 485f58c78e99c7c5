"""``linalg.ldl_factor_ex`` / ``ldl_solve``: LAPACK's Bunch-Kaufman pivots, LD and solves."""

from __future__ import annotations

import pytest
import torch

from neuron_compile.lowering.stablehlo.ldl import MAX_UNBLOCKED, ldl_factor_ex, ldl_solve
from tests.helpers import lower_to_text


def _matrices(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(4, n, n, generator=g)
    a[1] = a[1] + a[1].mT
    a[2, 0, 0] = 0.0  # a zero leading diagonal forces a 2x2 pivot
    a[3] = torch.diag(torch.tensor([1e-3] + [1.0] * (n - 1))) + 0.5  # small pivot: interchange
    return a


@pytest.mark.parametrize("n", [1, 2, 5, 7])
def test_reference_follows_lapack_pivots_exactly(n):
    for seed in range(10):
        a = _matrices(n, seed)
        ld, piv, info = torch.linalg.ldl_factor_ex(a)
        ld_r, piv_r, info_r = ldl_factor_ex(a)
        assert torch.equal(piv_r, piv) and torch.equal(info_r, info)
        torch.testing.assert_close(ld_r, ld, rtol=1e-4, atol=1e-5)
        b = torch.randn(4, n, 3, generator=torch.Generator().manual_seed(seed))
        expected = torch.linalg.ldl_solve(ld, piv, b)
        torch.testing.assert_close(ldl_solve(ld, piv, b), expected, rtol=1e-3, atol=1e-4)


def test_two_by_two_pivots_are_exercised():
    piv = torch.linalg.ldl_factor_ex(_matrices(5, 0))[1]
    assert (piv < 0).any() and (piv > 0).any()


def test_compiled_factor_and_solve_match_eager_without_fallback():
    def fn(a, b):
        ld, piv, info = torch.linalg.ldl_factor_ex(a)
        return ld, piv, info, torch.linalg.ldl_solve(ld, piv, b)

    a, b = _matrices(5, 3), torch.randn(4, 5, 2)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="neuron", fullgraph=True, options={"fallback": "error"})
    for actual, expected in zip(compiled(a, b), fn(a, b), strict=True):
        assert actual.dtype == expected.dtype and actual.shape == expected.shape
        if expected.is_floating_point():
            torch.testing.assert_close(actual, expected, rtol=1e-3, atol=1e-4)
        else:
            assert torch.equal(actual, expected)


def test_singular_matrix_reports_lapack_info():
    a = torch.zeros(1, 3, 3)
    a[0, 2, 2] = 1.0
    assert torch.equal(ldl_factor_ex(a)[2], torch.linalg.ldl_factor_ex(a)[2])


def test_lowering_is_unrolled_selects_without_custom_calls():
    text = lower_to_text(lambda a: torch.linalg.ldl_factor_ex(a), torch.randn(2, 3, 3))
    assert "custom_call" not in text and "stablehlo.select" in text


def test_large_matrices_fall_back_with_a_reason():
    from neuron_compile.lowering.stablehlo.ldl import _small_float32

    a = torch.randn(MAX_UNBLOCKED + 1, MAX_UNBLOCKED + 1)
    gm = torch.fx.symbolic_trace(lambda x: torch.ops.aten.linalg_ldl_factor_ex(x))
    node = next(n for n in gm.graph.nodes if n.op == "call_function")
    node.args[0].meta["val"] = a
    assert "blockwise" in _small_float32(node)
