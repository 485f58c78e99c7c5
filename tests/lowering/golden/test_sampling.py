"""Golden StableHLO for the sampling decompositions (``decompositions/sampling.py``).

``lower_to_text`` traces with core ATen's table only, so each case traces the decomposition
function itself: what the backend's table turns the op into."""

from __future__ import annotations

import torch
from torch.testing import FileCheck

from neuron_compile.decompositions import sampling
from tests.helpers import lower_to_text


def _grid(*shape: int) -> torch.Tensor:
    return torch.rand(shape) * 2 - 1


def test_bilinear_2d_reads_its_four_corners_with_one_gather():
    text = lower_to_text(
        lambda x, g: sampling.grid_sampler_2d(x, g, 0, 0, False),
        torch.randn(2, 3, 5, 7),
        _grid(2, 4, 6, 2),
    )
    # (N, C, H*W) read at 4 corners x 24 points, then the four weighted terms summed.
    FileCheck().check("stablehlo.floor").check("stablehlo.gather").check_same(
        "(tensor<2x3x35xf32>, tensor<2x3x96x3xi32>) -> tensor<2x3x96xf32>"
    ).check_not("stablehlo.gather").check("return").check_same("tensor<2x3x4x6xf32>").run(text)


def test_nearest_2d_rounds_half_to_even():
    text = lower_to_text(
        lambda x, g: sampling.grid_sampler_2d(x, g, 1, 1, False),
        torch.randn(2, 3, 5, 7),
        _grid(2, 4, 6, 2),
    )
    FileCheck().check_count("stablehlo.round_nearest_even", 2).check("stablehlo.gather").check_not(
        "stablehlo.floor"
    ).run(text)


def test_bicubic_2d_reads_sixteen_taps_with_one_gather():
    text = lower_to_text(
        lambda x, g: sampling.grid_sampler_2d(x, g, 2, 2, True),
        torch.randn(1, 2, 5, 7),
        _grid(1, 3, 4, 2),
    )
    FileCheck().check("stablehlo.gather").check_same("-> tensor<1x2x192xf32>").check_not(
        "stablehlo.gather"
    ).run(text)


def test_backward_2d_scatter_adds_into_the_input_gradient():
    text = lower_to_text(
        lambda go, x, g: sampling.grid_sampler_2d_backward(go, x, g, 0, 2, False, [True, True]),
        torch.randn(2, 3, 4, 6),
        torch.randn(2, 3, 5, 7),
        _grid(2, 4, 6, 2),
    )
    FileCheck().check("stablehlo.gather").check("stablehlo.scatter").check("stablehlo.add").check(
        ": tensor<2x3x5x7xf32>, tensor<2x4x6x2xf32>"
    ).run(text)


def test_trilinear_3d_reads_its_eight_corners_with_one_gather():
    text = lower_to_text(
        lambda x, g: sampling.grid_sampler_3d(x, g, 0, 1, True),
        torch.randn(1, 2, 3, 4, 5),
        _grid(1, 2, 3, 4, 3),
    )
    FileCheck().check("stablehlo.gather").check_same(
        "(tensor<1x2x60xf32>, tensor<1x2x192x3xi32>) -> tensor<1x2x192xf32>"
    ).check_not("stablehlo.gather").check("return").check_same("tensor<1x2x2x3x4xf32>").run(text)


def test_antialias_resize_is_a_width_pass_then_a_height_pass():
    # 10x20 -> 3x5: the width pass reads 5 outputs x 9 taps (scale 4) along W, the height pass
    # 3 outputs x 9 taps (scale 3.33) along H. The taps and weights, computed from iotas in the
    # graph, fold to constants: first taps of output 0 are 0..8, the clamped tail repeats 19/9.
    text = lower_to_text(
        lambda x: sampling.upsample_bilinear2d_aa(x, [3, 5], False), torch.randn(1, 2, 10, 20)
    )
    FileCheck().check("dense<[0, 1, 2, 3, 4, 5, 6, 7, 8, 2,").check_same(
        "19, 19, 19]> : tensor<45xi32>"
    ).check("stablehlo.gather").check_same("slice_sizes = array<i64: 1, 2, 10, 1>").check(
        "dense<[0, 1, 2, 3, 4, 5, 6, 7, 8, 2,"
    ).check_same("9, 9, 9]> : tensor<27xi32>").check("stablehlo.gather").check_same(
        "slice_sizes = array<i64: 1, 2, 1, 5>"
    ).check_not("stablehlo.gather").check("return").check_same("tensor<1x2x3x5xf32>").run(text)


def test_nearest_backward_scatter_adds_one_dim_at_a_time():
    # 4x5 -> 7x10: floorf(i * 4/7) along H, and the exact doubling along W is i >> 1.
    backward = sampling.DECOMPOSITIONS[torch.ops.aten.upsample_nearest2d_backward.default]
    text = lower_to_text(
        lambda g: backward(g, [7, 10], [2, 3, 4, 5], None, None), torch.randn(2, 3, 7, 10)
    )
    FileCheck().check("dense<[0, 0, 1, 1, 2, 2, 3]> : tensor<7xi32>").check(
        "stablehlo.scatter"
    ).check_same("inserted_window_dims = [2]").check(
        "dense<[0, 0, 1, 1, 2, 2, 3, 3, 4, 4]> : tensor<10xi32>"
    ).check("stablehlo.scatter").check_same("inserted_window_dims = [3]").check(
        "}) : ("
    ).check_same("-> tensor<2x3x4x5xf32>").run(text)
