"""effects: per-op answers are cached by identity; mutations are found per op, not per node."""

from __future__ import annotations

import torch

from neuron_compile.passes.effects import mutated_roots, mutating_nodes, target_mutates
from tests.passes.graphs import build

aten = torch.ops.aten


def test_per_op_answers_work_for_unhashable_targets():
    class Unhashable:
        __hash__ = None  # type: ignore[assignment]

        def __call__(self, *args: object) -> None:
            return None

    target = Unhashable()
    assert target_mutates(target) is False
    assert target_mutates(target) is False  # answered from the cache the second time
    assert target_mutates(aten.add_.Tensor) is True
    assert target_mutates(aten.add.Tensor) is False


def test_mutating_nodes_in_graph_order_including_in_place_methods():
    written = {}

    def body(g, x, y):
        view = g.call_function(aten.view.default, (x, [4]))
        method = g.call_method("mul_", (y, 2))
        fn = g.call_function(aten.add_.Tensor, (view, 1))
        written.update(method=method, fn=fn)
        return g.call_function(aten.add.Tensor, (fn, method))

    gm = build(2, body)
    assert mutating_nodes(gm.graph) == [written["method"], written["fn"]]
    x, y = (n for n in gm.graph.nodes if n.op == "placeholder")
    assert mutated_roots(gm.graph) == {x, y}  # the write through the view reaches x
