"""Golden StableHLO for matmul rules."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.testing import FileCheck

from tests.helpers import lower_to_text


def test_linear_is_dot_general_plus_bias():
    # sink_transposes: the weight's transpose is folded into the contracting dims
    text = lower_to_text(F.linear, torch.randn(4, 16), torch.randn(8, 16), torch.randn(8))
    FileCheck().check_not("stablehlo.transpose").check("stablehlo.dot_general").check_same(
        "contracting_dims = [1] x [1]"
    ).check("stablehlo.add").check_not("custom_call").run(text)


def test_bmm_has_batching_dims():
    text = lower_to_text(torch.bmm, torch.randn(2, 4, 16), torch.randn(2, 16, 8))
    FileCheck().check("stablehlo.dot_general").check_same("batching_dims = [0] x [0]").check_same(
        "contracting_dims = [2] x [1]"
    ).run(text)


def test_bf16_matmul_accumulates_in_f32():
    text = lower_to_text(torch.mm, torch.randn(4, 16).bfloat16(), torch.randn(16, 8).bfloat16())
    FileCheck().check("stablehlo.dot_general").check_same("-> tensor<4x8xf32>").check(
        "stablehlo.convert"
    ).check_same("tensor<4x8xbf16>").run(text)


def test_addmv_is_matrix_vector_dot_plus_scaled_bias():
    text = lower_to_text(
        lambda b, m, v: torch.addmv(b, m, v, beta=0.5),
        torch.randn(4),
        torch.randn(4, 8),
        torch.randn(8),
    )
    FileCheck().check("stablehlo.dot_general").check_same(
        "contracting_dims = [1] x [0]"
    ).check_same("-> tensor<4xf32>").check("5.000000e-01").check("stablehlo.add").run(text)


def test_addbmm_contracts_the_batch_dim_too():
    text = lower_to_text(
        torch.addbmm, torch.randn(4, 5), torch.randn(3, 4, 6), torch.randn(3, 6, 5)
    )
    FileCheck().check("stablehlo.dot_general").check_same(
        "contracting_dims = [0, 2] x [0, 1]"
    ).check_same("-> tensor<4x5xf32>").check_not("stablehlo.reduce").run(text)
