"""Issue 20: collectives compile into the graph and XLA CPU runs them across real gloo ranks.

Each test starts real ranks of ``collectives_worker.py``: the compiled module, collectives and
all, runs on jaxlib's distributed CPU client, and must match eager bit for bit (small-integer
floats: every sum is exact in any order) with no fallback op and the replica groups the mesh
implies.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch.distributed as dist

from tests.distributed.launch import run_ranks

WORKER = Path(__file__).with_name("collectives_worker.py")

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(), reason="torch built without gloo"
)


def _check(lines: list[dict], outputs: int, graphs: int) -> None:
    for line in lines:
        assert line["log_warnings"] == [], line
        assert line["equal"] == [True] * outputs, line
        assert line["fallback"] == [{}] * graphs, line  # no collective ran eagerly


def test_every_collective_matches_eager_on_two_ranks() -> None:
    lines = run_ranks(WORKER, ["world"], 2)
    _check(lines, outputs=18, graphs=1)
    for line in lines:
        # all_reduce x5 (sum, max, min, product, avg), all_gather, reduce_scatter, broadcast (an
        # all_gather), all_to_all, the int64 sum, then the three coalesced ops (two tensors
        # each) and the autograd forms of reduce_scatter and all_to_all: all over the world
        assert line["groups"] == [[[0, 1]]] * 18, line
        assert line["dtypes"][9] == "torch.int64"  # narrowed inside, int64 again outside
        counts = {"all_reduce": 8, "all_gather": 4, "reduce_scatter": 4, "all_to_all": 2}
        assert line["collectives"] == [counts], line  # GraphRecord.collectives


def test_collectives_of_each_ranks_own_constants_are_not_folded() -> None:
    lines = run_ranks(WORKER, ["constants"], 2)
    _check(lines, outputs=8, graphs=1)


def test_collectives_of_tensors_without_rows_run_eagerly_in_order() -> None:
    """An all_gather or reduce_scatter of a tensor with no rows (which StableHLO rejects) runs
    through c10d on the CPU, between the compiled collectives, with eager's empty results; its
    ``wait_tensor`` runs there too (compiled, it was the identity and c10d never waited: the
    launcher fails on c10d's "unwaited collective" warning)."""
    lines = run_ranks(WORKER, ["no_rows"], 2)
    for line in lines:
        assert line["log_warnings"] == [], line
        assert line["equal"] == [True] * 4, line
        fallback = {
            "_c10d_functional.all_gather_into_tensor.default": 1,
            "_c10d_functional.reduce_scatter_tensor.default": 1,
            "_c10d_functional.wait_tensor.default": 2,
        }
        assert line["fallback"] == [fallback], line


def test_collectives_need_only_the_ranks_they_reach() -> None:
    """Ranks 0 and 1 run a compiled collective over their subgroup and over groups of one rank
    while ranks 2 and 3 never compile one (a pipeline's other stage): XLA's runtime for it joins
    ranks 0 and 1 alone, where it waited for all four (and hung)."""
    lines = run_ranks(WORKER, ["one_stage"], 4, timeout=240)
    _check(lines[:2], outputs=2, graphs=1)
    for line in lines[:2]:
        assert line["groups"] == [[[0, 1], [2, 3]], [[0], [1], [2], [3]]], line


def test_warm_cache_runs_the_stored_executables(tmp_path: Path) -> None:
    """Cold then warm, fresh processes sharing one cache: the warm ranks load the artifact and
    their own executables (the device assignment is in the executable's key) and still match."""
    env = {"NEURON_COMPILE_CACHE_DIR": str(tmp_path)}
    cold = run_ranks(WORKER, ["world"], 2, env=env)
    warm = run_ranks(WORKER, ["world"], 2, env=env)
    _check(cold + warm, outputs=18, graphs=1)
    assert [line["sources"] for line in cold] != [["disk"], ["disk"]]
    assert [line["sources"] for line in warm] == [["disk"], ["disk"]]


def test_a_warm_cache_of_another_world_size_is_not_used(tmp_path: Path) -> None:
    """A frame cached at world size 2 and run at 3 with the same shapes: its Dynamo graph is the
    same (the world is group "0" at any size), but its collectives reduce over other ranks. The
    AOTAutograd entry of size 2 served size 3: two ranks summed over two, the third hung."""
    env = {
        "NEURON_COMPILE_CACHE_DIR": str(tmp_path / "neuron"),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
    }
    cold = run_ranks(WORKER, ["any_size"], 2, env=env)
    _check(cold, outputs=2, graphs=1)
    warm = run_ranks(WORKER, ["any_size"], 3, env=env, timeout=240)
    _check(warm, outputs=2, graphs=1)


def test_collectives_keep_their_order_when_a_rank_folds_their_operands() -> None:
    lines = run_ranks(WORKER, ["folds"], 2)
    _check(lines, outputs=2, graphs=1)


def test_mesh_dimensions_become_replica_groups_on_four_ranks() -> None:
    lines = run_ranks(WORKER, ["mesh"], 4)
    _check(lines, outputs=3, graphs=1)
    mesh = lines[0]["mesh"]
    tp = [list(row) for row in mesh]  # groups along the last dimension: the rows
    dp = [list(col) for col in zip(*mesh, strict=True)]  # along the first: the columns
    for line in lines:
        assert line["groups"] == [tp, dp, tp], line  # the same partition on every rank
    # DeviceMesh [[0, 3], [1, 2]]: groups come from the mesh (sorted: c10d's rank order)
    _check([line["custom"] for line in lines], outputs=3, graphs=1)
    for line in lines:
        tp, dp = [[0, 3], [1, 2]], [[0, 1], [2, 3]]
        assert line["custom"]["groups"] == [tp, dp, tp], line


def test_saved_activation_crosses_from_the_distributed_client() -> None:
    """The forward's collective runs on the distributed client, the backward (no collective)
    on the local one; the activation it saved crosses between them."""
    lines = run_ranks(WORKER, ["saved"], 2)
    _check(lines, outputs=3, graphs=2)
