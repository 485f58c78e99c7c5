"""remove_noops: before/after, idempotence, no-op input, and output identity preserved."""

from __future__ import annotations

import pytest
import torch

from neuron_compile.passes import remove_noops
from tests.helpers import trace_aten

aten = torch.ops.aten


def _targets(gm: torch.fx.GraphModule) -> list:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_removes_clone_alias_and_same_shape_view():
    gm = trace_aten(
        lambda x: torch.ops.aten.alias(torch.relu(x.clone().view(4, 8))) * 2, torch.randn(4, 8)
    )
    assert aten.clone.default in _targets(gm)
    assert remove_noops(gm) is True
    gm.recompile()
    assert not {aten.clone.default, aten.alias.default, aten.view.default} & set(_targets(gm))
    x = torch.randn(4, 8)
    torch.testing.assert_close(gm(x), torch.relu(x) * 2)


def test_second_run_changes_nothing():
    gm = trace_aten(lambda x: x.clone() + 1, torch.randn(3))
    assert remove_noops(gm) is True
    assert remove_noops(gm) is False


def test_graph_without_noops_is_unchanged():
    gm = trace_aten(lambda x: x.sin() + x.view(2, 2).sum(), torch.randn(4))
    before = _targets(gm)
    assert remove_noops(gm) is False
    assert _targets(gm) == before


def test_clone_of_input_returned_as_output_is_kept():
    # Returning the input itself would make the output alias the caller's argument.
    gm = trace_aten(lambda x: x.clone(), torch.randn(3))
    assert remove_noops(gm) is False
    assert aten.clone.default in _targets(gm)


def test_clone_of_a_view_of_an_input_returned_as_output_is_kept():
    # Without it the output is a view of the caller's tensor: it aliases the argument and sees
    # the writes AOTAutograd applies to inputs after the graph.
    gm = trace_aten(lambda x: x[0].clone(), torch.randn(2, 3))
    assert remove_noops(gm) is False
    assert aten.clone.default in _targets(gm)


@pytest.mark.parametrize(
    "snapshot, transposed",
    [(lambda x: x[0].clone(), False), (lambda x: x[:, 0].clone(), True)]
    + [(lambda x: x.view(-1).clone(), False)],
    ids=["select", "column_of_transposed", "view"],
)
def test_snapshot_of_an_input_view_taken_before_an_in_place_update(snapshot, transposed):
    """Compiled: the snapshot returned the input's updated values (the clone was dropped)."""

    def f(x):
        old = snapshot(x)
        x.add_(1)
        return old

    x, y = (
        (torch.zeros(3, 2).t(), torch.zeros(3, 2).t())
        if transposed
        else (
            torch.zeros(2, 3),
            torch.zeros(2, 3),
        )
    )
    torch._dynamo.reset()
    out = torch.compile(f, backend="neuron")(y)
    torch.testing.assert_close(out, f(x), rtol=0, atol=0)
    assert torch.equal(y, x) and out.untyped_storage().data_ptr() != y.untyped_storage().data_ptr()


def test_same_dtype_casts_are_removed():
    def fn(x):
        a = torch.ops.aten._to_copy(x, dtype=torch.float32)
        b = torch.ops.prims.convert_element_type(a.relu(), torch.float32)
        return b + 1

    gm = trace_aten(fn, torch.randn(4))
    assert remove_noops(gm) is True
    gm.recompile()
    assert _targets(gm) == [aten.relu.default, aten.add.Tensor]
    x = torch.randn(4)
    torch.testing.assert_close(gm(x), x.relu() + 1)


def test_casts_that_change_dtype_or_memory_format_are_kept():
    def fn(x):
        a = torch.ops.aten._to_copy(x, dtype=torch.float16)
        b = torch.ops.aten._to_copy(x, memory_format=torch.channels_last)
        c = torch.ops.aten.clone(x, memory_format=torch.channels_last)
        return a.float() + b + c

    gm = trace_aten(fn, torch.randn(1, 2, 3, 4))
    before = _targets(gm)
    assert remove_noops(gm) is False
    assert _targets(gm) == before


def test_identity_expand_and_reshape_are_removed():
    gm = trace_aten(lambda x: x.expand(3, 4).reshape(3, 4).exp(), torch.randn(3, 4))
    assert remove_noops(gm) is True
    gm.recompile()
    assert _targets(gm) == [aten.exp.default]


def test_clone_that_is_written_to_is_kept():
    def fn(x):
        c = x.clone()
        c.add_(1)  # without the clone this would write to the caller's x
        return c * 2

    gm = trace_aten(fn, torch.randn(3))
    assert remove_noops(gm) is False
    x = torch.zeros(3)
    torch.testing.assert_close(gm(x), torch.full((3,), 2.0))
    torch.testing.assert_close(x, torch.zeros(3))


def test_clone_of_a_tensor_written_later_is_kept():
    def fn(x):
        snapshot = x.view(3).clone()
        x.add_(1)
        return snapshot + x

    gm = trace_aten(fn, torch.randn(3))
    assert aten.clone.default in _targets(gm)
    remove_noops(gm)
    assert aten.clone.default in _targets(gm)
    gm.recompile()
    x = torch.zeros(3)
    torch.testing.assert_close(gm(x), torch.ones(3))


def test_clone_of_another_output_is_kept():
    gm = trace_aten(lambda x: (lambda y: (y, y.clone()))(x + 1), torch.randn(3))
    assert remove_noops(gm) is False
    a, b = gm(torch.randn(3))
    assert a is not b


def test_alias_of_another_output_is_dropped():
    # AOTAutograd's (y, alias(y)) for a returned-and-saved y: one object keeps autograd's
    # version-counter check on in-place edits of y working.
    gm = trace_aten(lambda x: (lambda y: (y, aten.alias(y)))(x.exp()), torch.randn(3))
    assert remove_noops(gm) is True
    gm.recompile()
    a, b = gm(torch.randn(3))
    assert a is b


def test_clone_and_alias_chain_collapses():
    gm = trace_aten(lambda x: aten.alias(aten.alias(x.sin().clone()).clone()) + 1, torch.randn(3))
    assert remove_noops(gm) is True
    gm.recompile()
    assert _targets(gm) == [aten.sin.default, aten.add.Tensor]
    assert remove_noops(gm) is False
