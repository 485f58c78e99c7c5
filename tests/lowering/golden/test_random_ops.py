"""Golden StableHLO for the random ops of ``stablehlo/random_draws.py``."""

from __future__ import annotations

import re

import torch
from torch.testing import FileCheck

from tests.helpers import lower_to_text

aten = torch.ops.aten
X = torch.randn(4, 8)


def _no_64_bit(text: str) -> None:
    assert "rng_bit_generator" not in text
    # i64 attributes (reduce_window's padding) are fine; no value may be 64-bit
    text = re.sub(r"dense<[^>]*> : tensor<[0-9x]*xi64>", "", text)
    assert not re.search(r"tensor<(?:[0-9x]*x)?u?i64>", text)


def test_randint_is_eagers_modulo_of_32_random_bits():
    text = lower_to_text(lambda: torch.randint(-5, 7, (3, 5)))
    FileCheck().check("tensor<4xi32>").check("stablehlo.xor").check("stablehlo.remainder").check(
        "tensor<3x5xui32>"
    ).check("stablehlo.add").check("stablehlo.bitcast_convert").check_same("tensor<3x5xi32>").run(
        text
    )
    _no_64_bit(text)


def test_uniform_and_exponential_clamp_into_eagers_range():
    uni = lower_to_text(lambda a: aten.uniform(a, -1.0, 2.0), X.bfloat16())
    FileCheck().check("stablehlo.multiply").check("stablehlo.add").check("stablehlo.convert").check(
        "stablehlo.clamp"
    ).check_same("bf16").run(uni)
    exp = lower_to_text(lambda a: aten.exponential(a, 3.0), X)
    FileCheck().check("stablehlo.log").check("stablehlo.negate").check("stablehlo.divide").check(
        "stablehlo.maximum"
    ).run(exp)
    _no_64_bit(uni + exp)


def test_multinomial_without_replacement_sorts_exponential_race_keys():
    text = lower_to_text(lambda p: torch.multinomial(p, 3), X.abs())
    FileCheck().check("stablehlo.log").check("stablehlo.subtract").check("stablehlo.sort").check(
        "stablehlo.slice"
    ).check_same("tensor<4x3xi32>").run(text)
    _no_64_bit(text)


def test_multinomial_with_replacement_inverts_the_cdf_without_a_sort():
    text = lower_to_text(lambda p: torch.multinomial(p, 5, replacement=True), X.abs())
    FileCheck().check("stablehlo.reduce_window").check("stablehlo.compare LE").check(
        "tensor<4x5x8xi1>"
    ).check("stablehlo.minimum").check("stablehlo.select").check_not("stablehlo.sort").run(text)
    _no_64_bit(text)


def test_rrelu_eval_is_deterministic_and_takes_no_seed():
    text = lower_to_text(
        lambda a, n: aten.rrelu_with_noise_functional(a, n, 0.1, 0.3, False), X, X + 1
    )
    FileCheck().check("2.000000e-01").check("stablehlo.compare GT").check("stablehlo.select").run(
        text
    )
    assert "xi32>" not in text and "stablehlo.xor" not in text  # no seed, no Threefry


def test_rrelu_training_draws_noise_for_non_positive_inputs():
    text = lower_to_text(lambda a, n: aten.rrelu_with_noise_functional(a, n, 0.1, 0.3, True), X, X)
    FileCheck().check("tensor<4xi32>").check("stablehlo.xor").check("stablehlo.compare LE").check(
        "stablehlo.select"
    ).check("stablehlo.select").run(text)
    back = lower_to_text(
        lambda g, a, n: aten.rrelu_with_noise_backward(g, a, n, 0.1, 0.3, True, False), X, X, X
    )
    FileCheck().check("stablehlo.multiply").check_not("stablehlo.select").run(back)


def test_randperm_sorts_positions_by_64_random_bits_and_geometric_rounds_up():
    text = lower_to_text(lambda: torch.randperm(6))
    # lexicographic on two ui32 words: first word less, or equal and the second less
    FileCheck().check("stablehlo.sort").check("compare EQ").check_same("UNSIGNED").check(
        "compare LT"
    ).check_same("UNSIGNED").check("stablehlo.or").run(text)
    _no_64_bit(text)
    geo = lower_to_text(lambda a: aten.geometric(a, 0.25), X)
    FileCheck().check("stablehlo.log").check("stablehlo.divide").check("stablehlo.ceil").run(geo)
