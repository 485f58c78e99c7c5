"""remove_noops: before/after, idempotence, no-op input, and output identity preserved."""

from __future__ import annotations

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
