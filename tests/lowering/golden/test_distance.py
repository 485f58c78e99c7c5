"""Golden StableHLO for pairwise distances (cdist / pdist and their backward ops)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.testing import FileCheck

from tests.helpers import lower_to_text

aten = torch.ops.aten
A, B = torch.randn(5, 3), torch.randn(4, 3)


def test_cdist_is_direct_differences_without_matmul():
    text = lower_to_text(lambda a, b: torch.cdist(a, b), A, B)
    FileCheck().check("stablehlo.broadcast_in_dim").check_same("tensor<5x4x3xf32>").check(
        "stablehlo.subtract"
    ).check("stablehlo.reduce").check_same("dimensions = [2]").check("stablehlo.sqrt").check_not(
        "stablehlo.dot_general"
    ).run(text)


def test_cdist_inf_norm_is_max_of_abs():
    text = lower_to_text(lambda a, b: torch.cdist(a, b, float("inf")), A, B)
    FileCheck().check("stablehlo.abs").check("stablehlo.reduce").check_same(
        "stablehlo.maximum"
    ).run(text)


def test_cdist_backward_zeroes_coincident_points():
    def fn(g, a, b, d):
        return aten._cdist_backward(g, a, b, 2.0, d)

    text = lower_to_text(fn, torch.randn(5, 4), A, B, torch.rand(5, 4))
    FileCheck().check("stablehlo.compare EQ").check("stablehlo.divide").check(
        "stablehlo.select"
    ).check("stablehlo.reduce").check_same("dimensions = [1]").run(text)


def test_pdist_gathers_the_upper_triangle():
    text = lower_to_text(lambda a: F.pdist(a), torch.randn(4, 3))
    # pairs (0,1) (0,2) (0,3) (1,2) (1,3) (2,3) of a 4x4 matrix, flattened
    FileCheck().check("dense<[[1], [2], [3], [6], [7], [11]]>").check('"stablehlo.gather"').check(
        "-> tensor<6xf32>"
    ).run(text)
