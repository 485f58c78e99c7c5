"""Golden StableHLO for reductions."""

from __future__ import annotations

import torch
from torch.testing import FileCheck

from tests.helpers import lower_to_text

X = torch.randn(4, 8)


def test_sum_is_reduce_add():
    text = lower_to_text(lambda x: x.sum(1), X)
    FileCheck().check("stablehlo.reduce").check_same("stablehlo.add").check_same(
        "dimensions = [1]"
    ).run(text)


def test_amax_reduces_with_maximum_from_negative_infinity():
    text = lower_to_text(lambda x: x.amax(0), X)
    FileCheck().check("0xFF800000").check("stablehlo.reduce").check_same("stablehlo.maximum").run(
        text
    )


def test_bf16_sum_accumulates_in_f32():
    text = lower_to_text(lambda x: x.sum(), X.bfloat16())
    FileCheck().check("tensor<4x8xbf16>) -> tensor<4x8xf32>").check("stablehlo.reduce").check(
        "stablehlo.convert"
    ).check_same("tensor<bf16>").run(text)


def test_mean_divides_by_count():
    text = lower_to_text(lambda x: x.mean(-1, keepdim=True), X)
    FileCheck().check("stablehlo.reduce").check("8.000000e+00").check("stablehlo.divide").check(
        "tensor<4x1xf32>"
    ).run(text)


def test_prod_is_reduce_multiply_from_one():
    text = lower_to_text(lambda x: x.prod(1), X)
    FileCheck().check("dense<1.000000e+00>").check("stablehlo.reduce").check_same(
        "stablehlo.multiply"
    ).check_same("dimensions = [1]").run(text)


def test_argmax_is_variadic_reduce_over_values_and_i32_iota():
    text = lower_to_text(lambda x: x.argmax(1), X)
    # ties go to the smaller index (LT on the index operands), as eager does
    FileCheck().check("stablehlo.iota dim = 1").check_same("tensor<4x8xi32>").check(
        "stablehlo.reduce"
    ).check_same("tensor<4xi32>)").check("stablehlo.compare LT").check_same("SIGNED").check(
        "stablehlo.compare GT"
    ).check_same("FLOAT").run(text)
    FileCheck().check("func.func public @main").check_same("-> tensor<4xi32>").run(text)


def test_argmin_compares_values_with_lt():
    text = lower_to_text(lambda x: x.argmin(0), X)
    FileCheck().check("0x7F800000").check("stablehlo.reduce").check("compare LT").check_same(
        "SIGNED"
    ).check("compare LT").check_same("FLOAT").run(text)


def test_max_dim_returns_values_and_indices_from_one_reduce():
    text = lower_to_text(lambda x: x.max(1, keepdim=True), X)
    FileCheck().check("-> (tensor<4x1xf32>, tensor<4x1xi32>)").check("stablehlo.reduce").check_not(
        "stablehlo.reduce"
    ).run(text)


def test_var_mean_shares_the_mean():
    text = lower_to_text(lambda x: torch.var_mean(x, 1), X)
    FileCheck().check("stablehlo.reduce").check("stablehlo.divide").check(
        "stablehlo.subtract"
    ).check("stablehlo.reduce").check("7.000000e+00").check("return").check_same(
        "tensor<4xf32>, tensor<4xf32>"
    ).run(text)


def test_vector_norm_two_is_sqrt_of_sum_of_squares():
    text = lower_to_text(lambda x: torch.linalg.vector_norm(x, dim=1), X)
    FileCheck().check("stablehlo.abs").check("stablehlo.multiply").check("stablehlo.reduce").check(
        "stablehlo.sqrt"
    ).check_not("stablehlo.power").run(text)
