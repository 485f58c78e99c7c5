"""The FX index: what lowering depends on changes its key; the specs round-trip through JSON."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from neuron_compile.cache.fx_index import dump_index, index_key, load_index
from neuron_compile.cache.key import graph_key
from neuron_compile.lowering import lower_graph


def _graph(x, fn=lambda x: torch.relu(x) * 2):
    return make_fx(fn)(x)


def _key(gm, **options):
    return index_key(gm, "portable", {"sixty_four_bit": "downcast", **options})


def test_same_graph_same_key_and_each_input_changes_it():
    base = _key(_graph(torch.randn(4, 3)))
    assert base == _key(_graph(torch.randn(4, 3)))  # values never matter
    assert base != _key(_graph(torch.randn(4, 5)))  # shapes do
    assert base != _key(_graph(torch.randn(4, 3, dtype=torch.bfloat16)))  # dtypes do
    assert base != _key(_graph(torch.randn(4, 3), lambda x: torch.relu(x) * 3))  # args do
    assert base != _key(_graph(torch.randn(4, 3)), sixty_four_bit="error")  # options do


def test_symbolic_graphs_are_not_indexed():
    gm = make_fx(lambda x: x * 2, tracing_mode="symbolic")(torch.randn(4, 3))
    assert _key(gm) is None


def test_specs_round_trip():
    gm = _graph(torch.randn(4, 3))
    lowered = lower_graph(gm)
    key = graph_key(lowered.text, io_specs=None, artifact_form="portable")
    key2, back = load_index(dump_index(key, lowered))
    assert key2 == key
    assert back.text == lowered.text and back.num_results == lowered.num_results
    assert back.inputs == lowered.inputs and back.outputs == lowered.outputs
