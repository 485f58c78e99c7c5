"""Golden StableHLO for linear-algebra rules."""

from __future__ import annotations

import torch
from torch.testing import FileCheck

from neuron_compile.lowering import registry
from tests.helpers import lower_to_text, trace_aten


def _spd(n: int) -> torch.Tensor:
    m = torch.randn(n, n)
    return m @ m.T + n * torch.eye(n)


def test_cholesky_is_one_op_masked_to_its_triangle():
    text = lower_to_text(lambda a: torch.linalg.cholesky(a, upper=True), _spd(4))
    # lower = false is the default, which the pretty printer omits
    FileCheck().check("stablehlo.cholesky %arg0 :").check("stablehlo.select").check_not(
        "stablehlo.while"
    ).run(text)
    text = lower_to_text(torch.linalg.cholesky, _spd(4))
    FileCheck().check("stablehlo.cholesky %arg0, lower = true").run(text)


def test_solve_triangular_attributes():
    text = lower_to_text(
        lambda a, b: torch.linalg.solve_triangular(a, b, upper=False, unitriangular=True),
        torch.randn(2, 4, 4),
        torch.randn(4, 3),
    )
    FileCheck().check("stablehlo.broadcast_in_dim").check("stablehlo.triangular_solve").check_same(
        "left_side = true"
    ).check_same("lower = true").check_same(
        "transpose_a = #stablehlo<transpose NO_TRANSPOSE>"
    ).check_same("unit_diagonal = true").check_same("-> tensor<2x4x3xf32>").run(text)


def test_triangular_solve_transpose():
    text = lower_to_text(
        lambda a, b: torch.triangular_solve(b, a, transpose=True),
        torch.randn(3, 3),
        torch.randn(3, 2),
    )
    FileCheck().check("stablehlo.triangular_solve").check_same("lower = false").check_same(
        "transpose_a = #stablehlo<transpose TRANSPOSE>"
    ).run(text)


def test_solve_is_one_while_loop_then_two_triangular_solves():
    text = lower_to_text(torch.linalg.solve, torch.randn(2, 4, 4), torch.randn(2, 4, 3))
    FileCheck().check_count("stablehlo.while", 1, exactly=True).check(
        "stablehlo.dot_general"
    ).check("stablehlo.triangular_solve").check_same("unit_diagonal = true").check(
        "stablehlo.triangular_solve"
    ).check_same("unit_diagonal = false").check_not("custom_call").run(text)


def test_det_reduces_the_diagonal_product():
    text = lower_to_text(torch.linalg.det, torch.randn(3, 3))
    FileCheck().check("stablehlo.while").check("stablehlo.multiply").check_not(
        "triangular_solve"
    ).run(text)


def test_non_float32_is_rejected_with_a_reason():
    gm = trace_aten(torch.linalg.cholesky_ex, _spd(3).double())
    (node,) = [n for n in gm.graph.nodes if n.target is torch.ops.aten.linalg_cholesky_ex.default]
    assert isinstance(registry.lookup(node), registry.Lowering)  # float64 runs as float32
    # eager has no bf16 linalg kernels to trace with: retype the traced input instead
    gm = trace_aten(torch.linalg.inv_ex, torch.randn(3, 3))
    (node,) = [n for n in gm.graph.nodes if n.target is torch.ops.aten.linalg_inv_ex.default]
    node.args[0].meta["val"] = torch.empty(3, 3, dtype=torch.bfloat16)
    assert "dtype torch.bfloat16 not supported" in registry.lookup(node)


def test_cholesky_solve_is_two_triangular_solves():
    text = lower_to_text(
        lambda b, a: torch.cholesky_solve(b, a), torch.randn(4, 2), torch.randn(4, 4).tril()
    )
    FileCheck().check("stablehlo.triangular_solve").check_same("NO_TRANSPOSE").check(
        "stablehlo.triangular_solve"
    ).check_same("transpose_a = #stablehlo<transpose TRANSPOSE>").check_not("stablehlo.while").run(
        text
    )


def test_eigh_is_a_jacobi_while_then_an_ascending_sort():
    text = lower_to_text(torch.linalg.eigvalsh, torch.randn(2, 3, 3))
    # each rotation: c = rsqrt(1 + t^2), then J^T A J (two dot_generals); eigenvalues sorted
    FileCheck().check("stablehlo.while").check("stablehlo.rsqrt").check(
        "stablehlo.dot_general"
    ).check("stablehlo.dot_general").check("stablehlo.sort").check("stablehlo.compare LT").run(text)
    FileCheck().check_not("custom_call").run(text)


def test_svd_is_one_sided_jacobi_sorted_descending():
    text = lower_to_text(torch.linalg.svdvals, torch.randn(5, 3))
    # one-sided: the Gram matrix A^T A of the rotated columns, no J^T A product
    FileCheck().check("stablehlo.while").check("stablehlo.dot_general").check_same(
        "contracting_dims = [0] x [0]"
    ).check("stablehlo.sqrt").check("stablehlo.sort").check("stablehlo.compare GT").run(text)
    FileCheck().check_not("custom_call").run(text)


def test_geqrf_is_one_householder_while_with_lapack_signs():
    text = lower_to_text(torch.geqrf, torch.randn(5, 3))
    # column norm, beta = -sign(alpha) norm (a select on alpha < 0), rank-1 update v (vᵀ A)
    FileCheck().check("stablehlo.while").check("stablehlo.sqrt").check("compare LT").check_same(
        "FLOAT"
    ).check("stablehlo.negate").check("stablehlo.dot_general").run(text)
    FileCheck().check_not("custom_call").run(text)


def test_matrix_exp_squares_in_a_while_after_a_taylor_polynomial():
    text = lower_to_text(torch.linalg.matrix_exp, torch.randn(2, 3, 3))
    # the Horner chain ends with the 1/1 term; then the squaring loop up to the largest s
    FileCheck().check("stablehlo.power").check("stablehlo.dot_general").check(
        "stablehlo.while"
    ).check("stablehlo.dot_general").run(text)
