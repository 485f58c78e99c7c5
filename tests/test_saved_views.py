"""The backward is handed a parameter, not the forward's copy of a view of it
(``neuron_compile/saved_views.py``).

Before, a Linear's forward returned ``permute(weight)`` as a saved activation: XLA copied every
weight transposed on every step, and an in-place change of a weight between the forward and the
backward went unnoticed (eager raises). Values and gradients are eager's either way.
"""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
from torch._functorch._aot_autograd.descriptors import PlainAOTInput

from neuron_compile import events
from neuron_compile.saved_views import VIEW_OPS, save_parameters_not_views
from neuron_compile.targets import get_target


class Net(nn.Module):
    """A Linear, a weight used through ``t()`` and one through a view chain (``view`` +
    ``unsqueeze`` + ``expand``): each backward reads a view of a parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 5)
        self.w = nn.Parameter(torch.randn(4, 5))
        self.scale = nn.Parameter(torch.randn(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.fc(x)) @ self.w.t()  # (3, 4)
        s = self.scale.view(2, 4).unsqueeze(0).expand(3, 2, 4)
        return (h.unsqueeze(1) * s).tanh()


def _forward_graphs(fn, *args) -> list[fx.GraphModule]:
    graphs = []
    with events.subscribed(
        lambda e: graphs.append(e.gm) if e.kind == "forward" else None, events.GraphLowered
    ):
        fn(*args).sum().backward()
    return graphs


def _saved_views(gm: fx.GraphModule) -> list[str]:
    """The forward outputs that are views of the graph's inputs (through any chain)."""
    names = []
    for out in gm.graph.output_node().args[0]:
        node = out
        while isinstance(node, fx.Node) and node.target in VIEW_OPS:
            node = node.args[0]
        if node is not out and isinstance(node, fx.Node) and node.op == "placeholder":
            names.append(out.name)
    return names


def _grads(model: nn.Module, fn, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    out = fn(x)
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    return out.detach(), [p.grad.clone() for p in model.parameters()]


def test_the_forward_returns_parameters_not_their_views() -> None:
    torch.manual_seed(0)
    model, x = Net(), torch.randn(3, 6, requires_grad=False)
    expected = _grads(model, model, x)
    compiled = torch.compile(model, backend="neuron")
    (graph,) = _forward_graphs(compiled, x)
    assert _saved_views(graph) == []
    returned = {o.name for o in graph.graph.output_node().args[0] if isinstance(o, fx.Node)}
    params = [p.name for p in graph.graph.find_nodes(op="placeholder")]
    assert len(returned & set(params)) >= 3  # fc.weight, w, scale (and x)
    actual = _grads(model, compiled, x)
    torch.testing.assert_close(actual[0], expected[0], rtol=1e-5, atol=1e-6)
    for a, e in zip(actual[1], expected[1], strict=True):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)


def test_a_weight_changed_before_the_backward_raises_as_in_eager() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2))
    x = torch.randn(3, 4)
    for fn in (model, torch.compile(model, backend="neuron")):
        loss = fn(x).sum()
        with torch.no_grad():
            model[2].weight.add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            loss.backward()


def test_buffers_keep_their_saved_copy() -> None:
    """A buffer may change in the forward (BatchNorm's statistics): its views stay saved."""

    # A partitioned pair by hand: the forward saves b.t(), the backward reads it.
    fw = fx.Graph()
    fx_x, fx_b = fw.placeholder("x"), fw.placeholder("b")
    for i, ph in enumerate((fx_x, fx_b)):
        ph.meta["desc"] = PlainAOTInput(i)
    t = fw.create_node("call_function", torch.ops.aten.t.default, (fx_b,), name="t")
    out = fw.call_function(torch.ops.aten.mm.default, (fx_x, t))
    fw.output((out, t))
    bw = fx.Graph()
    saved, grad = bw.placeholder("t"), bw.placeholder("tangents_1")
    back = bw.call_function(torch.ops.aten.t.default, (saved,))
    bw.output((bw.call_function(torch.ops.aten.mm.default, (grad, back)), None))
    fwm, bwm = fx.GraphModule({}, fw), fx.GraphModule({}, bw)
    assert save_parameters_not_views(fwm, bwm, 1, lambda i: False) == 0
    assert _saved_views(fwm) == ["t"]
    assert save_parameters_not_views(fwm, bwm, 1, lambda i: i == 1) == 1
    assert _saved_views(fwm) == [] and fwm.graph.output_node().args[0][1] is fx_b
    replayed = [n for n in bwm.graph.nodes if n.target is torch.ops.aten.t.default]
    assert [n.args[0].name for n in replayed] == ["t", replayed[0].name]  # t(b), then t(t(b))
    b, g = torch.randn(5, 4), torch.randn(3, 5)
    torch.testing.assert_close(bwm(b, g)[0], g @ b)


def test_trainium_graphs_keep_the_partition() -> None:
    """What neuronx-cc receives does not change: trn targets save the view as before."""
    assert get_target("cpu").saves_parameters_for_views
    assert not get_target("trn2").saves_parameters_for_views
    model, x = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)), torch.randn(3, 4)
    compiled = torch.compile(model, backend="neuron", options={"target": "trn2"})
    (graph,) = _forward_graphs(compiled, x)
    assert _saved_views(graph)
