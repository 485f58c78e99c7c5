"""Issue 20: the collective lowering rules, group partitions and keys, in one process.

Multi-rank execution is in ``tests/distributed/test_collectives.py``; here a one-rank gloo world
(every collective is the identity) checks the emitted module, the support reasons and the keys.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed._functional_collectives  # noqa: F401  (registers the autograd ops)
from torch.fx.experimental.proxy_tensor import make_fx
from torch.testing import FileCheck

from neuron_compile import collectives, compiler
from neuron_compile.artifact import verify
from neuron_compile.cache.key import CacheKey, executable_key
from neuron_compile.compiler import fx_index_key
from neuron_compile.config import NeuronConfig
from neuron_compile.lowering import lower_graph
from neuron_compile.partition import split_reasons
from tests.distributed.group import single_rank_group

c10d = torch.ops._c10d_functional


@pytest.fixture(scope="module")
def group() -> str:
    with single_rank_group() as name:
        yield name


def _lowered(fn, *args):
    gm = make_fx(fn, tracing_mode="fake")(*args)
    return gm, lower_graph(gm)


def test_module_states_replicas_and_numbers_channels(group: str) -> None:
    def fn(x):
        a = c10d.wait_tensor(c10d.all_reduce(x, "sum", group))
        b = c10d.wait_tensor(c10d.all_gather_into_tensor(a, 1, group))
        c = c10d.wait_tensor(c10d.reduce_scatter_tensor(b, "max", 1, group))
        d = c10d.wait_tensor(c10d.all_to_all_single(c, [2], [2], group))
        return d

    gm, lowered = _lowered(fn, torch.randn(2, 3))
    verify(lowered.text)
    check = FileCheck().check("mhlo.num_replicas = 1 : i32")
    check = check.check('"stablehlo.all_reduce"').check("stablehlo.add")
    check = check.check("channel_handle<handle = 1").check("replica_groups = dense<[[0]]>")
    check = check.check('"stablehlo.all_gather"').check("handle = 2")
    check = check.check('"stablehlo.reduce_scatter"').check("stablehlo.maximum")
    check.check('"stablehlo.all_to_all"').check_not("channel_handle").run(lowered.text)
    assert [c.op for c in lowered.collectives] == [
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "all_to_all",
    ]
    assert lowered.num_replicas == 1
    assert not split_reasons(gm)  # nothing runs eagerly
    # Each operand goes through a barrier (opaque to constant folding); from the second on,
    # the barrier also takes the previous collective's result (the ranks' common order).
    barriers = [ln for ln in lowered.text.splitlines() if "optimization_barrier" in ln]
    assert [ln.count("%") - 1 for ln in barriers] == [1, 2, 2, 2]  # operands (less the result)


def test_module_without_collectives_has_no_attributes() -> None:
    _, lowered = _lowered(lambda x: x + 1, torch.randn(2))
    assert lowered.text.startswith("module @neuron_graph {")
    assert lowered.collectives == [] and lowered.num_replicas == 1


def test_uneven_all_to_all_and_avg_of_ints_fall_back_with_reasons(group: str) -> None:
    def fn(x, n):
        a = c10d.wait_tensor(c10d.all_to_all_single(x, [3], [3], group))
        return a, c10d.wait_tensor(c10d.all_reduce(n, "avg", group))

    gm = make_fx(fn, tracing_mode="fake")(torch.randn(4), torch.arange(3))
    reasons = {r.op: r.reason for r in split_reasons(gm)}
    assert "uneven splits [3]" in reasons["_c10d_functional.all_to_all_single.default"]
    assert "'avg' reduction of torch.int64" in reasons["_c10d_functional.all_reduce.default"]


@pytest.mark.parametrize(
    ("own", "world", "expected"),
    [
        ((0, 1), 4, ((0, 1), (2, 3))),  # a row of a 2x2 mesh
        ((1, 3), 4, ((0, 2), (1, 3))),  # a column
        ((0, 1, 4, 5), 8, ((0, 1, 4, 5), (2, 3, 6, 7))),  # dims 0 and 2 of a 2x2x2 mesh
        ((2, 6), 8, ((0, 4), (1, 5), (2, 6), (3, 7))),
        ((0, 1, 3), 4, None),  # no translate tiles the rest
        ((0, 2), 6, ((0, 2), (1, 3), (4, 6))),  # rank 6 does not exist: not a tiling...
    ],
)
def test_translates_tile_the_world_or_give_up(own, world, expected) -> None:
    found = collectives._translated_groups("g", own, world)
    if expected is not None and max(max(g) for g in expected) >= world:
        assert found is None  # ... and given up
    else:
        assert found == expected


def test_unknown_partition_is_an_error_naming_the_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(collectives, "world", lambda: (0, 4))
    monkeypatch.setattr(collectives, "group_ranks", lambda name: (0, 1, 3))
    with pytest.raises(collectives.GroupPartitionError, match=r"'7' \(ranks \[0, 1, 3\]\)"):
        collectives.replica_groups("7")


def test_fx_index_key_follows_the_groups_not_the_name(
    group: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group name is a per-process handle: the same name over another partition is another
    graph for the cache."""
    gm = make_fx(lambda x: c10d.wait_tensor(c10d.all_reduce(x, "sum", group)))(torch.randn(2))
    cfg = NeuronConfig()
    first = fx_index_key(gm, cfg)
    assert first == fx_index_key(gm, cfg)
    monkeypatch.setattr(collectives, "replica_groups", lambda name: ((0, 1), (2, 3)))
    assert fx_index_key(gm, cfg) != first


def test_executable_key_holds_world_and_rank_only_with_collectives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    graph = CacheKey((("module", "m"),))
    single = dict(executable_key(graph, "xla_cpu", b"art").parts)
    assert "replicas" not in single and "replica" not in single
    monkeypatch.setattr(collectives, "world", lambda: (3, 4))
    multi = dict(executable_key(graph, "xla_cpu", b"art", replicas=4).parts)
    assert (multi["replicas"], multi["replica"]) == ("4", "3")
    assert "ranks" not in multi  # the whole world: as before
    stage = dict(executable_key(graph, "xla_cpu", b"art", replicas=4, ranks=(2, 3)).parts)
    assert stage["ranks"] == "2,3"  # its own replica numbering and device assignment


def test_graphs_differing_only_in_groups_never_share_an_entry(
    group: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    gm = make_fx(lambda x: c10d.wait_tensor(c10d.all_reduce(x, "sum", group)))(torch.randn(2))
    keys = {}
    for groups in (((0, 1), (2, 3)), ((0, 2), (1, 3))):
        monkeypatch.setattr(collectives, "replica_groups", lambda name, g=groups: g)
        key = compiler._key_of(lower_graph(gm), NeuronConfig())
        keys[groups] = key
        assert key.components()["replica_groups"] == json.dumps([groups], default=list)
    first, second = keys.values()
    assert first.digest() != second.digest()
    assert "replica_groups" in first.explain(second)


def test_reachable_ranks_are_the_connected_component_of_the_groups() -> None:
    from neuron_compile.collectives import reachable_ranks

    tp, dp = ((0, 1), (2, 3)), ((0, 2), (1, 3))
    assert reachable_ranks([tp], 2) == (2, 3)  # a pipeline stage's tensor-parallel group
    assert reachable_ranks([tp, dp], 2) == (0, 1, 2, 3)  # through rank 0's dp group
    assert reachable_ranks([((0,), (1,))], 1) == (1,)  # groups of one: the local client


def test_over_ranks_numbers_replicas_by_position_and_drops_other_groups() -> None:
    """The executable of a module reaching ranks (2, 3) of four: XLA's replica ids are their
    positions, and the groups of ranks 0 and 1 (never reached) are gone."""
    from neuron_compile.runtime.distributed import over_ranks

    text = (
        "module @m attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 4 : i32} {\n"
        '  %0 = "stablehlo.all_reduce"(%a) <{channel_handle = #stablehlo.channel_handle<handle = '
        "1, type = 1>, replica_groups = dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>}> ...\n"
        '  %1 = "stablehlo.all_gather"(%b) <{replica_groups = dense<[[0], [1], [2], [3]]> : '
        "tensor<4x1xi64>}> ...\n"
    )
    out = over_ranks(text, (2, 3))
    assert "mhlo.num_replicas = 2 : i32" in out
    assert "replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>" in out
    assert "replica_groups = dense<[[0], [1]]> : tensor<2x1xi64>" in out
    assert "handle = 1, type = 1" in out and "[2, 3]" not in out
