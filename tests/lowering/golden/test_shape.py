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


def test_flip_is_reverse():
    text = lower_to_text(lambda x: x.flip(0, -1), X)
    FileCheck().check("stablehlo.reverse").check_same("dims = [0, 1]").run(text)


def test_repeat_broadcasts_interleaved_then_reshapes():
    text = lower_to_text(lambda x: x.repeat(2, 3), X)
    FileCheck().check("stablehlo.broadcast_in_dim").check_same("dims = [1, 3]").check_same(
        "tensor<2x4x3x8xf32>"
    ).check("stablehlo.reshape").check_same("tensor<8x24xf32>").run(text)


def test_unfold_is_one_gather_with_a_constant_window_table():
    text = lower_to_text(lambda x: x.unfold(1, 3, 2), X)
    FileCheck().check("stablehlo.constant dense<[[[0], [1], [2]], [[2], [3], [4]]").check(
        "stablehlo.gather"
    ).check_same("start_index_map = [1]").check_same("tensor<4x3x3xf32>").run(text)


def test_diagonal_is_a_strided_slice_of_the_flattened_matrix():
    text = lower_to_text(lambda x: x.diagonal(1), X)
    FileCheck().check("stablehlo.reshape").check_same("tensor<32xf32>").check(
        "stablehlo.slice"
    ).check_same("[1:29:9]").check_not("stablehlo.gather").run(text)


def test_slice_scatter_pads_with_interior_and_selects():
    text = lower_to_text(lambda x, s: torch.slice_scatter(x, s, 1, 1, 8, 3), X, torch.randn(4, 3))
    FileCheck().check("stablehlo.pad").check_same(
        "low = [0, 1], high = [0, 0], interior = [0, 2]"
    ).check("dense<[false, true, false, false, true, false, false, true]>").check(
        "stablehlo.select"
    ).check_not("stablehlo.scatter").run(text)


def test_tril_indices_is_a_constant():
    text = lower_to_text(lambda x: torch.tril_indices(3, 3) + x, torch.tensor(1))
    FileCheck().check("dense<[[0, 1, 1, 2, 2, 2], [0, 0, 1, 0, 1, 2]]>").check_same(
        "tensor<2x6xi32>"
    ).check_not("stablehlo.iota").run(text)


def test_replication_pad_backward_sums_bands_onto_edges():
    fn = lambda g, x: torch.ops.aten.replication_pad1d_backward(g, x, [2, 1])  # noqa: E731
    text = lower_to_text(fn, torch.randn(2, 9), torch.randn(2, 6))
    FileCheck().check("stablehlo.slice").check_same("[0:2, 0:2]").check("stablehlo.reduce").check(
        "stablehlo.slice"
    ).check_same("[0:2, 8:9]").check("stablehlo.slice").check_same("[0:2, 2:8]").check(
        "stablehlo.pad"
    ).check_same("high = [0, 5]").check("stablehlo.pad").check_same("low = [0, 5]").run(text)


def test_as_strided_gathers_constant_storage_positions():
    text = lower_to_text(lambda x: x.as_strided((2, 3), (1, 2), 1) * 1, X)
    FileCheck().check("dense<[[[1], [3], [5]], [[2], [4], [6]]]>").check(
        '"stablehlo.gather"'
    ).check_same("tensor<2x3xf32>").run(text)


def test_as_strided_of_an_offset_view_is_rejected_with_a_reason():
    from neuron_compile.lowering import registry
    from tests.helpers import trace_aten

    gm = trace_aten(lambda x: x[1:].as_strided((2, 2), (1, 2)) * 1, X)
    (node,) = [n for n in gm.graph.nodes if n.target is torch.ops.aten.as_strided.default]
    assert "storage" in registry.lookup(node)
