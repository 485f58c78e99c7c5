"""eliminate_common_subexpressions: merges equal pure ops, never random/mutating/differing ones."""

from __future__ import annotations

import torch

from neuron_compile.passes import eliminate_common_subexpressions as cse
from tests.helpers import trace_aten
from tests.passes.graphs import build, count, targets

aten = torch.ops.aten


def test_merges_duplicate_pure_ops_and_their_users():
    gm = trace_aten(lambda x: x.sin().exp() + x.sin().exp(), torch.randn(4))
    assert count(gm, aten.sin.default) == 2
    assert cse(gm) is True
    gm.recompile()
    assert count(gm, aten.sin.default) == 1
    assert count(gm, aten.exp.default) == 1
    x = torch.randn(4)
    torch.testing.assert_close(gm(x), 2 * x.sin().exp())


def test_merges_list_and_dtype_arguments():
    def fn(x):
        a = x.view(2, 8).sum([0]) + x.view(2, 8).sum([0])
        b = x.to(torch.float16).float() + x.to(torch.float16).float()
        return a, b

    gm = trace_aten(fn, torch.randn(16))
    assert cse(gm) is True
    gm.recompile()
    assert count(gm, aten.view.default) == 1
    assert count(gm, aten.sum.dim_IntList) == 1
    x = torch.randn(16)
    for got, want in zip(gm(x), fn(x), strict=True):
        torch.testing.assert_close(got, want)


def test_merges_getitems_of_merged_multi_output_ops():
    gm = trace_aten(lambda x: x.max(0)[0] + x.max(0)[0], torch.randn(3, 4))
    cse(gm)
    gm.recompile()
    assert count(gm, aten.max.dim) == 1
    x = torch.randn(3, 4)
    torch.testing.assert_close(gm(x), 2 * x.max(0)[0])


def test_second_run_changes_nothing():
    gm = trace_aten(lambda x: x.cos() * x.cos(), torch.randn(3))
    assert cse(gm) is True
    assert cse(gm) is False


def test_graph_without_duplicates_is_unchanged():
    gm = trace_aten(lambda x: x.sin() + x.cos(), torch.randn(3))
    before = targets(gm)
    assert cse(gm) is False
    assert targets(gm) == before


def test_different_arguments_or_kwargs_are_not_merged():
    def fn(x):
        return (
            x.sum(0) + x.sum(1),
            x.sum(0, keepdim=True).exp(),
            x.to(torch.float16).float() + x.to(torch.bfloat16).float(),
        )

    gm = trace_aten(fn, torch.randn(4, 4))
    assert cse(gm) is False


def test_scalar_type_and_signed_zero_distinguish_keys():
    def body(g, x, y):
        return (
            g.call_function(aten.add.Tensor, (x, 1)),
            g.call_function(aten.add.Tensor, (x, 1.0)),
            g.call_function(aten.add.Tensor, (x, True)),
            g.call_function(aten.mul.Tensor, (y, 0.0)),
            g.call_function(aten.mul.Tensor, (y, -0.0)),
            g.call_function(aten.add.Tensor, (x, y), {"alpha": 2}),
            g.call_function(aten.add.Tensor, (x, y)),
        )

    gm = build(2, body)
    assert cse(gm) is False
    out = gm(torch.arange(3), torch.ones(3))
    assert out[0].dtype == torch.int64 and out[1].dtype == torch.float32
    assert torch.signbit(out[4]).all() and not torch.signbit(out[3]).any()


def test_random_ops_are_never_merged():
    def fn(x):
        a = torch.ops.aten.native_dropout(x, 0.5, True)[0]
        b = torch.ops.aten.native_dropout(x, 0.5, True)[0]
        return a + b + torch.rand_like(x) - torch.rand_like(x)

    gm = trace_aten(fn, torch.rand(8))
    before = targets(gm)
    cse(gm)
    assert count(gm, aten.native_dropout.default) == 2
    assert sum("rand" in str(t) for t in targets(gm)) == sum("rand" in str(t) for t in before)


def test_undecomposed_rng_ops_are_never_merged():
    def body(g, x):
        a = g.call_function(aten.bernoulli.default, (x,))
        b = g.call_function(aten.bernoulli.default, (x,))
        c = g.call_function(aten.randn.default, ([3],), {"dtype": torch.float32})
        d = g.call_function(aten.randn.default, ([3],), {"dtype": torch.float32})
        return (g.call_function(aten.add.Tensor, (a, b)), c, d)

    gm = build(1, body)
    assert cse(gm) is False
    assert count(gm, aten.bernoulli.default) == 2
    assert count(gm, aten.randn.default) == 2


def test_reads_across_an_in_place_write_are_not_merged():
    # sin(x) before and after x.add_(1) differ although the expressions are identical.
    def body(g, x):
        before = g.call_function(aten.sin.default, (x,))
        g.call_function(aten.add_.Tensor, (x, 1))
        after = g.call_function(aten.sin.default, (x,))
        return (g.call_function(aten.sub.Tensor, (after, before)),)

    gm = build(1, body)
    assert cse(gm) is False
    x = torch.zeros(3)
    (got,) = gm(x.clone())
    torch.testing.assert_close(got, torch.sin(x + 1) - torch.sin(x))


def test_values_written_later_are_not_merged():
    def fn(x):
        a = x.cos()
        b = x.cos()
        b.add_(1)
        return a, b

    gm = trace_aten(fn, torch.randn(3))
    assert cse(gm) is False
    x = torch.randn(3)
    a, b = gm(x)
    torch.testing.assert_close(b, a + 1)


def test_two_outputs_stay_distinct_tensors():
    gm = trace_aten(lambda x: (x.sin(), x.sin()), torch.randn(3))
    assert cse(gm) is False
    a, b = gm(torch.randn(3))
    assert a is not b


def test_multi_output_op_whose_element_is_written_is_not_merged():
    def fn(x):
        a = x.max(0)[0]
        b = x.max(0)[0]
        b.add_(1)
        return a, b

    gm = trace_aten(fn, torch.randn(3, 4))
    cse(gm)
    gm.recompile()
    assert count(gm, aten.max.dim) == 2
    x = torch.randn(3, 4)
    a, b = gm(x)
    torch.testing.assert_close(a, x.max(0)[0])
    torch.testing.assert_close(b, a + 1)


def test_merges_into_the_first_equal_node_among_same_target_and_input():
    def body(g, x):
        first = g.call_function(aten.add.Tensor, (x, 1))
        other = g.call_function(aten.add.Tensor, (x, 2))
        again = g.call_function(aten.add.Tensor, (x, 1))
        return g.call_function(
            aten.mul.Tensor, (g.call_function(aten.mul.Tensor, (first, other)), again)
        )

    gm = build(1, body)
    assert cse(gm) is True
    adds = [n for n in gm.graph.nodes if n.target is aten.add.Tensor]
    assert [n.args for n in adds] == [(adds[0].args[0], 1), (adds[0].args[0], 2)]
    (outer,) = [n for n in gm.graph.nodes if n.target is aten.mul.Tensor and n.args[1] is adds[0]]
    assert outer.args[0].args == (adds[0], adds[1])
