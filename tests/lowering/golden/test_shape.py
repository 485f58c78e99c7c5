"""Golden StableHLO for shape rules."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.testing import FileCheck

from tests.helpers import lower_to_text

X = torch.randn(4, 8)


def test_permute_is_transpose():
    text = lower_to_text(lambda x: x.permute(1, 0) + 1, X)
    FileCheck().check("stablehlo.transpose").check_same("dims = [1, 0]").run(text)


def test_view_is_reshape():
    text = lower_to_text(lambda x: x.view(2, 16) * 2, X)
    FileCheck().check("stablehlo.reshape").check_same("tensor<2x16xf32>").run(text)


def test_strided_slice():
    text = lower_to_text(lambda x: x[1:3, ::2] + 0, X)
    FileCheck().check("stablehlo.slice").check_same("[1:3, 0:8]").check(
        "stablehlo.slice"
    ).check_same("[0:2, 0:8:2]").run(text)


def test_cat_is_concatenate_on_dim():
    text = lower_to_text(lambda a, b: torch.cat([a, b], 1), X, torch.randn(4, 3))
    FileCheck().check("stablehlo.concatenate").check_same("dim = 1").check_same(
        "tensor<4x11xf32>"
    ).run(text)


def test_pad_uses_edge_padding():
    text = lower_to_text(lambda x: F.pad(x, (1, 2)), X)
    FileCheck().check("stablehlo.pad").check_same("low = [0, 1], high = [0, 2]").run(text)


def test_arange_is_iota():
    text = lower_to_text(lambda x: x + torch.arange(8), X)
    FileCheck().check("stablehlo.iota").check_same("dim = 0").run(text)


def test_expand_is_broadcast_in_dim():
    text = lower_to_text(lambda x: x.expand(3, 4, 8) + 0, torch.randn(4, 1))
    FileCheck().check("stablehlo.broadcast_in_dim").check_same("tensor<3x4x8xf32>").run(text)
