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


def test_sign_is_two_compares_not_stablehlo_sign():
    # stablehlo.sign(NaN) is NaN and sign(-0.0) is -0.0; eager gives 0 for both.
    text = lower_to_text(torch.sign, X)
    FileCheck().check("compare GT").check("compare LT").check("stablehlo.subtract").check_not(
        "stablehlo.sign"
    ).run(text)


def test_trunc_selects_ceil_for_negatives():
    text = lower_to_text(torch.trunc, X)
    FileCheck().check("stablehlo.compare").check_same("LT").check("stablehlo.ceil").check(
        "stablehlo.floor"
    ).check("stablehlo.select").run(text)


def test_fmod_is_remainder_and_python_remainder_fixes_the_sign():
    fmod = lower_to_text(lambda a, b: torch.fmod(a, b), X, X)
    FileCheck().check("stablehlo.remainder").check_not("stablehlo.select").run(fmod)
    rem = lower_to_text(lambda a, b: torch.remainder(a, b), X, X)
    FileCheck().check("stablehlo.remainder").check("stablehlo.xor").check("stablehlo.add").check(
        "stablehlo.select"
    ).run(rem)


def test_right_shift_is_arithmetic_for_signed_and_logical_for_uint8():
    signed = lower_to_text(lambda a: a >> 1, torch.ones(4, dtype=torch.int32))
    FileCheck().check("stablehlo.shift_right_arithmetic").run(signed)
    unsigned = lower_to_text(lambda a: a >> 1, torch.ones(4, dtype=torch.uint8))
    FileCheck().check("stablehlo.shift_right_logical").check_same("ui8").run(unsigned)
    left = lower_to_text(lambda a: a << 2, torch.ones(4, dtype=torch.int8))
    FileCheck().check("stablehlo.shift_left").check_same("tensor<4xi8>").run(left)


def test_float_to_narrow_int_truncates_through_i32():
    text = lower_to_text(lambda a: a.to(torch.uint8), X)
    FileCheck().check("tensor<4x8xf32>) -> tensor<4x8xi32>").check(
        "tensor<4x8xi32>) -> tensor<4x8xui8>"
    ).run(text)
    direct = lower_to_text(lambda a: a.to(torch.int32), X)
    FileCheck().check("stablehlo.convert").check_not("stablehlo.convert").run(direct)


def test_signbit_reads_the_sign_bit_of_the_same_width_int():
    text = lower_to_text(torch.signbit, X.bfloat16())
    FileCheck().check("stablehlo.bitcast_convert").check_same("tensor<4x8xi16>").check(
        "stablehlo.compare"
    ).check_same("LT").run(text)


def test_fmax_ignores_nan_operands():
    text = lower_to_text(torch.fmax, X, X)
    FileCheck().check("stablehlo.maximum").check("compare NE").check("stablehlo.select").check(
        "stablehlo.select"
    ).run(text)


def test_isinf_compares_abs_with_infinity():
    text = lower_to_text(torch.isinf, X)
    FileCheck().check("stablehlo.abs").check("0x7F800000").check("stablehlo.compare EQ").run(text)


def test_erfc_switches_to_the_exp_tail_beyond_one():
    text = lower_to_text(torch.erfc, X)
    FileCheck().check("stablehlo.exponential").check("2.000000e+00").check(
        "stablehlo.select"
    ).check("stablehlo.clamp").check("stablehlo.compare GT").check("stablehlo.select").run(text)
    FileCheck().check_not("custom_call").check_not("chlo").run(text)


def test_round_decimals_scales_rounds_half_even_and_unscales():
    text = lower_to_text(lambda a: torch.round(a, decimals=2), X)
    FileCheck().check("1.000000e+02").check("stablehlo.multiply").check(
        "stablehlo.round_nearest_even"
    ).check("stablehlo.divide").run(text)


def test_bf16_rounding_division_rounds_the_quotient_before_truncating():
    b = X.bfloat16()
    text = lower_to_text(lambda x, y: torch.div(x, y, rounding_mode="trunc"), b, b)
    # The rounding is a convert pair (reduce_precision would flush float16 subnormals).
    FileCheck().check("stablehlo.divide").check_same("f32").check("stablehlo.convert").check_same(
        "-> tensor<4x8xbf16>"
    ).check("stablehlo.convert").check_same("-> tensor<4x8xf32>").check("stablehlo.ceil").run(text)


def test_int_floor_division_stays_integer():
    i = torch.ones(4, dtype=torch.int32)
    text = lower_to_text(lambda x, y: torch.div(x, y, rounding_mode="floor"), i, i)
    FileCheck().check("stablehlo.divide").check_same("tensor<4xi32>").check(
        "stablehlo.remainder"
    ).check("stablehlo.select").check_not("f32").run(text)
