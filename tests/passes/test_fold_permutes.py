"""fold_permutes: permute chains become one permute; identity permutes disappear."""

from __future__ import annotations

import torch

from neuron_compile.passes import fold_permutes
from tests.helpers import trace_aten
from tests.passes.graphs import build, count, targets

aten = torch.ops.aten


def test_permute_pair_becomes_one_permute():
    def fn(x):
        return x.permute(2, 0, 1).permute(0, 2, 1) * 2

    gm = trace_aten(fn, torch.randn(2, 3, 4))
    assert count(gm, aten.permute.default) == 2
    assert fold_permutes(gm) is True
    gm.recompile()
    assert count(gm, aten.permute.default) == 1
    x = torch.randn(2, 3, 4)
    torch.testing.assert_close(gm(x), fn(x))


def test_transpose_pair_is_dropped():
    def fn(x):
        return x.transpose(0, 1).transpose(1, 0).relu()

    gm = trace_aten(fn, torch.randn(3, 5))
    assert fold_permutes(gm) is True
    gm.recompile()
    assert targets(gm) == [aten.relu.default]
    x = torch.randn(3, 5)
    torch.testing.assert_close(gm(x), fn(x))


def test_long_chain_with_negative_dims_and_transpose_int():
    def body(g, x):
        a = g.call_function(aten.transpose.int, (x, -1, 0))
        a.meta["val"] = torch.empty(5, 3, 4, 2)
        b = g.call_function(aten.permute.default, (a, [1, -1, 0, 2]))
        c = g.call_function(aten.permute.default, (b, [3, 2, 1, 0]))
        return (g.call_function(aten.mul.Tensor, (c, 3)),)

    gm = build(1, body)
    x = torch.randn(2, 3, 4, 5)
    want = x.transpose(-1, 0).permute(1, -1, 0, 2).permute(3, 2, 1, 0) * 3
    assert fold_permutes(gm) is True
    gm.recompile()
    assert targets(gm) == [aten.permute.default, aten.mul.Tensor]
    torch.testing.assert_close(gm(x)[0], want)


def test_inner_permute_with_other_users_is_kept():
    def fn(x):
        t = x.permute(1, 0)
        return t.permute(1, 0) + 1, t * 2

    gm = trace_aten(fn, torch.randn(3, 4))
    assert fold_permutes(gm) is True
    gm.recompile()
    assert count(gm, aten.permute.default) == 1
    x = torch.randn(3, 4)
    for got, want in zip(gm(x), fn(x), strict=True):
        torch.testing.assert_close(got, want)


def test_identity_permute_of_input_returned_is_kept():
    gm = trace_aten(lambda x: x.permute(1, 0).permute(1, 0), torch.randn(3, 4))
    fold_permutes(gm)
    gm.recompile()
    x = torch.randn(3, 4)
    assert gm(x) is not x
    assert fold_permutes(gm) is False


def test_second_run_changes_nothing():
    gm = trace_aten(lambda x: x.permute(1, 2, 0).permute(2, 0, 1) + 1, torch.randn(2, 3, 4))
    assert fold_permutes(gm) is True
    assert fold_permutes(gm) is False


def test_single_permute_is_unchanged():
    gm = trace_aten(lambda x: x.permute(1, 0) + 1, torch.randn(3, 4))
    before = targets(gm)
    assert fold_permutes(gm) is False
    assert targets(gm) == before
