"""Golden StableHLO for the ``embedding_bag`` and ``segment_reduce`` decompositions.

``lower_to_text`` traces with core ATen's table only, so each test calls the decomposition
function itself; what reaches the lowering is then what AOTAutograd produces for the op."""

from __future__ import annotations

import torch
from torch.testing import FileCheck

from neuron_compile.decompositions.embedding import DECOMPOSITIONS as EMBEDDING
from neuron_compile.decompositions.segments import DECOMPOSITIONS as SEGMENTS
from tests.helpers import lower_to_text

aten = torch.ops.aten
BAG = EMBEDDING[aten._embedding_bag.default]
SEGMENT_REDUCE = SEGMENTS[aten.segment_reduce.default]
INDICES = torch.tensor([1, 2, 2, 5, 0])
OFFSETS = torch.tensor([0, 2, 2])


def _bag_text(mode: int, weight: torch.Tensor | None = None, every: bool = False) -> str:
    weight = torch.randn(8, 4) if weight is None else weight
    return lower_to_text(
        lambda w, i, o: BAG(w, i, o, False, mode) if every else BAG(w, i, o, False, mode)[0],
        weight,
        INDICES,
        OFFSETS,
    )


def test_bag_membership_counts_offsets_in_f32_then_cumsums_in_i32():
    text = _bag_text(1)
    # Offsets counted into n + 1 = 6 slots by a float32 scatter-add (an integer one has no
    # datapath on Trainium: decompositions/counting.py), converted, then a running sum.
    FileCheck().check("stablehlo.scatter").check("stablehlo.add").check_same("tensor<f32>").check(
        "}) : (tensor<6xf32>, tensor<3x1xi32>"
    ).check("stablehlo.convert").check_same("(tensor<6xf32>) -> tensor<6xi32>").check(
        "stablehlo.reduce_window"
    ).check("}) : (tensor<6xi32>, tensor<i32>) -> tensor<6xi32>").run(text)
    FileCheck().check("stablehlo.gather").check_same("slice_sizes = array<i64: 1, 4>").run(text)
    # int64 indices and offsets arrive as i32 (the 64-bit policy).
    FileCheck().check(
        "@main(%arg0: tensor<8x4xf32>, %arg1: tensor<5xi32>, %arg2: tensor<3xi32>)"
    ).run(text)


def test_bf16_sum_accumulates_in_f32_and_rounds_once():
    text = _bag_text(0, torch.randn(8, 4, dtype=torch.bfloat16))
    # Rows widened, summed into 3 bags + the spare one in f32, sliced, then one rounding.
    FileCheck().check("(tensor<5x4xbf16>) -> tensor<5x4xf32>").check("stablehlo.scatter").check(
        "stablehlo.add"
    ).check_same("tensor<f32>").check(
        "}) : (tensor<4x4xf32>, tensor<5x1xi32>, tensor<5x4xf32>) -> tensor<4x4xf32>"
    ).check("stablehlo.convert").check_same("(tensor<3x4xf32>) -> tensor<3x4xbf16>").run(text)


def test_mean_divides_by_a_gathered_bag_size_not_a_broadcast():
    """XLA turns a division by a broadcast into a multiplication by its reciprocal."""
    text = _bag_text(1)
    FileCheck().check("slice_sizes = array<i64: 1, 1>").check_same("-> tensor<3x4xf32>").check(
        "stablehlo.divide"
    ).check_same("tensor<3x4xf32>").run(text)


def test_max_bag_reduces_with_maximum_then_first_position_with_minimum():
    text = _bag_text(2, every=True)
    FileCheck().check("stablehlo.scatter").check("stablehlo.maximum").check(
        "stablehlo.scatter"
    ).check("stablehlo.minimum").check("stablehlo.gather").run(text)


def test_segment_max_is_one_scatter_with_a_spare_slot():
    text = lower_to_text(
        lambda x, n: SEGMENT_REDUCE(x, "max", lengths=n), torch.randn(6, 3), torch.tensor([2, 0, 4])
    )
    # Three segments plus the spare slot for positions past the last segment, sliced off.
    FileCheck().check("stablehlo.scatter").check("stablehlo.maximum").check_same(
        "tensor<f32>"
    ).check("-> tensor<1x4x3xf32>").check("stablehlo.slice").check_same(
        "(tensor<1x4x3xf32>) -> tensor<1x3x3xf32>"
    ).run(text)


def test_segment_mean_without_initial_selects_nan_for_empty_segments():
    text = lower_to_text(
        lambda x, n: SEGMENT_REDUCE(x, "mean", lengths=n), torch.randn(6), torch.tensor([2, 0, 4])
    )
    FileCheck().check("stablehlo.divide").check("0x7FC00000").check("stablehlo.select").run(text)
