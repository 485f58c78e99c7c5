"""Golden StableHLO for the Bessel / Airy functions, the orthogonal polynomials and the float
bit-pattern ops: pure stablehlo, one ``while`` per polynomial (or Airy series), integer
arithmetic on the bits for frexp / nextafter."""

from __future__ import annotations

import torch
from torch.testing import FileCheck

from tests.helpers import lower_to_text

X = torch.randn(4, 8)


def _pure(text: str) -> None:
    FileCheck().check_not("chlo").check_not("custom_call").run(text)


def test_bessel_j0_switches_between_rational_and_asymptotic_forms():
    text = lower_to_text(torch.special.bessel_j0, X)
    # RP's first coefficient, cos / sin of x - pi/4 scaled by sqrt(2 / pi), the x <= 5 select
    FileCheck().check("-4.794432E+9").check("stablehlo.cosine").check("stablehlo.sine").check(
        "0.797884583"
    ).check("stablehlo.select").run(text)
    FileCheck().check_not("stablehlo.while").run(text)
    _pure(text)


def test_modified_bessel_k0_has_a_pole_and_nan_domain():
    text = lower_to_text(torch.special.modified_bessel_k0, X)
    FileCheck().check("stablehlo.log").check("stablehlo.exponential").check("0x7FC00000").check(
        "0x7F800000"
    ).run(text)
    _pure(text)


def test_airy_series_is_a_while_until_every_element_converged():
    text = lower_to_text(torch.special.airy_ai, X)
    FileCheck().check("stablehlo.while").check("stablehlo.reduce").check_same("stablehlo.or").run(
        text
    )
    _pure(text)


def test_polynomial_recurrence_runs_to_the_largest_degree():
    text = lower_to_text(torch.special.chebyshev_polynomial_t, torch.randn(4, 1), torch.randn(5))
    # trip count: max over the broadcast degrees; then the closed form cos(n acos x) for n > 6
    FileCheck().check("stablehlo.maximum").check("stablehlo.while").check("6.000000e+00").check(
        "stablehlo.atan2"
    ).check("stablehlo.cosine").run(text)
    _pure(text)
    hermite = lower_to_text(lambda x: torch.special.hermite_polynomial_h(x, 200), X)
    FileCheck().check("stablehlo.while").check("1.280000e+02").check("0x7FC00000").run(hermite)
    FileCheck().check_not("stablehlo.atan2").run(hermite)


def test_frexp_and_nextafter_work_on_the_bits():
    text = lower_to_text(torch.frexp, X)
    FileCheck().check("stablehlo.bitcast_convert").check("stablehlo.shift_right_logical").check(
        "stablehlo.count_leading_zeros"
    ).check("stablehlo.shift_left").check("stablehlo.bitcast_convert").run(text)
    FileCheck().check_not("stablehlo.multiply").run(text)  # no float scaling: subnormals stay
    text = lower_to_text(torch.nextafter, X, torch.randn(4, 8))
    FileCheck().check("stablehlo.bitcast_convert").check("stablehlo.xor").check(
        "stablehlo.add"
    ).check("stablehlo.bitcast_convert").run(text)
