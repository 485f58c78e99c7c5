"""Golden StableHLO for softmax and layer norm."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.testing import FileCheck

from tests.helpers import lower_to_text


def test_softmax_subtracts_max_before_exp():
    text = lower_to_text(lambda x: x.softmax(-1), torch.randn(4, 8))
    FileCheck().check("stablehlo.maximum").check("stablehlo.subtract").check(
        "stablehlo.exponential"
    ).check("stablehlo.add").check("stablehlo.divide").run(text)


def test_layer_norm_uses_rsqrt_and_returns_normalized_output():
    text = lower_to_text(
        lambda x, w, b: F.layer_norm(x, (8,), w, b),
        torch.randn(2, 4, 8),
        torch.randn(8),
        torch.randn(8),
    )
    FileCheck().check("stablehlo.reduce").check("stablehlo.rsqrt").check(
        "stablehlo.multiply"
    ).check("return").check_same("tensor<2x4x8xf32>").run(text)


def test_group_norm_reduces_per_sample_and_group():
    text = lower_to_text(
        lambda x, w, b: F.group_norm(x, 2, w, b),
        torch.randn(2, 4, 3),
        torch.randn(4),
        torch.randn(4),
    )
    FileCheck().check("stablehlo.reshape").check_same("tensor<2x2x6xf32>").check(
        "stablehlo.reduce"
    ).check_same("dimensions = [2]").check("stablehlo.rsqrt").check(
        "stablehlo.broadcast_in_dim %arg1, dims = [1]"
    ).check_same("tensor<2x4x3xf32>").check("stablehlo.broadcast_in_dim %arg2, dims = [1]").run(
        text
    )


def test_bf16_group_norm_computes_statistics_in_f32():
    text = lower_to_text(lambda x: F.group_norm(x, 2), torch.randn(2, 4, 3).bfloat16())
    FileCheck().check("tensor<2x4x3xbf16>) -> tensor<2x4x3xf32>").check(
        "stablehlo.rsqrt"
    ).check_same("f32").check("-> tensor<2x4x3xbf16>").run(text)
