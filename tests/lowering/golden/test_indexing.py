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
