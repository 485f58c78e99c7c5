"""functionalize_inplace: in-place ops on intermediates become functional when nobody can tell."""

from __future__ import annotations

import logging

import torch

from neuron_compile.passes import functionalize_inplace
from neuron_compile.passes.functionalize_inplace import functional_variant
from tests.passes.graphs import build, targets

aten = torch.ops.aten


def _call(g, target, args, val, kwargs=None):
    node = g.call_function(target, args, kwargs or {})
    node.meta["val"] = val
    return node


def _with_input_meta(gm, *vals):
    for node, val in zip((n for n in gm.graph.nodes if n.op == "placeholder"), vals, strict=True):
        node.meta["val"] = val
    return gm


def test_variant_lookup_goes_by_schema():
    assert functional_variant(aten.add_.Tensor) is aten.add.Tensor
    assert functional_variant(aten.mul_.Scalar) is aten.mul.Scalar
    assert functional_variant(aten.relu_.default) is aten.relu.default
    assert functional_variant(aten.copy_.default) is aten.copy.default
    assert functional_variant(aten.add.Tensor) is None  # not in-place
    assert functional_variant(aten.squeeze_.dim) is None  # its twin is a view
    assert functional_variant(aten.add.out) is None  # writes ``out``, not ``self``


def _chain(g, x):
    """t = x * 2; t.add_(1); t.relu_(); return t.relu_() result * 3."""
    v = torch.empty(3, 4)
    t = _call(g, aten.mul.Tensor, (x, 2), v)
    a = _call(g, aten.add_.Tensor, (t, 1), v)
    r = _call(g, aten.relu_.default, (a,), v)
    return _call(g, aten.mul.Tensor, (r, 3), v)


def test_inplace_chain_on_intermediate_becomes_functional():
    gm = _with_input_meta(build(1, _chain), torch.empty(3, 4))
    x = torch.randn(3, 4)
    want = gm(x)
    assert functionalize_inplace(gm) is True
    gm.recompile()
    assert targets(gm) == [aten.mul.Tensor, aten.add.Tensor, aten.relu.default, aten.mul.Tensor]
    torch.testing.assert_close(gm(x), want)


def test_copy_into_intermediate_becomes_copy():
    def body(g, x, y):
        v = torch.empty(3, 4)
        t = _call(g, aten.exp.default, (x,), v)
        c = _call(g, aten.copy_.default, (t, y), v)
        return _call(g, aten.add.Tensor, (c, 1), v)

    gm = _with_input_meta(build(2, body), torch.empty(3, 4), torch.empty(4))
    x, y = torch.randn(3, 4), torch.randn(4)
    want = gm(x, y)
    assert functionalize_inplace(gm) is True
    gm.recompile()
    assert targets(gm) == [aten.exp.default, aten.copy.default, aten.add.Tensor]
    torch.testing.assert_close(gm(x, y), want)


def test_read_of_mutated_intermediate_by_another_name_is_kept():
    def body(g, x):
        v = torch.empty(3, 4)
        t = _call(g, aten.mul.Tensor, (x, 2), v)
        view = _call(g, aten.view.default, (t, [12]), torch.empty(12))  # an alias made before
        a = _call(g, aten.add_.Tensor, (t, 1), v)
        return (a, _call(g, aten.sum.default, (view,), torch.empty(())))  # reads the write

    gm = _with_input_meta(build(1, body), torch.empty(3, 4))
    before = targets(gm)
    x = torch.randn(3, 4)
    want = gm(x)
    assert functionalize_inplace(gm) is False
    assert targets(gm) == before
    for got, exp in zip(gm(x), want, strict=True):
        torch.testing.assert_close(got, exp)


def test_mutated_intermediate_returned_itself_is_kept():
    def body(g, x):
        v = torch.empty(3, 4)
        t = _call(g, aten.mul.Tensor, (x, 2), v)
        _call(g, aten.add_.Tensor, (t, 1), v)
        return t

    gm = _with_input_meta(build(1, body), torch.empty(3, 4))
    assert functionalize_inplace(gm) is False


def test_input_mutations_and_buffer_writes_are_never_touched():
    def body(g, x, y):
        v = torch.empty(3, 4)
        s = _call(g, aten.mul.Tensor, (y, 2), v)
        _call(g, aten.copy_.default, (x, s), v)  # AOTAutograd's input mutation
        b = g.get_attr("buf")
        _call(g, aten.add_.Tensor, (b, 1), v)
        view = _call(g, aten.view.default, (x, [12]), torch.empty(12))
        return _call(g, aten.mul_.Tensor, (view, 2), torch.empty(12))  # a view of an input

    gm = build(2, body, buffers={"buf": torch.zeros(3, 4)})
    gm = _with_input_meta(gm, torch.empty(3, 4), torch.empty(3, 4))
    before = targets(gm)
    assert functionalize_inplace(gm) is False
    assert targets(gm) == before


def test_promoting_inplace_op_is_kept():
    """``a.mul_(b)`` keeps ``a``'s float16; ``mul(a, b)`` would be float32."""

    def body(g, x, y):
        t = _call(g, aten.neg.default, (x,), torch.empty(4, dtype=torch.float16))
        m = _call(g, aten.mul_.Tensor, (t, y), torch.empty(4, dtype=torch.float16))
        return _call(g, aten.neg.default, (m,), torch.empty(4, dtype=torch.float16))

    gm = _with_input_meta(build(2, body), torch.empty(4, dtype=torch.float16), torch.empty(4))
    assert functionalize_inplace(gm) is False


def test_second_run_changes_nothing_and_logs():
    gm = _with_input_meta(build(1, _chain), torch.empty(3, 4))
    assert functionalize_inplace(gm) is True
    nodes = [(n.op, n.target, n.args) for n in gm.graph.nodes]
    assert functionalize_inplace(gm) is False
    assert [(n.op, n.target, n.args) for n in gm.graph.nodes] == nodes


def test_logs_what_it_changed(caplog):
    gm = _with_input_meta(build(1, _chain), torch.empty(3, 4))
    with caplog.at_level(logging.DEBUG, logger="neuron_compile.passes"):
        functionalize_inplace(gm)
    assert any(
        "functionalize_inplace: rewrote 2 in-place ops" in r.getMessage() for r in caplog.records
    )


def test_torch_compile_numerics_unchanged():
    def fn(x):
        t = x * 2
        t.add_(1)
        return torch.relu_(t) * 3

    x = torch.randn(3, 4, requires_grad=True)
    got = torch.compile(fn, backend="neuron_compile")(x)
    got.sum().backward()
    x2 = x.detach().requires_grad_()
    want = fn(x2)
    want.sum().backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(x.grad, x2.grad)


def test_hand_built_inplace_graph_runs_through_our_compiler():
    """AOTAutograd functionalizes what torch.compile captures, so the in-place graph is handed
    to the compiler directly: with the pass in the pipeline it lowers with no eager fallback."""
    from neuron_compile.compiler import compile_graph
    from neuron_compile.config import NeuronConfig

    gm = _with_input_meta(build(1, _chain), torch.empty(3, 4))
    x = torch.randn(3, 4)
    want = gm(x)
    compiled = compile_graph(
        gm, [x], name="inplace", kind="inference", cfg=NeuronConfig(fallback="error")
    )
    (got,) = compiled([x])
    torch.testing.assert_close(got, want)
