"""graph_queries and graph_edits: the node lookups and edits the passes share."""

from __future__ import annotations

import torch

from neuron_compile.passes.graph_edits import call_before
from neuron_compile.passes.graph_queries import call_targets, nodes_calling, nodes_calling_any
from tests.helpers import trace_aten

aten = torch.ops.aten


def _graph() -> torch.fx.GraphModule:
    return trace_aten(lambda x: (x.sin() + x.cos()).sin() * x.exp(), torch.randn(4))


def test_nodes_calling_returns_graph_order_across_targets():
    gm = _graph()
    want = [n for n in gm.graph.nodes if n.target in (aten.sin.default, aten.exp.default)]
    assert nodes_calling(gm.graph, [aten.exp.default, aten.sin.default]) == want
    assert nodes_calling(gm.graph, [aten.tanh.default]) == []


def test_nodes_calling_sees_nodes_inserted_earlier_in_the_graph():
    gm = _graph()
    graph = gm.graph
    first = next(n for n in graph.nodes if n.op == "call_function")
    with graph.inserting_before(first):  # created last, placed first
        new = graph.call_function(aten.sin.default, (first.args[0],))
    sins = [n for n in graph.nodes if n.target is aten.sin.default]
    assert sins[0] is new
    assert nodes_calling(graph, [aten.sin.default]) == sins


def test_call_targets_lists_each_target_once_and_forgets_erased_ones():
    gm = _graph()
    assert sorted(map(str, call_targets(gm.graph))) == sorted(
        map(str, {n.target for n in gm.graph.nodes if n.op == "call_function"})
    )
    (exp,) = nodes_calling(gm.graph, [aten.exp.default])
    exp.replace_all_uses_with(exp.args[0])
    gm.graph.erase_node(exp)
    assert aten.exp.default not in call_targets(gm.graph)


def test_nodes_calling_any_asks_once_per_target():
    gm = _graph()
    asked: list[object] = []

    def wanted(target: object) -> bool:
        asked.append(target)
        return target is aten.sin.default

    assert nodes_calling_any(gm.graph, wanted) == nodes_calling(gm.graph, [aten.sin.default])
    assert len(asked) == len(set(asked))


def test_call_before_makes_the_node_call_function_makes():
    gm, twin = _graph(), _graph()
    for module in (gm, twin):
        (exp,) = nodes_calling(module.graph, [aten.exp.default])
        args = (exp.args[0], [0])
        if module is gm:
            new = call_before(exp, aten.sum.dim_IntList, args, exp.meta)
            assert new.meta == exp.meta and new.meta is not exp.meta
        else:
            with module.graph.inserting_before(exp):
                new = module.graph.call_function(aten.sum.dim_IntList, args)
        assert new.next is exp and new.args == args
        assert new in exp.args[0].users
    assert str(gm.graph) == str(twin.graph)
    gm.graph.lint()
