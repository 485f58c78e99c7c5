"""Golden StableHLO for the special functions: pure stablehlo (no chlo, no custom_call), built
from XLA's Lanczos / Euler-Maclaurin / Chebyshev formulas with eager's edge cases."""

from __future__ import annotations

import torch
from torch.testing import FileCheck

from tests.helpers import lower_to_text

X = torch.randn(4, 8)


def _pure(text: str) -> None:
    FileCheck().check_not("chlo").check_not("custom_call").run(text)


def test_lgamma_is_lanczos_with_reflection():
    text = lower_to_text(torch.lgamma, X)
    # the Lanczos sum (first coefficient), log1p(z / 7.5), then log|sin(pi frac|x|)|
    FileCheck().check("676.520386").check("stablehlo.log_plus_one").check("stablehlo.floor").check(
        "stablehlo.sine"
    ).check("stablehlo.select").check("0x7F800000").run(text)
    _pure(text)


def test_digamma_reflects_through_cot_of_the_fractional_part():
    text = lower_to_text(torch.digamma, X)
    FileCheck().check("stablehlo.log_plus_one").check("stablehlo.cosine").check(
        "stablehlo.sine"
    ).check("stablehlo.divide").check("0x7FC00000").run(text)
    _pure(text)


def test_polygamma_is_scaled_hurwitz_zeta():
    text = lower_to_text(lambda a: torch.polygamma(2, a), X)
    # -2! * zeta(3, x): powers with exponent -3, Bernoulli terms of the Euler-Maclaurin tail, then
    # the reflection for negative x
    FileCheck().check("3.000000e+00").check("stablehlo.negate").check("stablehlo.power").check(
        "-1.39544646E-19"
    ).check("stablehlo.sine").check("-2.000000e+00").run(text)
    _pure(text)
    digamma = lower_to_text(lambda a: torch.polygamma(0, a), X)
    FileCheck().check_not("stablehlo.power").run(digamma)


def test_zeta_scalar_overloads_lower():
    for fn in (
        lambda a: torch.special.zeta(a, 2.0),
        lambda a: torch.special.zeta(3.0, a),
        lambda a: torch.special.zeta(a, a),
    ):
        text = lower_to_text(fn, X.abs() + 1.5)
        FileCheck().check("stablehlo.power").check("1.000000e+08").run(text)
        _pure(text)


def test_bessel_is_a_chebyshev_series_and_i0_avoids_early_overflow():
    i0e = lower_to_text(torch.special.i0e, X)
    FileCheck().check("stablehlo.abs").check("0.676795303").check("stablehlo.sqrt").check(
        "8.000000e+00"
    ).run(i0e)
    FileCheck().check_not("stablehlo.exponential").run(i0e)
    _pure(i0e)
    i0 = lower_to_text(torch.i0, X)
    FileCheck().check("stablehlo.exponential").check("stablehlo.log").run(i0)
    i1 = lower_to_text(torch.special.i1e, X)
    FileCheck().check("0.252587199").check("stablehlo.negate").run(i1)
    _pure(i1)


def test_erfcx_has_no_exp_in_the_positive_tail():
    text = lower_to_text(torch.special.erfcx, X)
    FileCheck().check("stablehlo.divide").check("0.563825965").check("stablehlo.exponential").check(
        "stablehlo.select"
    ).run(text)
    _pure(text)


def test_ndtri_uses_log_of_p_and_the_tail_iteration():
    text = lower_to_text(torch.special.ndtri, torch.rand(4, 8))
    FileCheck().check("stablehlo.log").check("stablehlo.log_plus_one").check("1.50140941").check(
        "1.000000e-07"
    ).check("0xFF800000").run(text)
    _pure(text)


def test_bf16_special_computes_in_f32():
    text = lower_to_text(torch.lgamma, X.bfloat16())
    FileCheck().check("tensor<4x8xbf16>) -> tensor<4x8xf32>").check(
        "tensor<4x8xf32>) -> tensor<4x8xbf16>"
    ).run(text)


def test_incomplete_gamma_sums_in_while_loops():
    text = lower_to_text(torch.special.gammainc, X.abs() + 0.5, X.abs() + 0.1)
    # series for P and continued fraction for Q: two loops, then eager's NaN / 0 / 1 edge cases
    FileCheck().check("stablehlo.while").check("stablehlo.while").check("0x7FC00000").run(text)
    _pure(text)
