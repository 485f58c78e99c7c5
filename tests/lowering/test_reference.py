"""lower_reference: ops lowered through a traced PyTorch reference, traced once per signature."""

from __future__ import annotations

import torch

import neuron_compile.lowering.reference as reference
import neuron_compile.trainium.lowering  # noqa: F401  (neuron_compile::softmax and its reference rule)
from neuron_compile.lowering import lower_graph
from tests.helpers import run_lowered, trace_aten


def _two_layers(x, y):
    a = torch.ops.neuron_compile.softmax(x, -1)
    b = torch.ops.neuron_compile.softmax(a * 2, -1)  # same signature: the trace is reused
    c = torch.ops.neuron_compile.softmax(y, -1)  # another shape: traced again
    return b.sum() + c.sum()


def test_reference_traced_once_per_signature_and_numerics_hold(monkeypatch):
    calls = []
    real = reference._trace
    monkeypatch.setattr(reference, "_trace", lambda *a: calls.append(a[0]) or real(*a))
    monkeypatch.setattr(reference, "_TRACES", {})
    x, y = torch.randn(4, 8), torch.randn(3, 5)
    gm = trace_aten(_two_layers, x, y)
    text = lower_graph(gm).text
    assert len(calls) == 2
    assert "custom_call" not in text  # the CPU form: references, no kernel calls
    lower_graph(gm)
    assert len(calls) == 2  # a second lowering of the same graph traces nothing
    torch.testing.assert_close(run_lowered(_two_layers, x, y)[0], _two_layers(x, y))
