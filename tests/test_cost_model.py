"""Roofline cost model against hand-computed numbers (constants: trainium-nki.md §1.2, §1.4)."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from neuron_compile.cost_model import estimate, node_cost
from neuron_compile.targets import get_target

TRN2, TRN3 = get_target("trn2"), get_target("trn3")


def _node(fn, *args, target):
    gm = make_fx(fn)(*args)
    (node,) = [n for n in gm.graph.nodes if n.target == target]
    return node


def test_bf16_matmul_is_compute_bound_at_79_tflops():
    a, b = (torch.randn(1024, 1024, dtype=torch.bfloat16) for _ in range(2))
    node = _node(torch.mm, a, b, target=torch.ops.aten.mm.default)
    cost = node_cost(node, TRN2)
    flops = 2 * 1024**3  # 2.147e9
    assert cost.flops == flops and cost.bound == "compute"
    assert cost.seconds == pytest.approx(flops / 79e12)  # 27.2 us
    assert cost.bytes == 3 * 1024 * 1024 * 2  # two operands and the result, 2 bytes each
    assert node_cost(node, TRN2, lnc=2).seconds == pytest.approx(flops / (2 * 79e12))


def test_fp32_matmul_uses_the_20_tflops_peak():
    a = torch.randn(512, 256)
    b = torch.randn(256, 512)
    cost = node_cost(_node(torch.mm, a, b, target=torch.ops.aten.mm.default), TRN2)
    assert cost.seconds == pytest.approx(2 * 512 * 512 * 256 / 20e12)  # 6.7 us


def test_skinny_matmul_is_memory_bound():
    a = torch.randn(8, 4096)
    b = torch.randn(4096, 4096)
    cost = node_cost(_node(torch.mm, a, b, target=torch.ops.aten.mm.default), TRN2)
    moved = 4 * (8 * 4096 + 4096 * 4096 + 8 * 4096)
    assert cost.bound == "memory" and cost.seconds == pytest.approx(moved / 0.36e12)  # 187 us


def test_elementwise_add_is_memory_bound_on_trn2_and_trn3():
    x, y = (torch.randn(1 << 20, dtype=torch.bfloat16) for _ in range(2))
    node = _node(torch.add, x, y, target=torch.ops.aten.add.Tensor)
    moved = 3 * (1 << 20) * 2  # read two, write one
    assert node_cost(node, TRN2).seconds == pytest.approx(moved / 0.36e12)  # 17.5 us
    assert node_cost(node, TRN3).seconds == pytest.approx(moved / 0.53e12)
    assert node_cost(node, TRN2).seconds > (1 << 20) / (512 * 0.96e9)  # engine time 2.1 us


def test_reduction_costs_one_pass_over_its_input():
    x = torch.randn(4096, 4096)
    cost = node_cost(_node(lambda t: t.sum(-1), x, target=torch.ops.aten.sum.dim_IntList), TRN2)
    moved = 4 * (4096 * 4096 + 4096)
    assert cost.seconds == pytest.approx(max(moved / 0.36e12, 4096 * 4096 / (256 * 0.96e9)))


def test_views_are_free_and_a_graph_sums_its_nodes():
    x = torch.randn(64, 64)
    gm = make_fx(lambda t: (t.t() @ t).relu().view(-1))(x)
    total, costs = estimate(gm, TRN2)
    assert {c.bound for c in costs if c.node.startswith(("t", "view"))} == {"free"}
    assert total == pytest.approx(sum(c.seconds for c in costs)) and total > 0
    with pytest.raises(ValueError, match="trn2 or trn3"):
        estimate(gm, get_target("cpu"))
