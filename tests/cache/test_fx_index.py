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
    assert base != _key(_graph(torch.randn(3, 4).t()))  # strides do


def test_symbolic_graphs_are_not_indexed():
    gm = make_fx(lambda x: x * 2, tracing_mode="symbolic")(torch.randn(4, 3))
    assert _key(gm) is None


def test_specs_round_trip():
    gm = _graph(torch.randn(4, 3))
    lowered = lower_graph(gm)
    io = [[vars(s) for s in lowered.inputs], [vars(o) for o in lowered.outputs]]
    key = graph_key(lowered.text, io_specs=io, artifact_form="portable")
    key2, back = load_index(dump_index(key, lowered))
    assert key2 == key
    assert back.text == lowered.text and back.num_results == lowered.num_results
    assert back.inputs == lowered.inputs and back.outputs == lowered.outputs


def test_signature_mismatch_names_what_does_not_fit():
    from neuron_compile.cache.fx_index import graph_signature, signature_mismatch

    gm = make_fx(lambda x, y: (x + y, x.sum()))(torch.randn(4, 3), torch.randn(4, 3))
    lowered = lower_graph(gm)
    assert signature_mismatch(*graph_signature(gm), lowered) is None
    wider = make_fx(lambda x, y: (x + y, x.sum()))(torch.randn(4, 5), torch.randn(4, 5))
    assert "input" in signature_mismatch(*graph_signature(wider), lowered)
    one_input = make_fx(lambda x: (x + x, x.sum()))(torch.randn(4, 3))
    assert "input" in signature_mismatch(*graph_signature(one_input), lowered)
    one_output = make_fx(lambda x, y: x + y)(torch.randn(4, 3), torch.randn(4, 3))
    assert "returns 2 values" in signature_mismatch(*graph_signature(one_output), lowered)


def test_an_index_entry_that_does_not_fit_its_graph_is_recompiled_not_called(caplog):
    """A damaged entry under a graph's FX index key (here: another graph's specs) must never
    run: the warm start lowers the graph again and gets the right answer."""
    import json
    import shutil

    from neuron_compile.cache.binding import INDEX_FILE
    from neuron_compile.cache.tiers import disk_cache

    def f(x, y):
        return x * y + 1

    x, y = torch.randn(6, 4), torch.randn(6, 4)
    cold = torch.compile(f, backend="neuron", options={"aot_cache": False})(x, y)
    disk = disk_cache()
    [entry] = [e for e in disk.entries() if e.graph_name.endswith(".index")]
    payload = json.loads(entry.read(INDEX_FILE))
    payload["inputs"][0][2] = [4, 6]  # the first input's shape, as another graph has it
    shutil.rmtree(entry.path)  # replaced by a well-formed entry with the damaged specs
    disk.put(
        entry.key,
        {INDEX_FILE: json.dumps(payload).encode()},
        graph_name=entry.graph_name,
        components=entry.components,
    )
    torch._dynamo.reset()
    with caplog.at_level("WARNING", logger="neuron_compile.compiler"):
        out = torch.compile(f, backend="neuron", options={"aot_cache": False})(x, y)
    assert torch.equal(out, cold)
    torch.testing.assert_close(out, f(x, y))
    # Refused by the key binding (its specs no longer derive the graph key it names) before the
    # signature check would refuse it.
    assert "derive graph key" in caplog.text or "does not fit the graph" in caplog.text
