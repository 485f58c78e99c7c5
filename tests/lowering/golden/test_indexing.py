"""Golden StableHLO for indexing rules."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.testing import FileCheck

from tests.helpers import lower_to_text


def test_embedding_is_row_gather_with_i32_indices():
    text = lower_to_text(
        lambda w, i: F.embedding(i, w), torch.randn(10, 4), torch.randint(0, 10, (2, 3))
    )
    FileCheck().check("tensor<2x3xi32>").check("stablehlo.gather").check_same(
        "collapsed_slice_dims = [0]"
    ).check_same("slice_sizes = array<i64: 1, 4>").check_not("i64>").run(text)


def test_index_put_accumulate_is_scatter_add():
    fn = lambda a, i, v: a.index_put((i,), v, accumulate=True)  # noqa: E731
    text = lower_to_text(fn, torch.zeros(5, 3), torch.tensor([0, 2, 0]), torch.ones(3, 3))
    FileCheck().check("stablehlo.scatter").check("stablehlo.add").run(text)


def test_gather_along_dim_builds_full_coordinates():
    text = lower_to_text(
        lambda a, i: torch.gather(a, 1, i), torch.randn(4, 8), torch.randint(0, 8, (4, 3))
    )
    FileCheck().check("stablehlo.iota").check("stablehlo.concatenate").check(
        "stablehlo.gather"
    ).run(text)


def test_index_on_an_inner_dim_gathers_along_that_dim():
    text = lower_to_text(lambda a, i: a[:, i], torch.randn(4, 8), torch.tensor([1, 2]))
    FileCheck().check("stablehlo.gather").check_same("offset_dims = [0]").check_same(
        "collapsed_slice_dims = [1], start_index_map = [1]"
    ).check_same("slice_sizes = array<i64: 4, 1>").check_same("tensor<4x2xf32>").run(text)


def test_non_adjacent_index_dims_put_the_index_dims_first():
    text = lower_to_text(
        lambda a, i, j: a[:, i, :, j],
        torch.randn(2, 3, 4, 5),
        torch.zeros(4, 1, dtype=torch.long),
        torch.zeros(3, dtype=torch.long),
    )
    FileCheck().check("stablehlo.gather").check_same("offset_dims = [2, 3]").check_same(
        "start_index_map = [1, 3]"
    ).check_same("tensor<4x3x2x4xf32>").run(text)


def test_index_put_with_leading_none_scatters_into_inner_dims():
    fn = lambda a, i, v: torch.ops.aten.index_put(a, [None, i], v, True)  # noqa: E731
    text = lower_to_text(fn, torch.randn(4, 8), torch.tensor([1, 1, 3]), torch.randn(4, 3))
    FileCheck().check("stablehlo.scatter").check_same("update_window_dims = [0]").check_same(
        "inserted_window_dims = [1], scatter_dims_to_operand_dims = [1]"
    ).check("stablehlo.add").run(text)


def test_scatter_reduce_amax_is_scatter_maximum():
    fn = lambda a, i, s: a.scatter_reduce(1, i, s, "amax")  # noqa: E731
    text = lower_to_text(fn, torch.randn(4, 8), torch.randint(0, 8, (4, 2)), torch.randn(4, 2))
    FileCheck().check("stablehlo.scatter").check("stablehlo.maximum").check_not(
        "stablehlo.scatter"
    ).run(text)


def test_scatter_reduce_without_self_first_writes_the_identity():
    fn = lambda a, i, s: a.scatter_reduce(1, i, s, "prod", include_self=False)  # noqa: E731
    text = lower_to_text(fn, torch.randn(4, 8), torch.randint(0, 8, (4, 2)), torch.randn(4, 2))
    FileCheck().check("dense<1.000000e+00> : tensor<4x2xf32>").check("stablehlo.scatter").check(
        "stablehlo.return %arg4"
    ).check("stablehlo.scatter").check("stablehlo.multiply").run(text)


def test_scatter_reduce_mean_divides_by_scattered_counts():
    fn = lambda a, i, s: a.scatter_reduce(1, i, s, "mean")  # noqa: E731
    text = lower_to_text(fn, torch.randn(4, 8), torch.randint(0, 8, (4, 2)), torch.randn(4, 2))
    FileCheck().check("stablehlo.scatter").check("stablehlo.add").check("stablehlo.scatter").check(
        "stablehlo.add"
    ).check("stablehlo.select").check("stablehlo.divide").run(text)


def test_masked_scatter_counts_the_mask_and_gathers_the_source():
    fn = lambda a, s: a.masked_scatter(a > 0, s)  # noqa: E731
    text = lower_to_text(fn, torch.randn(4, 8), torch.randn(40))
    # running count of true positions (a scan), then one gather from the flat source
    FileCheck().check('"stablehlo.reduce_window"').check_same("padding = dense<[[31, 0]]>").check(
        "stablehlo.clamp"
    ).check('"stablehlo.gather"').check("stablehlo.select").check_not("stablehlo.while").run(text)


def test_index_reduce_broadcasts_the_index_along_dim_then_scatters():
    fn = lambda a, s: a.index_reduce(0, torch.tensor([0, 2, 2]), s, "amax")  # noqa: E731
    text = lower_to_text(fn, torch.randn(4, 8), torch.randn(3, 8))
    FileCheck().check("stablehlo.broadcast_in_dim").check_same("dims = [0]").check_same(
        "tensor<3x8xi32>"
    ).check("stablehlo.scatter").check("stablehlo.maximum").run(text)


def test_put_scatters_into_the_flattened_tensor():
    fn = lambda a, s: a.put(torch.tensor([1, -5]), s, accumulate=True)  # noqa: E731
    text = lower_to_text(fn, torch.randn(4, 8), torch.randn(2))
    FileCheck().check("stablehlo.reshape %arg0").check_same("tensor<32xf32>").check(
        "stablehlo.scatter"
    ).check("stablehlo.add").check("stablehlo.reshape").check_same("tensor<4x8xf32>").run(text)


def test_bool_mask_assignment_of_one_value_is_a_select():
    fn = lambda a: torch.ops.aten.index_put(a, [a > 0], torch.tensor(0.5))  # noqa: E731
    text = lower_to_text(fn, torch.randn(4, 8))
    FileCheck().check("stablehlo.compare GT").check("stablehlo.select").check_not(
        "stablehlo.scatter"
    ).check_not("stablehlo.gather").run(text)


def test_bool_mask_assignment_of_many_values_takes_them_in_order():
    fn = lambda a, m, v: torch.ops.aten.index_put(a, [m], v)  # noqa: E731
    text = lower_to_text(fn, torch.randn(4, 8), torch.eye(4, 8).bool(), torch.randn(4))
    FileCheck().check('"stablehlo.reduce_window"').check("stablehlo.clamp").check(
        '"stablehlo.gather"'
    ).check("stablehlo.select").run(text)
