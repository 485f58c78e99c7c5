"""Golden StableHLO for the transcendental functions StableHLO has no op for: pure stablehlo
(no chlo, no custom_call), built from the numerically careful identities."""

from __future__ import annotations

import torch
from torch.testing import FileCheck

from tests.helpers import lower_to_text

X = torch.randn(4, 8)


def _pure(text: str) -> None:
    FileCheck().check_not("chlo").check_not("custom_call").run(text)


def test_tan_is_stablehlo_tan():
    text = lower_to_text(torch.tan, X)
    FileCheck().check("stablehlo.tan").run(text)
    _pure(text)


def test_inverse_trig_goes_through_atan2():
    asin = lower_to_text(torch.asin, X)
    # asin(x) = atan2(x, sqrt((1 - x)(1 + x)))
    FileCheck().check("stablehlo.subtract").check("stablehlo.add").check(
        "stablehlo.multiply"
    ).check("stablehlo.sqrt").check("stablehlo.atan2").check_same("%arg0").run(asin)
    _pure(asin)
    atan = lower_to_text(torch.atan, X)
    FileCheck().check("1.000000e+00").check("stablehlo.atan2").run(atan)


def test_sinh_uses_expm1_near_zero_and_scaled_exp_elsewhere():
    text = lower_to_text(torch.sinh, X)
    FileCheck().check("stablehlo.exponential_minus_one").check("stablehlo.exponential ").check(
        "stablehlo.select"
    ).run(text)
    _pure(text)


def test_asinh_atanh_use_log1p():
    for fn in (torch.asinh, torch.atanh, torch.acosh):
        text = lower_to_text(fn, X)
        FileCheck().check("stablehlo.log_plus_one").run(text)
        _pure(text)


def test_erfinv_is_a_polynomial_in_log1p():
    text = lower_to_text(torch.erfinv, X)
    FileCheck().check("stablehlo.log_plus_one").check("5.000000e+00").check("stablehlo.sqrt").check(
        "1.50140941"
    ).check("0x7F800000").run(text)
    _pure(text)


def test_bf16_inverse_trig_computes_in_f32():
    text = lower_to_text(torch.acos, X.bfloat16())
    FileCheck().check("tensor<4x8xbf16>) -> tensor<4x8xf32>").check("stablehlo.atan2").check_same(
        "tensor<4x8xf32>"
    ).check("tensor<4x8xf32>) -> tensor<4x8xbf16>").run(text)


def test_int_atan2_promotes_to_float():
    i = torch.ones(4, dtype=torch.int32)
    text = lower_to_text(torch.atan2, i, i)
    FileCheck().check("tensor<4xi32>) -> tensor<4xf32>").check("stablehlo.atan2").run(text)


def test_hypot_scales_by_the_larger_magnitude():
    text = lower_to_text(torch.hypot, X, X)
    FileCheck().check("stablehlo.maximum").check("stablehlo.minimum").check(
        "stablehlo.divide"
    ).check("stablehlo.sqrt").run(text)


def test_log2_exp2():
    log2 = lower_to_text(torch.log2, X)
    FileCheck().check("stablehlo.log").check("1.44269502").check("stablehlo.multiply").run(log2)
    exp2 = lower_to_text(torch.exp2, X)
    FileCheck().check("2.000000e+00").check("stablehlo.power").run(exp2)
