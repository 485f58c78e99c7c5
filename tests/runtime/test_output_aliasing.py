"""Outputs eager returns as views of another output or of an input stay views
(``OutputSpec`` kinds ``result_view`` / ``input_view``), as Inductor's do.

Before, every output was a fresh executor buffer. AOTAutograd trusts the compiled graph for views
it does not regenerate (a view of an intermediate without grad, ``unbind``'s views under grad,
a view of an aliased input's synthetic base), so an in-place edit of one output did not show in
its views, a view kept across a graph break read stale values, and a mutated view of an aliased
input came back as another row of it.
"""

from __future__ import annotations

import torch

from neuron_compile.lowering.lower_graph import lower_graph
from tests.helpers import index_roundtrip, run_child, trace_aten


def _both(f, *make_args):
    """``f``'s outputs eagerly and compiled, each on fresh arguments from ``make_args``."""
    eager = f(*(m() for m in make_args))
    torch._dynamo.reset()
    return eager, torch.compile(f, backend="neuron")(*(m() for m in make_args))


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _views_of_one_intermediate(x):
    y = x + 1
    return y, y.t(), y[1]


def test_views_of_one_intermediate_stay_views_of_it():
    for outs in _both(_views_of_one_intermediate, lambda: torch.arange(9.0).view(3, 3)):
        y, yt, row = outs
        assert _same_storage(y, yt) and _same_storage(y, row)
        assert (yt.stride(), row.storage_offset()) == ((1, 3), 3)
        y.mul_(10)
        torch.testing.assert_close(row, torch.tensor([40.0, 50.0, 60.0]))
        torch.testing.assert_close(yt, y.t())


def _view_across_a_graph_break(x):
    y = x + 1
    row = y[0]
    print("", end="")  # a graph break: row and y leave the first graph
    y.mul_(10)
    return row + 0


def test_a_view_kept_across_a_graph_break_sees_its_base_change():
    eager, compiled = _both(_view_across_a_graph_break, lambda: torch.zeros(2, 2))
    torch.testing.assert_close(compiled, eager)
    assert compiled.tolist() == [10.0, 10.0]


def _unbind(x):
    return x.unbind(0)


def test_unbind_of_an_input_under_grad_returns_views_of_it():
    leaf = torch.zeros(2, 2, requires_grad=True)
    x = leaf.clone()
    a, b = torch.compile(_unbind, backend="neuron")(x)
    assert _same_storage(a, x) and b.storage_offset() == 2
    (a.sum() + 2 * b.sum()).backward()
    assert leaf.grad.tolist() == [[1.0, 1.0], [2.0, 2.0]]
    with torch.no_grad():
        x.fill_(5)
    assert a.tolist() == b.tolist() == [5.0, 5.0]


def _mutated_view_of_aliased_input(b, r):
    r.add_(1)
    b.sum()  # b must be used, so that both aliased inputs are graph inputs
    return r


def test_a_mutated_view_of_an_aliased_input_is_the_right_row():
    outs, bases = [], []
    for fn in (_mutated_view_of_aliased_input, None):
        torch._dynamo.reset()
        fn = fn or torch.compile(_mutated_view_of_aliased_input, backend="neuron")
        b = torch.arange(6.0).view(3, 2)
        outs.append(fn(b, b[1]))
        bases.append(b)
    (eager, compiled), (eager_b, compiled_b) = outs, bases
    assert compiled.storage_offset() == eager.storage_offset() == 2
    torch.testing.assert_close(compiled, eager)
    torch.testing.assert_close(compiled_b, eager_b)


def test_the_same_node_returned_twice_is_one_tensor():
    """Not a view of itself: both slots hold one tensor, as before."""
    gm = trace_aten(lambda x: ((y := x * 2), y), torch.ones(3))
    assert [o.kind for o in lower_graph(gm).outputs] == ["result", "result"]


def test_the_fx_index_carries_view_outputs():
    gm = trace_aten(_views_of_one_intermediate, torch.arange(9.0).view(3, 3))
    lowered = lower_graph(gm)
    assert [o.kind for o in lowered.outputs] == ["result", "result_view", "result_view"]
    assert lowered.outputs[2].value == ((3,), 3) and lowered.num_results == 3  # module unchanged
    assert index_roundtrip(lowered).outputs == lowered.outputs


_SCRIPT = """
import json, torch
def f(x):
    y = x + 1
    return y, y.t(), y[1]
y, yt, row = torch.compile(f, backend="neuron")(torch.arange(9.0).view(3, 3))
y.mul_(10)
print(json.dumps([row.tolist(), yt.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()]))
"""


def test_views_survive_a_warm_start(tmp_path):
    """Cold, then warm from the on-disk cache (FX index and AOTAutogradCache), in fresh
    processes: the same aliasing."""
    cold, _ = run_child(_SCRIPT, tmp_path)
    assert any((tmp_path / "neuron").rglob("*")), "nothing was cached: not a warm start next"
    warm, _ = run_child(_SCRIPT, tmp_path)
    assert cold == warm == [[40.0, 50.0, 60.0], True]


def _empty_then_out(x):
    o = torch.empty(0)
    print("", end="")  # a graph break: o leaves the compiled frame
    return torch.add(x, 1, out=o)


def test_an_empty_output_can_be_resized():
    """``out=`` grows an empty tensor the frame made: ours are torch's (executor buffers are not
    resizable), fresh on every call."""
    x = torch.arange(3.0)
    compiled = torch.compile(_empty_then_out, backend="neuron")
    first, second = compiled(x), compiled(x + 1)
    assert first.tolist() == [1.0, 2.0, 3.0] and second.tolist() == [2.0, 3.0, 4.0]
    empty = torch.compile(lambda x: (x * 2, x.new_empty(0)), backend="neuron")(x)[1]
    assert empty.shape == (0,) and empty.resize_(4).shape == (4,)


def _chunks(x):
    return (x * 2).chunk(2)


def _row_then_base(x):
    y = x * 2
    return y[1], y


def _expanded_row_then_base(x):
    y = x * 2
    return y[0].expand(4, 3), y


def test_views_returned_before_their_base_or_without_it():
    """A view of an intermediate listed before its base was planned as the base (setStorage
    out of bounds, "invalid storage offset"); an expanded one came back as a copy."""
    for f in (_chunks, _row_then_base, _expanded_row_then_base):
        eager, compiled = _both(f, lambda: torch.arange(6.0).view(2, 3))
        for e, c in zip(eager, compiled, strict=True):
            torch.testing.assert_close(c, e, rtol=0, atol=0)
            assert c.stride() == e.stride()
        if f is not _chunks:  # chunks without their base are tensors of their own
            assert [c.storage_offset() for c in compiled] == [e.storage_offset() for e in eager]
            view, base = compiled
            assert _same_storage(view, base)
            base.fill_(7)
            assert bool((view == 7).all())


def _transposed_then_base(x):
    y = x.sin()
    return y.t(), y


def test_in_place_edit_of_a_view_returned_beside_its_base_under_grad():
    """The base, not the view, is the tensor returned: autograd refused ``a.mul_(2)`` on a view
    AOTAutograd rebuilt from a base that was itself a view made inside its Function."""
    grads = []
    for fn in (_transposed_then_base, torch.compile(_transposed_then_base, backend="neuron")):
        x = torch.arange(6.0).view(2, 3).requires_grad_()
        a, b = fn(x)
        a.mul_(2)
        (a.sum() + b.sum()).backward()
        grads.append(x.grad)
    torch.testing.assert_close(grads[1], grads[0])
