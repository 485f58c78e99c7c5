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
