"""eliminate_dead_code: removes unused pure nodes; keeps mutations, RNG ops and effects."""

from __future__ import annotations

import torch

from neuron_compile.passes import eliminate_dead_code
from tests.helpers import trace_aten
from tests.passes.graphs import build, count, targets

aten = torch.ops.aten


def test_removes_unused_chain():
    def fn(x):
        unused = x.sin().cos().sum()  # noqa: F841
        return x + 1

    gm = trace_aten(fn, torch.randn(4))
    assert aten.sin.default in targets(gm)
    assert eliminate_dead_code(gm) is True
    gm.recompile()
    assert targets(gm) == [aten.add.Tensor]
    x = torch.randn(4)
    torch.testing.assert_close(gm(x), x + 1)


def test_removes_unused_getitem_but_keeps_used_parent():
    gm = trace_aten(lambda x: x.max(0)[0] * 2, torch.randn(3, 4))
    n_getitem = sum(1 for n in gm.graph.nodes if n.name.startswith("getitem"))
    assert n_getitem <= 2
    eliminate_dead_code(gm)
    gm.recompile()
    assert aten.max.dim in targets(gm)
    x = torch.randn(3, 4)
    torch.testing.assert_close(gm(x), x.max(0)[0] * 2)


def test_second_run_changes_nothing():
    gm = trace_aten(lambda x: (x.exp(), x.relu())[1], torch.randn(3))
    assert eliminate_dead_code(gm) is True
    assert eliminate_dead_code(gm) is False


def test_graph_without_dead_code_is_unchanged():
    gm = trace_aten(lambda x: x.sin() + x.cos(), torch.randn(3))
    before = targets(gm)
    assert eliminate_dead_code(gm) is False
    assert targets(gm) == before


def test_keeps_in_place_write_to_input():
    def fn(x):
        x.add_(1)  # result unused, but the caller sees x change
        return x.sum() * 0 + 5

    gm = trace_aten(fn, torch.randn(3))
    eliminate_dead_code(gm)
    gm.recompile()
    assert aten.add_.Tensor in targets(gm)
    x = torch.zeros(3)
    gm(x)
    torch.testing.assert_close(x, torch.ones(3))


def test_keeps_unused_random_ops():
    def fn(x):
        torch.rand_like(x)
        torch.ops.aten.native_dropout(x, 0.5, True)
        return x + 1

    gm = trace_aten(fn, torch.randn(3))
    eliminate_dead_code(gm)
    present = set(targets(gm))
    assert aten.native_dropout.default in present
    assert any("rand" in str(t) for t in present)  # rand_like or its decomposition


def test_keeps_unused_with_effects():
    def body(g, token, x):
        eff = g.call_function(
            torch.ops.higher_order.with_effects, (token, aten._print.default, "hi")
        )
        g.call_function(aten.sin.default, (x,))  # dead and pure: goes
        return (eff, x)

    gm = build(2, body)
    assert eliminate_dead_code(gm) is True
    assert count(gm, torch.ops.higher_order.with_effects) == 1
    assert count(gm, aten.sin.default) == 0


def test_keeps_copy_back_into_input():
    # AOTAutograd's epilogue for an input mutation: copy_(input, new_value), result unused.
    def body(g, x):
        new = g.call_function(aten.mul.Tensor, (x, 2))
        g.call_function(aten.copy_.default, (x, new))
        return (g.call_function(aten.add.Tensor, (x, 0)),)

    gm = build(1, body)
    assert eliminate_dead_code(gm) is False
    x = torch.ones(2)
    gm(x)
    torch.testing.assert_close(x, torch.full((2,), 2.0))


def test_removes_unused_get_attr():
    gm = torch.fx.symbolic_trace(torch.nn.Linear(2, 2))
    gm.graph.get_attr("weight")  # a third, unused read of the parameter
    assert [n.op for n in gm.graph.nodes].count("get_attr") == 3
    assert eliminate_dead_code(gm) is True
    assert [n.op for n in gm.graph.nodes].count("get_attr") == 2


def test_keeps_undecomposed_rng_ops():
    def body(g, x):
        g.call_function(aten.bernoulli.default, (x,))
        g.call_function(aten.randn.default, ([3],))
        return (x,)

    gm = build(1, body)
    assert eliminate_dead_code(gm) is False
