"""Golden StableHLO for activation rules (``stablehlo/activations.py``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.testing import FileCheck

from tests.helpers import lower_to_text

X = torch.randn(4, 8)


def test_elu_uses_expm1_and_leaky_relu_selects():
    elu = lower_to_text(F.elu, X)
    FileCheck().check("stablehlo.exponential_minus_one").check("stablehlo.select").run(elu)
    leaky = lower_to_text(lambda a: F.leaky_relu(a, 0.2), X)
    FileCheck().check("2.000000e-01").check("stablehlo.select").check_not(
        "stablehlo.exponential"
    ).run(leaky)


def test_hardtanh_clamps_with_max_then_min():
    text = lower_to_text(lambda a: F.hardtanh(a, -2.0, 3.0), X)
    FileCheck().check("stablehlo.maximum").check("stablehlo.minimum").check_not(
        "stablehlo.select"
    ).run(text)
