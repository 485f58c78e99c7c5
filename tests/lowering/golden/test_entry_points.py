"""Golden StableHLO for the legacy entry points, prims, runtime asserts, view.dtype and
repeat_interleave with output_size."""

from __future__ import annotations

import torch
from torch.testing import FileCheck

from tests.helpers import lower_to_text

aten = torch.ops.aten
prims = torch.ops.prims


def test_conv_tbc_is_one_convolution_between_transposes():
    fn = lambda x, w, b: aten.conv_tbc(x, w, b, 1)  # noqa: E731
    text = lower_to_text(fn, torch.randn(7, 2, 3), torch.randn(3, 3, 5), torch.randn(5))
    FileCheck().check("stablehlo.transpose").check("stablehlo.convolution").check_same(
        "pad = [[1, 1]]"
    ).check_same("tensor<2x5x7xf32>").check("stablehlo.transpose").check("tensor<7x2x5xf32>").run(
        text
    )
    FileCheck().check_count("stablehlo.convolution", 1, exactly=True).run(text)


def test_legacy_convolution_is_the_convolution_op():
    fn = lambda x, w: aten._convolution(x, w, None, [2], [1], [1], False, [0], 1, *[True] * 4)  # noqa: E731
    text = lower_to_text(fn, torch.randn(2, 3, 9), torch.randn(4, 3, 3))
    FileCheck().check("stablehlo.convolution").check_same("stride = [2], pad = [[1, 1]]").check(
        "tensor<2x4x5xf32>"
    ).run(text)


def test_index_put_impl_accumulate_is_scatter_add():
    fn = lambda a, i, v: aten._index_put_impl(a, [i], v, True, True)  # noqa: E731
    text = lower_to_text(fn, torch.zeros(5, 3), torch.tensor([0, 2, 0]), torch.ones(3, 3))
    FileCheck().check("stablehlo.scatter").check("stablehlo.add").run(text)


def test_view_dtype_to_a_narrower_type_bitcasts_then_folds_the_last_dim():
    text = lower_to_text(lambda x: x.view(torch.uint8).clone(), torch.randn(2, 8))
    FileCheck().check("stablehlo.bitcast_convert").check_same("tensor<2x8x4xui8>").check(
        "stablehlo.reshape"
    ).check_same("tensor<2x32xui8>").run(text)


def test_view_dtype_to_a_wider_type_groups_then_bitcasts():
    text = lower_to_text(
        lambda x: x.view(torch.float32).clone(), torch.zeros(2, 8, dtype=torch.int16)
    )
    FileCheck().check("stablehlo.reshape").check_same("tensor<2x4x2xi16>").check(
        "stablehlo.bitcast_convert"
    ).check_same("tensor<2x4xf32>").run(text)


def test_view_dtype_of_one_width_is_a_plain_bitcast():
    text = lower_to_text(lambda x: x.view(torch.int32).clone(), torch.randn(3))
    FileCheck().check("stablehlo.bitcast_convert").check_same(
        "(tensor<3xf32>) -> tensor<3xi32>"
    ).run(text)
    FileCheck().check_not("stablehlo.reshape").run(text)


def test_repeat_interleave_with_output_size_compares_against_run_ends():
    fn = lambda r: aten.repeat_interleave.Tensor(r, output_size=6)  # noqa: E731
    text = lower_to_text(fn, torch.tensor([1, 0, 3, 2]))
    FileCheck().check("stablehlo.iota").check("stablehlo.compare").check_same("LE").check(
        "stablehlo.reduce"
    ).check("tensor<6xi32>").check_not("i64>").run(text)


def test_prims_convert_and_collapse_are_convert_and_reshape():
    fn = lambda x: prims.collapse(prims.convert_element_type(x, torch.bfloat16), 0, 1)  # noqa: E731
    text = lower_to_text(fn, torch.randn(2, 3, 4))
    FileCheck().check("stablehlo.convert").check_same("tensor<2x3x4xbf16>").check(
        "stablehlo.reshape"
    ).check_same("tensor<6x4xbf16>").run(text)


def test_holding_scalar_asserts_emit_nothing():
    def fn(x):
        aten._assert_scalar(True, "never")
        aten.sym_constrain_range_for_size(3, max=4)
        return x * 2

    text = lower_to_text(fn, torch.randn(3))
    FileCheck().check("stablehlo.multiply").run(text)
    body = [ln for ln in text.splitlines() if "stablehlo." in ln]
    assert len(body) == 2, body  # the constant 2 and the multiply
