"""Golden StableHLO for matmul rules."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.testing import FileCheck

from tests.helpers import lower_to_text


def test_linear_is_dot_general_plus_bias():
    text = lower_to_text(F.linear, torch.randn(4, 16), torch.randn(8, 16), torch.randn(8))
    FileCheck().check("stablehlo.transpose").check("stablehlo.dot_general").check_same(
        "contracting_dims = [1] x [0]"
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
