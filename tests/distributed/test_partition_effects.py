"""Collectives that run on the CPU between compiled regions keep their place (issue 16).

The partitioner places a region where its last node was and then sorts the graph; a region that
spans a collective drags the collectives after it, and two collectives can swap. Collectives are
therefore barriers no region crosses, and the fallback runs the graph's nodes in order.

Collectives are lowered now (issue 20); one that is not (a group whose partition is unknown, an
uneven all_to_all) still runs eagerly. These tests take the lowerings of ``all_reduce`` and
``wait_tensor`` away to be that collective.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import TorchDispatchMode

from neuron_compile import partition as partition_mod
from neuron_compile.compiler import compile_graph
from neuron_compile.config import NeuronConfig
from neuron_compile.fallback import FallbackRunner
from neuron_compile.lowering import registry
from neuron_compile.passes.effects import communicates
from tests.distributed.group import single_rank_group

c10d = torch.ops._c10d_functional


@pytest.fixture(scope="module")
def world_group() -> str:
    with single_rank_group() as name:
        yield name


@pytest.fixture
def group(world_group: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The world group, with ``all_reduce`` and ``wait_tensor`` left without a lowering."""
    for op in (c10d.all_reduce.default, c10d.wait_tensor.default):
        monkeypatch.delitem(registry._LOWERINGS, (op, registry.REFERENCE))
    return world_group


def _two_reductions(group: str):
    """``b``'s reduction comes first in the program; the work after both (``d``) reads ``b`` but
    not the reductions, so a partitioner free to fuse ``b`` and ``d`` places the region after the
    second reduction, which then runs first."""

    def reduced(t: torch.Tensor) -> torch.Tensor:
        return c10d.wait_tensor(c10d.all_reduce(t, "sum", group))

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        b = x * 2 + 1
        first = reduced(b)
        second = reduced(x)
        d = b * 3 + 1
        return first, d, second

    return fn


def _collective_names(gm: fx.GraphModule) -> list[str]:
    return [n.name for n in gm.graph.nodes if communicates(n)]


def test_regions_never_span_an_eager_collective(group: str) -> None:
    gm = make_fx(_two_reductions(group), tracing_mode="fake")(torch.randn(4))
    order = _collective_names(gm)
    fused, regions = partition_mod.partition(gm)
    assert _collective_names(fused) == order
    assert len(regions) == 2  # b before the reductions, d after them
    # Every region lies between two consecutive collectives of the partitioned graph.
    position = {n: i for i, n in enumerate(fused.graph.nodes)}
    collectives = [position[n] for n in fused.graph.nodes if communicates(n)]
    for node in fused.graph.nodes:
        if node.op == "call_module":
            assert sum(p < position[node] for p in collectives) in (0, len(collectives))


def test_unsplit_partitions_would_reorder_collectives(
    group: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The graph above really exercises the barrier: without it the two reductions swap."""
    monkeypatch.setattr(partition_mod, "_split_at_effects", lambda graph, parts: parts)
    gm = make_fx(_two_reductions(group), tracing_mode="fake")(torch.randn(4))
    order = _collective_names(gm)
    fused, _ = partition_mod.partition(gm)
    assert _collective_names(fused) != order


class _CollectiveLog(TorchDispatchMode):
    """Records the collectives dispatched while active, with their first argument."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, torch.Tensor]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func.namespace == "_c10d_functional":
            self.calls.append((func.__name__.split(".")[0], args[0].clone()))
        return func(*args, **(kwargs or {}))


def test_fallback_runs_collectives_in_graph_order(group: str) -> None:
    fn = _two_reductions(group)
    x = torch.randn(4)
    gm = make_fx(fn, tracing_mode="fake")(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the FallbackWarning: these collectives run eagerly
        runner = compile_graph(gm, [x], name="two_reductions", kind="inference", cfg=NeuronConfig())
    assert isinstance(runner, FallbackRunner)
    log = _CollectiveLog()
    with log:
        out = runner([x])
    names = [name for name, _ in log.calls]
    assert names == ["all_reduce", "wait_tensor", "all_reduce", "wait_tensor"]
    torch.testing.assert_close(log.calls[0][1], x * 2 + 1)  # b's reduction first, as written
    torch.testing.assert_close(log.calls[2][1], x)
    # One rank: a reduction returns its input. The regions run on XLA, which may contract
    # b * 3 + 1 into one fused multiply-add (1 ulp from eager's two roundings).
    for got, want in zip(out, fn(x), strict=True):
        torch.testing.assert_close(got, want)
