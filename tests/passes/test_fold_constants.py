"""fold_constants: small input-free subgraphs become one inlined constant."""

from __future__ import annotations

import logging

import torch

import neuron_compile
from neuron_compile import compiler
from neuron_compile.cache import executable_cache
from neuron_compile.cache.fx_index import index_key
from neuron_compile.lowering import lower_graph
from neuron_compile.passes import fold_constants
from neuron_compile.passes.fold_constants import MAX_FOLDED_ELEMENTS
from tests.helpers import trace_aten
from tests.passes.graphs import build, count, targets

aten = torch.ops.aten


def _get_attrs(gm: torch.fx.GraphModule) -> list[str]:
    return [n.target for n in gm.graph.nodes if n.op == "get_attr"]


def test_arithmetic_on_creation_ops_folds_to_one_buffer():
    def fn(x):
        scale = torch.arange(4, dtype=torch.float32).exp() * 2 + torch.ones(4)
        return x * scale

    x = torch.randn(3, 4)
    gm = trace_aten(fn, x)
    assert fold_constants(gm) is True
    gm.recompile()
    assert targets(gm) == [aten.mul.Tensor]
    (name,) = _get_attrs(gm)
    torch.testing.assert_close(getattr(gm, name), torch.arange(4.0).exp() * 2 + 1)
    torch.testing.assert_close(gm(x), fn(x))


def test_get_attr_constant_and_lift_fresh_copy_fold():
    def fn(x):
        return x[torch.tensor([2, 0]) + 1]  # a graph constant: get_attr -> lift_fresh_copy -> add

    x = torch.randn(4, 3)
    gm = trace_aten(fn, x)
    assert count(gm, aten.lift_fresh_copy.default) == 1
    assert fold_constants(gm) is True
    gm.recompile()
    assert count(gm, aten.lift_fresh_copy.default) == 0 and count(gm, aten.add.Tensor) == 0
    torch.testing.assert_close(gm(x), fn(x))


def test_nothing_reading_a_placeholder_is_folded():
    def fn(x):
        return (x * torch.ones(4)).sum() + torch.full((), 3.0)

    gm = trace_aten(fn, torch.randn(4))
    before = targets(gm)
    assert fold_constants(gm) is False
    assert targets(gm) == before  # bare creation ops stay: they already are StableHLO constants


def test_random_ops_are_never_folded():
    def body(g, x):
        r = g.call_function(aten.rand.default, ([4],))
        r.meta["val"] = torch.empty(4)
        e = g.call_function(aten.exp.default, (r,))
        e.meta["val"] = torch.empty(4)
        return g.call_function(aten.add.Tensor, (x, e))

    gm = build(1, body)
    assert fold_constants(gm) is False
    assert targets(gm) == [aten.rand.default, aten.exp.default, aten.add.Tensor]


def test_buffer_the_graph_writes_to_is_not_a_constant():
    def body(g, x):
        buf = g.get_attr("buf")
        g.call_function(aten.add_.Tensor, (buf, 1)).meta["val"] = torch.empty(4)
        doubled = g.call_function(aten.mul.Tensor, (buf, 2))
        doubled.meta["val"] = torch.empty(4)
        return g.call_function(aten.add.Tensor, (x, doubled))

    gm = build(1, body, buffers={"buf": torch.zeros(4)})
    assert fold_constants(gm) is False
    assert torch.equal(gm(torch.zeros(4)), torch.full((4,), 2.0))


def test_big_results_stay_computed():
    n = MAX_FOLDED_ELEMENTS + 1

    def fn(x):
        return x + torch.arange(n, dtype=torch.float32) * 2

    gm = trace_aten(fn, torch.randn(n))
    assert fold_constants(gm) is False
    assert not _get_attrs(gm)


def test_big_intermediate_with_small_result_folds():
    def fn(x):
        return x + (torch.arange(4096, dtype=torch.float32) * 2).sum()

    x = torch.randn(3)
    gm = trace_aten(fn, x)
    assert fold_constants(gm) is True
    gm.recompile()
    assert targets(gm) == [aten.add.Tensor]
    torch.testing.assert_close(gm(x), fn(x))


def test_second_run_changes_nothing():
    gm = trace_aten(lambda x: x + torch.arange(3.0).cos(), torch.randn(3))
    assert fold_constants(gm) is True
    nodes = [(n.op, n.target, n.args) for n in gm.graph.nodes]
    assert fold_constants(gm) is False
    assert [(n.op, n.target, n.args) for n in gm.graph.nodes] == nodes


def test_logs_what_it_changed(caplog):
    gm = trace_aten(lambda x: x + torch.arange(3.0).cos(), torch.randn(3))
    with caplog.at_level(logging.DEBUG, logger="neuron_compile.passes"):
        fold_constants(gm)
    assert any("fold_constants: folded 1 constants" in r.getMessage() for r in caplog.records)


def test_folded_constant_is_inlined_not_an_argument():
    gm = trace_aten(lambda x: x + torch.arange(3.0).cos(), torch.randn(3))
    fold_constants(gm)
    lowered = lower_graph(gm)
    assert [s.attr for s in lowered.inputs] == [None]  # only x
    assert "stablehlo.constant" in lowered.text and "dense<[1.0" in lowered.text


def test_index_key_sees_the_values_of_inlined_constants():
    def graph(values):
        return trace_aten(lambda x: x[torch.tensor(values)], torch.randn(4, 3))

    assert index_key(graph([0, 2]), "portable", {}) == index_key(graph([0, 2]), "portable", {})
    assert index_key(graph([0, 2]), "portable", {}) != index_key(graph([0, 1]), "portable", {})


def _fn_with_constant(x):
    return x * (torch.arange(4, dtype=torch.float32) + 1).exp() + x[:, torch.tensor([1, 0, 3, 2])]


def test_torch_compile_numerics_and_fx_index_warm_start(monkeypatch, caplog):
    """Two fresh Dynamo rounds on one disk cache: the second is served by the FX index (no
    lowering) although the constant the pass folded is not on its graph module."""
    lowerings: list[int] = []
    real_lower = compiler.lower_graph
    monkeypatch.setattr(
        compiler, "lower_graph", lambda gm, **kw: lowerings.append(1) or real_lower(gm, **kw)
    )
    x = torch.randn(3, 4)
    for _ in range(2):
        torch._dynamo.reset()
        executable_cache.clear()  # a new process, as far as the cache tiers are concerned
        neuron_compile.reset_metrics()
        with caplog.at_level(logging.DEBUG, logger="neuron_compile.passes"):
            got = torch.compile(_fn_with_constant, backend="neuron_compile")(x)
        torch.testing.assert_close(got, _fn_with_constant(x))
    assert any("fold_constants: folded 1 constants" in r.getMessage() for r in caplog.records)
    assert lowerings == [1]
    assert [r.cache_source for r in neuron_compile.metrics()] == ["disk"]


def test_big_get_attr_stays_an_argument():
    def body(g, x):
        c = g.get_attr("big")
        return g.call_function(aten.add.Tensor, (x, c))

    gm = build(1, body, buffers={"big": torch.randn(MAX_FOLDED_ELEMENTS + 1)})
    for node in gm.graph.nodes:
        node.meta["val"] = torch.empty(MAX_FOLDED_ELEMENTS + 1)
    lowered = lower_graph(gm)
    assert [s.attr for s in lowered.inputs] == [None, "big"]
    assert "stablehlo.constant" not in lowered.text


def test_big_graph_constant_is_never_folded_into_the_module():
    # Its values are not in the FX index key (only inline-sized constants are): folding
    # sum(k) into a literal would let a graph whose k holds other values hit this module.
    def graphs(fill):
        return build(
            1,
            lambda g, x: g.call_function(
                aten.add.Tensor, (x, g.call_function(aten.sum.default, (g.get_attr("k"),)))
            ),
            buffers={"k": torch.full((4096,), fill)},
        )

    ones, twos = graphs(1.0), graphs(2.0)
    for gm in (ones, twos):
        for n in gm.graph.nodes:
            if n.op != "output":
                n.meta["val"] = torch.empty(()) if n.target is aten.sum.default else None
    assert index_key(ones, "portable", {}) == index_key(twos, "portable", {})
    assert fold_constants(ones) is False and fold_constants(twos) is False


def test_creation_ops_read_only_with_graph_inputs_are_not_evaluated(monkeypatch):
    from neuron_compile.passes.fold_constants import _Evaluator

    evaluated: list[str] = []
    evaluate = _Evaluator._evaluate

    def spy(self, node):
        evaluated.append(str(node.target))
        return evaluate(self, node)

    monkeypatch.setattr(_Evaluator, "_evaluate", spy)

    def fn(x):
        return x * torch.full((), 3.0) + torch.arange(4.0).exp()

    x = torch.randn(4)
    gm = trace_aten(fn, x)
    assert fold_constants(gm) is True
    gm.recompile()
    assert "aten.full.default" not in evaluated  # mul(x, full) can never be constant
    assert {"aten.arange.start_step", "aten.exp.default"} <= set(evaluated)
    assert count(gm, aten.full.default) == 1 and count(gm, aten.exp.default) == 0
    torch.testing.assert_close(gm(x), fn(x))


def test_unused_creation_op_is_erased():
    def body(g, x):
        unused = g.call_function(aten.full.default, ([2], 1.0))
        unused.meta["val"] = torch.empty(2)
        return g.call_function(aten.neg.default, (x,))

    gm = build(1, body)
    assert fold_constants(gm) is True
    assert targets(gm) == [aten.neg.default]
