"""Partitioning: split reasons, fused regions, tiny islands left eager."""

from __future__ import annotations

import torch

from neuron_compile.partition import is_fully_supported, partition, split_reasons, summarize
from tests.custom_ops import CPU_SCAN, cpu_scan
from tests.helpers import trace_aten

aten = torch.ops.aten


def _two_regions(x, w):
    y = torch.relu(x @ w)
    z = cpu_scan(y)
    values = cpu_scan(z @ z.T)  # a second island of the op with no lowering
    return (values * 2 + 1).sum(), z


def test_split_reasons_name_each_unsupported_op():
    gm = trace_aten(_two_regions, torch.randn(4, 8), torch.randn(8, 8))
    reasons = split_reasons(gm)
    assert [r.op for r in reasons] == [CPU_SCAN, CPU_SCAN]
    assert all("no lowering registered" in r.reason for r in reasons)
    assert summarize(reasons).startswith(f"{CPU_SCAN} x2")
    assert not is_fully_supported(gm)


def test_supported_regions_become_submodules_and_fallbacks_stay_eager():
    gm = trace_aten(_two_regions, torch.randn(4, 8), torch.randn(8, 8))
    fused, names = partition(gm)
    assert sorted(names) == ["fused_0", "fused_1", "fused_2"]  # x@w+relu, z@z.T, sum
    parent_ops = [str(n.target) for n in fused.graph.nodes if n.op == "call_function"]
    assert parent_ops.count(CPU_SCAN) == 2
    assert "aten.mm.default" not in parent_ops
    for name in names:  # lowering needs metadata on every submodule input
        sub = fused.get_submodule(name)
        assert all("val" in p.meta for p in sub.graph.nodes if p.op == "placeholder")
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    for got, want in zip(fused(x, w), _two_regions(x, w), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_single_op_island_between_fallbacks_is_not_compiled():
    def f(x):
        return cpu_scan(cpu_scan(x).sin())

    gm = trace_aten(f, torch.randn(3, 3))
    _, names = partition(gm)
    assert names == []


def test_fully_supported_graph():
    gm = trace_aten(lambda x: x.sin() * 2, torch.randn(3))
    assert is_fully_supported(gm) and split_reasons(gm) == []
