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
