"""Golden StableHLO for convolution, pooling and batch norm (forward and backward)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.testing import FileCheck

from neuron_compile.lowering import registry
from tests.helpers import lower_to_text, trace_aten

aten = torch.ops.aten


def _no_custom_call(text: str) -> None:
    FileCheck().check_not("custom_call").run(text)


# ---- convolution -----------------------------------------------------------------------------
def test_conv2d_is_one_grouped_strided_convolution_plus_bias():
    text = lower_to_text(
        lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1, dilation=2, groups=2),
        torch.randn(1, 4, 9, 9), torch.randn(6, 2, 3, 3), torch.randn(6),
    )  # fmt: skip
    FileCheck().check("stablehlo.convolution").check(
        "[b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1]"
    ).check("stride = [2, 2], pad = [[1, 1], [1, 1]]").check("rhs_dilate = [2, 2]").check(
        "feature_group_count = 2"
    ).check_not("stablehlo.convolution").check("stablehlo.broadcast_in_dim").check_same(
        "dims = [1]"
    ).check("stablehlo.add").run(text)
    _no_custom_call(text)


def test_conv1d_and_conv3d_use_rank_matching_dimension_numbers():
    text1 = lower_to_text(lambda x, w: F.conv1d(x, w), torch.randn(2, 3, 10), torch.randn(4, 3, 3))
    FileCheck().check("[b, f, 0]x[o, i, 0]->[b, f, 0]").check("-> tensor<2x4x8xf32>").run(text1)
    text3 = lower_to_text(
        lambda x, w: F.conv3d(x, w, padding=1),
        torch.randn(1, 2, 4, 4, 4),
        torch.randn(3, 2, 3, 3, 3),
    )
    FileCheck().check("[b, f, 0, 1, 2]x[o, i, 0, 1, 2]->[b, f, 0, 1, 2]").run(text3)


def test_bf16_conv_accumulates_in_f32_and_rounds_once():
    text = lower_to_text(
        lambda x, w: F.conv2d(x, w),
        torch.randn(1, 4, 8, 8).bfloat16(),
        torch.randn(6, 4, 3, 3).bfloat16(),
    )
    FileCheck().check("stablehlo.convolution").check_same("xbf16>) -> tensor<1x6x6x6xf32>").check(
        "stablehlo.convert"
    ).check_same("-> tensor<1x6x6x6xbf16>").run(text)


def test_transposed_conv_dilates_the_input_and_flips_the_kernel():
    text = lower_to_text(
        lambda x, w: F.conv_transpose2d(x, w, stride=2, padding=1, output_padding=1),
        torch.randn(1, 4, 5, 5), torch.randn(4, 3, 3, 3),
    )  # fmt: skip
    FileCheck().check("stablehlo.reverse").check_same("dims = [2, 3]").check(
        "stablehlo.convolution"
    ).check_same("[i, o, 0, 1]").check("lhs_dilate = [2, 2]").check("-> tensor<1x3x10x10xf32>").run(
        text
    )


def test_convolution_backward_emits_input_weight_and_bias_gradients():
    text = lower_to_text(
        lambda g, x, w: aten.convolution_backward(
            g, x, w, [6], [2, 2], [1, 1], [1, 1], False, [0, 0], 2, [True, True, True]
        ),
        torch.randn(1, 6, 4, 4), torch.randn(1, 4, 8, 8), torch.randn(6, 2, 3, 3),
    )  # fmt: skip
    # grad_input: stride-dilated grad_output against the flipped, in/out-swapped kernel.
    FileCheck().check("stablehlo.reverse").check("stablehlo.convolution").check_same(
        "[b, f, 0, 1]x[i, o, 0, 1]->[b, f, 0, 1]"
    ).check("lhs_dilate = [2, 2]").check("feature_group_count = 2").run(text)
    # grad_weight: batch and feature roles swapped, stride becomes the kernel dilation.
    FileCheck().check("stablehlo.convolution").check(
        "[f, b, 0, 1]x[i, o, 0, 1]->[f, b, 0, 1]"
    ).check("rhs_dilate = [2, 2]").check("batch_group_count = 2").check(
        "-> tensor<6x2x3x3xf32>"
    ).check("stablehlo.reduce").check_same("dimensions = [0, 2, 3]").run(text)
    _no_custom_call(text)


def test_bf16_convolution_backward_accumulates_in_f32():
    args = (torch.randn(1, 6, 4, 4), torch.randn(1, 4, 8, 8), torch.randn(6, 2, 3, 3))
    text = lower_to_text(
        lambda g, x, w: aten.convolution_backward(
            g, x, w, [6], [2, 2], [1, 1], [1, 1], False, [0, 0], 2, [True, True, True]
        ),
        *[a.bfloat16() for a in args],
    )
    FileCheck().check("stablehlo.convolution").check_same("-> tensor<1x4x8x8xf32>").check(
        "stablehlo.convolution"
    ).check_same("-> tensor<6x2x3x3xf32>").check("return").check_same(
        "tensor<1x4x8x8xbf16>, tensor<6x2x3x3xbf16>, tensor<6xbf16>"
    ).run(text)


def test_convolution_backward_skips_masked_off_outputs():
    text = lower_to_text(
        lambda g, x, w: aten.convolution_backward(
            g, x, w, [6], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [False, True, False]
        )[1],
        torch.randn(1, 6, 8, 8), torch.randn(1, 4, 8, 8), torch.randn(6, 4, 3, 3),
    )  # fmt: skip
    FileCheck().check_count("stablehlo.convolution", 1, exactly=True).check_not(
        "stablehlo.reduce"
    ).run(text)


# ---- pooling ---------------------------------------------------------------------------------
def test_max_pool_is_a_variadic_reduce_window_over_values_and_flat_indices():
    text = lower_to_text(
        lambda x: F.max_pool2d(x, 3, 2, 1, ceil_mode=True, return_indices=True),
        torch.randn(1, 2, 8, 8),
    )
    FileCheck().check("stablehlo.iota").check("stablehlo.multiply").check(
        '"stablehlo.reduce_window"'
    ).check("window_dimensions = array<i64: 1, 1, 3, 3>").check(
        "window_strides = array<i64: 1, 1, 2, 2>"
    ).check("stablehlo.compare GT").check_same("FLOAT").check("stablehlo.compare LT").check_same(
        "SIGNED"
    ).check("stablehlo.return").check("tensor<1x2x5x5xf32>, tensor<1x2x5x5xi32>").run(text)
    _no_custom_call(text)


def test_max_pool_backward_scatter_adds_at_the_saved_indices():
    def fn(g, x, idx):
        return aten.max_pool2d_with_indices_backward(
            g, x, [2, 2], [2, 2], [0, 0], [1, 1], False, idx
        )

    text = lower_to_text(
        fn, torch.randn(1, 2, 4, 4), torch.randn(1, 2, 8, 8), torch.randint(0, 64, (1, 2, 4, 4))
    )
    FileCheck().check('"stablehlo.scatter"').check("stablehlo.add").check(
        "-> tensor<128xf32>"
    ).check("stablehlo.reshape").check_same("-> tensor<1x2x8x8xf32>").run(text)
    FileCheck().check_not("select_and_scatter").run(text)


def test_avg_pool_ceil_mode_divides_by_per_window_counts():
    text = lower_to_text(
        lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True), torch.randn(1, 2, 8, 8)
    )
    # The last row/column of windows hangs over the padded input: divisor 6 (and 4 in the corner).
    FileCheck().check('"stablehlo.reduce_window"').check("stablehlo.add").check(
        "stablehlo.constant dense<[[9.000000e+00"
    ).check_same("6.000000e+00]").check_same("4.000000e+00]]>").check("stablehlo.divide").run(text)


def test_avg_pool_uniform_divisor_is_a_splat():
    text = lower_to_text(lambda x: F.avg_pool2d(x, 2), torch.randn(1, 2, 8, 8))
    FileCheck().check('"stablehlo.reduce_window"').check(
        "stablehlo.constant dense<4.000000e+00> : tensor<1x2x4x4xf32>"
    ).check("stablehlo.divide").run(text)


def test_avg_pool_backward_is_a_padded_window_sum():
    def fn(g, x):
        return aten.avg_pool2d_backward(g, x, [3, 3], [2, 2], [1, 1], False, True, None)

    text = lower_to_text(fn, torch.randn(1, 2, 4, 4), torch.randn(1, 2, 8, 8))
    FileCheck().check("stablehlo.divide").check("stablehlo.pad").check_same(
        "interior = [0, 0, 1, 1]"
    ).check('"stablehlo.reduce_window"').check("-> tensor<1x2x8x8xf32>").run(text)


def test_max_pool3d_windows_the_last_three_dims_with_volume_flat_indices():
    text = lower_to_text(
        lambda x: F.max_pool3d(x, (2, 3, 2), (2, 2, 1), return_indices=True),
        torch.randn(1, 2, 6, 7, 5),
    )
    # flat index d * (H * W) + h * W + w: two multiply-adds over three iotas
    FileCheck().check("stablehlo.iota dim = 2").check("stablehlo.iota dim = 3").check(
        "stablehlo.iota dim = 4"
    ).check('"stablehlo.reduce_window"').check(
        "window_dimensions = array<i64: 1, 1, 2, 3, 2>"
    ).check("window_strides = array<i64: 1, 1, 2, 2, 1>").run(text)
    FileCheck().check("-> (tensor<1x2x3x3x4xf32>, tensor<1x2x3x3x4xi32>)").run(text)
    _no_custom_call(text)


def test_avg_pool3d_divisor_is_the_outer_product_of_window_counts():
    text = lower_to_text(
        lambda x: F.avg_pool3d(x, 2, 2, 1, count_include_pad=False), torch.randn(1, 1, 2, 2, 2)
    )
    # Each window holds exactly one real element of the 2x2x2 input: a splat divisor of 1.
    FileCheck().check('"stablehlo.reduce_window"').check(
        "stablehlo.constant dense<1.000000e+00> : tensor<1x1x2x2x2xf32>"
    ).check("stablehlo.divide").run(text)


def test_avg_pool3d_backward_pads_three_dims():
    def fn(g, x):
        return aten.avg_pool3d_backward(g, x, [2, 2, 2], [2, 2, 2], [0, 0, 0], False, True, None)

    text = lower_to_text(fn, torch.randn(1, 2, 2, 2, 2), torch.randn(1, 2, 4, 4, 4))
    FileCheck().check("stablehlo.pad").check_same("interior = [0, 0, 1, 1, 1]").check(
        '"stablehlo.reduce_window"'
    ).check("-> tensor<1x2x4x4x4xf32>").run(text)


def test_adaptive_max_pool_gathers_windows_then_reduces_value_index_pairs():
    text = lower_to_text(
        lambda x: F.adaptive_max_pool2d(x, (3, 4), return_indices=True), torch.randn(1, 2, 7, 9)
    )
    # H windows of 7 -> 3 are [0, 3), [2, 5), [4, 7): a constant (3, 3) table
    FileCheck().check("dense<[[[0], [1], [2]], [[2], [3], [4]], [[4], [5], [6]]]>").check(
        '"stablehlo.gather"'
    ).check("stablehlo.reduce").check_same("dimensions = [3, 5]").check("stablehlo.compare GT").run(
        text
    )
    FileCheck().check("-> (tensor<1x2x3x4xf32>, tensor<1x2x3x4xi32>)").run(text)
    _no_custom_call(text)


def test_adaptive_avg_pool_divisible_is_reduce_window_else_matmuls():
    divisible = lower_to_text(lambda x: F.adaptive_avg_pool2d(x, (2, 4)), torch.randn(1, 2, 8, 8))
    FileCheck().check('"stablehlo.reduce_window"').check(
        "window_dimensions = array<i64: 1, 1, 4, 2>"
    ).check_not("dot_general").run(divisible)
    uneven = lower_to_text(lambda x: F.adaptive_avg_pool2d(x, (3, 5)), torch.randn(1, 2, 8, 7))
    FileCheck().check_count("stablehlo.dot_general", 2, exactly=True).check(
        "stablehlo.transpose"
    ).check_same("-> tensor<1x2x3x5xf32>").run(uneven)


def test_adaptive_avg_pool_backward_spreads_each_gradient_over_its_window():
    text = lower_to_text(
        lambda g, x: aten._adaptive_avg_pool2d_backward(g, x),
        torch.randn(1, 2, 2, 4),
        torch.randn(1, 2, 8, 8),
    )
    FileCheck().check("stablehlo.broadcast_in_dim").check_same("-> tensor<1x2x2x4x4x2xf32>").check(
        "stablehlo.divide"
    ).run(text)


# ---- batch norm ------------------------------------------------------------------------------
def _bn_functional(x, w, b, rm, rv):
    return aten._native_batch_norm_legit_functional(x, w, b, rm, rv, True, 0.1, 1e-5)


def test_batch_norm_training_returns_stats_and_updated_running_stats():
    args = (torch.randn(2, 3, 4, 4), torch.randn(3), torch.randn(3), torch.randn(3), torch.rand(3))
    text = lower_to_text(_bn_functional, *args)
    FileCheck().check("stablehlo.reduce").check_same("dimensions = [0, 2, 3]").check(
        "stablehlo.rsqrt"
    ).check("return").check_same(
        "tensor<2x3x4x4xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>"
    ).run(text)
    # Unbiased running variance: n / (n - 1) = 32 / 31.
    FileCheck().check("stablehlo.constant dense<1.03225803>").run(text)
    _no_custom_call(text)


def test_bf16_batch_norm_computes_in_f32():
    args = [torch.randn(2, 3, 4, 4), torch.randn(3), torch.randn(3), torch.randn(3), torch.rand(3)]
    text = lower_to_text(_bn_functional, *[a.bfloat16() for a in args])
    FileCheck().check("stablehlo.convert").check_same("-> tensor<2x3x4x4xf32>").check(
        "stablehlo.rsqrt"
    ).check_same("tensor<3xf32>").check("return").check_same("tensor<2x3x4x4xbf16>").run(text)


def test_batch_norm_eval_uses_running_stats_and_empty_saved_stats():
    def fn(x, w, b, rm, rv):
        return aten._native_batch_norm_legit_no_training(x, w, b, rm, rv, 0.1, 1e-5)

    args = (torch.randn(2, 3, 4, 4), torch.randn(3), torch.randn(3), torch.randn(3), torch.rand(3))
    text = lower_to_text(fn, *args)
    FileCheck().check_not("stablehlo.reduce").check("stablehlo.rsqrt").check("return").check_same(
        "tensor<2x3x4x4xf32>, tensor<0xf32>, tensor<0xf32>"
    ).run(text)


def test_batch_norm_without_running_stats_lowers():
    text = lower_to_text(
        lambda x: aten._native_batch_norm_legit(x, None, None, True, 0.1, 1e-5),
        torch.randn(2, 3, 4),
    )
    FileCheck().check("stablehlo.reduce").check_same("dimensions = [0, 2]").check(
        "stablehlo.rsqrt"
    ).run(text)


def test_in_place_training_batch_norm_is_rejected_with_a_reason():
    gm = trace_aten(
        lambda x, rm, rv: F.batch_norm(x, rm, rv, training=True),
        torch.randn(2, 3, 4, 4), torch.zeros(3), torch.ones(3),
    )  # fmt: skip
    (node,) = [n for n in gm.graph.nodes if n.target is aten.native_batch_norm.default]
    reason = registry.lookup(node)
    assert isinstance(reason, str)
    assert "running_mean/running_var in place" in reason
    assert "_native_batch_norm_legit_functional" in reason


def test_adaptive_pool3d_gathers_or_contracts_each_spatial_dim():
    import torch.nn.functional as F

    x = torch.randn(1, 2, 5, 4, 3)
    text = lower_to_text(lambda a: F.adaptive_max_pool3d(a, (2, 3, 2), return_indices=True), x)
    # three window gathers per operand (values, flat indices), one variadic reduce over K1, K2, K3
    FileCheck().check("stablehlo.gather").check("stablehlo.gather").check("stablehlo.gather").check(
        "stablehlo.reduce"
    ).check_same("across dimensions = [3, 5, 7]").run(text)
    text = lower_to_text(lambda a: F.adaptive_avg_pool3d(a, (2, 3, 2)), x)
    FileCheck().check("stablehlo.dot_general").check("stablehlo.dot_general").check(
        "stablehlo.dot_general"
    ).check_not("stablehlo.reduce_window").run(text)
