"""The cost model's collective term (``trainium/cost_model.py``): a collective costs the bytes
one rank sends over its links (ring all-reduce ``2(n-1)/n`` of the buffer, all-gather /
reduce-scatter / all-to-all ``(n-1)/n``) divided by the link bandwidth per chip. The
bandwidths are ``TrainiumTarget.links``: NeuronLink for groups that fit one instance, EFA
beyond. Modules are hand-written and verified by jaxlib."""

from __future__ import annotations

import pytest

from neuron_compile import artifact
from neuron_compile.targets import get_target
from neuron_compile.trainium.cost_model import (
    collective_seconds,
    estimate_for_record,
    estimate_module,
    link_share,
    module_world,
    replica_groups,
)

TRN2, TRN3 = get_target("trn2"), get_target("trn3")
_CHANNEL = "channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>"
_ADD = (
    "({\n    ^bb0(%a: tensor<f32>, %b: tensor<f32>):\n"
    "      %s = stablehlo.add %a, %b : tensor<f32>\n      stablehlo.return %s : tensor<f32>\n"
    "    })"
)


def _groups(n: int, world: int) -> str:
    rows = [list(range(g * n, (g + 1) * n)) for g in range(world // n)]
    return f"replica_groups = dense<{rows}> : tensor<{len(rows)}x{n}xi64>"


def _module(world: int, arg: str, result: str, body: str) -> str:
    text = f"""module @neuron_graph attributes {{mhlo.num_partitions = 1 : i32, \
mhlo.num_replicas = {world} : i32}} {{
  func.func public @main(%arg0: {arg}) -> {result} {{
{body}
    return %r : {result}
  }}
}}
"""
    artifact.verify(text)
    return text


def _all_reduce(n: int, world: int, shape: str = "1024x1024") -> str:
    t = f"tensor<{shape}xf32>"
    return _module(
        world,
        t,
        t,
        f'    %r = "stablehlo.all_reduce"(%arg0) {_ADD} {{{_CHANNEL}, {_groups(n, world)}}}'
        f" : ({t}) -> {t}",
    )


def _collective_op(cost):
    (op,) = [c for c in cost.ops if c.bound == "link"]
    return op


MIB4 = 1024 * 1024 * 4  # bytes of a 1024x1024 f32 buffer


def test_the_bandwidth_constants_are_the_cited_ones():
    assert TRN2.links.intra_node == 1024e9  # NeuronLink-v3, GB/s per chip intra-instance
    assert TRN2.links.inter_node == 3200e9 / 8 / 16  # EFAv3 3,200 Gbps over 16 chips
    assert TRN2.links.chips_per_node == 16
    assert TRN3.links.intra_node == 2.56e12 and TRN3.links.inter_node == 12800e9 / 8 / 64
    for target in (TRN2, TRN3):
        assert "EFA" in target.links.source and "NeuronLink" in target.links.source
    assert "unverified" in TRN3.links.source


def test_an_all_reduce_costs_its_ring_bytes_over_neuronlink():
    cost = estimate_module(_all_reduce(4, world=4), "trn2")
    op = _collective_op(cost)
    sent = 2 * 3 / 4 * MIB4  # ring all-reduce over 4 ranks
    assert op.op_name == "stablehlo.all_reduce"
    assert op.bytes == pytest.approx(sent)
    assert op.seconds == pytest.approx(sent / TRN2.links.intra_node)
    assert cost.seconds == pytest.approx(op.seconds)  # the only op of the module


def test_the_estimate_grows_with_the_group_as_the_formula_says():
    seconds = {}
    for n in (2, 4, 8, 16, 32):
        seconds[n] = _collective_op(estimate_module(_all_reduce(n, world=32), "trn2")).seconds
    for n in (2, 4, 8, 16):  # within one trn2.48xlarge: NeuronLink
        assert seconds[n] == pytest.approx(2 * (n - 1) / n * MIB4 / TRN2.links.intra_node)
    assert seconds[2] < seconds[4] < seconds[8] < seconds[16]
    # 32 ranks span two instances: EFA, 40x slower per chip
    assert seconds[32] == pytest.approx(2 * 31 / 32 * MIB4 / TRN2.links.inter_node)
    assert seconds[32] > 30 * seconds[16]


def test_trn3_uses_its_own_links():
    text = _all_reduce(4, world=4)
    trn3 = _collective_op(estimate_module(text, "trn3")).seconds
    assert trn3 == pytest.approx(1.5 * MIB4 / TRN3.links.intra_node)
    assert trn3 < _collective_op(estimate_module(text, "trn2")).seconds


def test_gather_scatter_and_all_to_all_move_n_minus_1_over_n_of_the_full_buffer():
    n = 4
    small, full = "tensor<256x1024xf32>", "tensor<1024x1024xf32>"
    gather = _module(
        n,
        small,
        full,
        f'    %r = "stablehlo.all_gather"(%arg0) {{all_gather_dim = 0 : i64, {_CHANNEL}, '
        f"{_groups(n, n)}}} : ({small}) -> {full}",
    )
    scatter = _module(
        n,
        full,
        small,
        f'    %r = "stablehlo.reduce_scatter"(%arg0) {_ADD} {{{_CHANNEL}, {_groups(n, n)}, '
        f"scatter_dimension = 0 : i64}} : ({full}) -> {small}",
    )
    to_all = _module(
        n,
        full,
        full,
        f'    %r = "stablehlo.all_to_all"(%arg0) {{{_CHANNEL}, concat_dimension = 0 : i64, '
        f"{_groups(n, n)}, split_count = 4 : i64, split_dimension = 0 : i64}} : ({full}) -> {full}",
    )
    for text in (gather, scatter, to_all):
        op = _collective_op(estimate_module(text, "trn2"))
        assert op.bytes == pytest.approx(3 / 4 * MIB4), op.op_name  # the full (gathered) buffer
        assert op.seconds == pytest.approx(3 / 4 * MIB4 / TRN2.links.intra_node)


def test_empty_replica_groups_span_the_world():
    t = "tensor<1024x1024xf32>"
    text = _module(
        8,
        t,
        t,
        f'    %r = "stablehlo.all_reduce"(%arg0) {_ADD} {{replica_groups = dense<> : '
        f"tensor<0x0xi64>}} : ({t}) -> {t}",
    )
    assert module_world(text) == 8
    op = _collective_op(estimate_module(text, "trn2"))
    assert op.seconds == pytest.approx(2 * 7 / 8 * MIB4 / TRN2.links.intra_node)


def test_a_group_of_one_moves_nothing():
    cost = estimate_module(_all_reduce(1, world=4), "trn2")
    assert [c.bound for c in cost.ops] == ["free"] and cost.seconds == 0
    assert link_share("all_reduce", 1) == 0 and collective_seconds("all_gather", MIB4, 1) == 0


def test_the_collective_adds_to_the_compute_around_it():
    t = "tensor<1024x1024xf32>"
    text = _module(
        4,
        t,
        t,
        f"    %y = stablehlo.multiply %arg0, %arg0 : {t}\n"
        f'    %r = "stablehlo.all_reduce"(%y) {_ADD} {{{_CHANNEL}, {_groups(4, 4)}}}'
        f" : ({t}) -> {t}",
    )
    cost = estimate_module(text, "trn2")
    multiply = [c for c in cost.ops if c.op_name == "stablehlo.multiply"][0]
    link = _collective_op(cost)
    assert cost.seconds == pytest.approx(multiply.seconds + link.seconds)
    assert estimate_for_record(text, "trn2", 1) == pytest.approx(cost.seconds)


def test_helpers_read_the_printed_attributes():
    assert replica_groups("dense<[[0, 2], [1, -1]]> : tensor<2x2xi64>") == ((0, 2), (1,))
    assert replica_groups("dense<> : tensor<0x0xi64>") == ()
    assert replica_groups("dense<0> : tensor<1x1xi64>") == ((0,),)
    assert replica_groups(None) == ()
    assert module_world("module @m {\n  func.func @main() {\n  }\n}") is None
    assert link_share("stablehlo.all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert link_share("all_to_all", 8) == pytest.approx(7 / 8)
    assert link_share("collective_permute", 8) == 1.0
