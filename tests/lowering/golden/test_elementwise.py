"""Golden StableHLO for elementwise rules: structure, not SSA names."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.testing import FileCheck

from tests.helpers import lower_to_text

X = torch.randn(4, 8)


def test_exp_lowers_to_exponential():
    text = lower_to_text(torch.exp, X)
    FileCheck().check("func.func public @main").check("stablehlo.exponential").check_not(
        "custom_call"
    ).run(text)


def test_broadcast_add_uses_one_broadcast_in_dim():
    text = lower_to_text(torch.add, X, torch.randn(8))
    FileCheck().check("stablehlo.broadcast_in_dim").check_same("dims = [1]").check(
        "stablehlo.add"
    ).check_same("tensor<4x8xf32>").run(text)


def test_int_plus_float_scalar_promotes_to_float():
    text = lower_to_text(lambda a: a + 1.5, torch.ones(4, dtype=torch.int32))
    FileCheck().check("stablehlo.convert").check_same("tensor<4xi32>) -> tensor<4xf32>").check(
        "stablehlo.add"
    ).run(text)


def test_bf16_transcendental_computes_in_f32():
    text = lower_to_text(torch.tanh, X.bfloat16())
    FileCheck().check("tensor<4x8xbf16>) -> tensor<4x8xf32>").check("stablehlo.tanh").check_same(
        "f32"
    ).check("tensor<4x8xf32>) -> tensor<4x8xbf16>").run(text)


def test_erf_is_a_rational_polynomial_without_custom_call():
    text = lower_to_text(torch.erf, X)
    FileCheck().check("stablehlo.clamp").check("stablehlo.multiply").check(
        "stablehlo.divide"
    ).check_not("custom_call").check_not("chlo").run(text)


def test_gelu_exact_and_tanh_differ_in_structure():
    exact = lower_to_text(F.gelu, X)
    approx = lower_to_text(lambda x: F.gelu(x, approximate="tanh"), X)
    FileCheck().check_not("stablehlo.tanh").run(exact)
    FileCheck().check("stablehlo.tanh").run(approx)


def test_comparison_uses_signed_compare_for_ints():
    text = lower_to_text(
        lambda a, b: a < b, torch.ones(4, dtype=torch.int32), torch.ones(4, dtype=torch.int32)
    )
    FileCheck().check("stablehlo.compare").check_same("LT").check_same("SIGNED").run(text)


def test_where_selects_with_broadcast_condition():
    text = lower_to_text(lambda c, a: torch.where(c, a, 0.0), torch.ones(8, dtype=torch.bool), X)
    FileCheck().check("stablehlo.broadcast_in_dim").check("stablehlo.select").run(text)


def test_float64_input_runs_as_float32():
    text = lower_to_text(torch.sin, torch.randn(3, dtype=torch.float64))
    FileCheck().check("tensor<3xf32>").check("stablehlo.sine").check_not("f64").run(text)


def test_nonfinite_constants_spelled_as_bit_patterns():
    text = lower_to_text(lambda a: a.masked_fill(a > 0, float("-inf")), X)
    FileCheck().check("0xFF800000").run(text)
