"""Issue 20, "settings that must work": real gloo ranks train compiled and eagerly, and agree.

Each setting runs in settings_worker.py on 2 or 4 processes (launch.py). Every rank trains the same
seeded steps twice, eagerly (the reference) and with ``torch.compile(backend="neuron")``, and
reports both runs' losses, the largest parameter and gradient differences of its own shards, and
the graphs neuron_compile compiled with the ops that ran eagerly between them.

Tolerances: the compiled graphs run on XLA's CPU client and the reference on ATen, so float32
matmuls and reductions sum in different orders (and collectives may too, once they run inside
XLA): losses agree to rtol 1e-5; parameters to 1e-5 absolute after AdamW steps (AdamW divides by
sqrt(v), which turns 1e-7 gradient differences into ~1e-6 parameter differences; SGD stays ~1e-7).

Two tests per setting: ``..._matches_eager`` (parity, and graphs really compiled) and
``..._collectives_are_compiled`` (no collective ran as a CPU fallback: they failed while
collectives fell back to eager CPU). Both share one launch (``_launch`` is cached).
"""

from __future__ import annotations

import functools
import importlib.util
import re
from pathlib import Path

import pytest
import torch.distributed as dist

from tests.distributed.launch import EXAMPLES, launch, run_ranks

WORKER = Path(__file__).with_name("settings_worker.py")
LOSS_RTOL, LOSS_ATOL = 1e-5, 1e-6
PARAM_ATOL = 1e-5

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(), reason="no gloo"
)


@functools.cache
def _launch(setting: str, world_size: int, launcher: str = "subprocess") -> tuple[dict, ...]:
    # Offline: the Hugging Face setting builds its model from a config; nothing may be fetched.
    # No AOTAutograd-cache warm start: the worker reads each graph's collectives from its FX
    # graph, which such a start does not trace.
    env = {"HF_HUB_OFFLINE": "1", "NEURON_COMPILE_AOT_CACHE": "0"}
    return tuple(run_ranks(WORKER, [setting], world_size, launcher=launcher, timeout=420, env=env))


def assert_parity(lines: tuple[dict, ...] | list[dict]) -> None:
    """Every rank: compiled losses, parameters and gradients match the eager run; graphs were
    compiled (a silent eager run would match trivially)."""
    for line in lines:
        who = f"{line['setting']} rank {line['rank']}"
        assert "mismatch" not in line, f"{who}: {line['mismatch']}"
        assert line["compiled"] == pytest.approx(line["eager"], rel=LOSS_RTOL, abs=LOSS_ATOL), (
            f"{who}: compiled losses {line['compiled']} vs eager {line['eager']}"
        )
        assert line["param_diff"] <= PARAM_ATOL, f"{who}: parameters differ by {line['param_diff']}"
        assert line["grad_diff"] <= PARAM_ATOL, f"{who}: gradients differ by {line['grad_diff']}"
        assert line["graphs"] > 0, f"{who}: nothing was compiled by the neuron backend"


def assert_no_collective_fallback(lines: tuple[dict, ...] | list[dict]) -> None:
    """No c10d collective (nor its wait) ran as a CPU fallback on any rank: they are in graphs."""
    for line in lines:
        fallen = [op for op in line["fallback_ops"] if "c10d" in op or "wait_tensor" in op]
        assert not fallen, (
            f"{line['setting']} rank {line['rank']}: collectives ran eagerly between compiled "
            f"regions: {line['fallback_by_graph']}"
        )


def assert_collectives_in_graphs(lines: tuple[dict, ...], kind: str, ops: set[str]) -> None:
    """On every rank, the graphs whose name contains ``kind`` (``forward``, ``backward``,
    ``CompiledAutograd``) hold each of ``ops`` (c10d functional op names) between them."""
    for line in lines:
        graphs = {g: c for g, c in line["collectives_in_graphs"].items() if kind in g}
        assert graphs and None not in graphs.values(), (kind, line["collectives_in_graphs"])
        found = {op for counts in graphs.values() for op in counts}
        assert ops <= found, f"rank {line['rank']}: {kind} graphs hold {graphs}, expected {ops}"


def _same_across(lines: tuple[dict, ...], ranks: list[int], key: str = "eager") -> None:
    values = [lines[r][key] for r in ranks]
    assert all(v == pytest.approx(values[0], rel=LOSS_RTOL) for v in values), (ranks, values)


# --- a. DDP under DDPOptimizer ---------------------------------------------------------------


def test_ddp_optimizer_matches_eager() -> None:
    lines = _launch("ddp_optimizer", 2)
    assert_parity(lines)
    # ~1 KB buckets: DDPOptimizer split the 5 layers into several graph pairs (all-reduces
    # between them, by DDP's reducer).
    assert all(line["graphs"] >= 4 for line in lines), [line["graph_names"] for line in lines]


def test_ddp_optimizer_collectives_are_compiled() -> None:
    assert_no_collective_fallback(_launch("ddp_optimizer", 2))


# --- b. DDP with compiled autograd's python reducer ------------------------------------------


def test_ddp_python_reducer_matches_eager() -> None:
    lines = _launch("ddp_python_reducer", 2)
    assert_parity(lines)  # against DDP's C++ reducer, eagerly
    for line in lines:  # the backward (with the gradient all-reduces) is one traced graph
        assert any(n.startswith("CompiledAutograd") for n in line["graph_names"]), line


def test_ddp_python_reducer_collectives_are_compiled() -> None:
    lines = _launch("ddp_python_reducer", 2)
    assert_no_collective_fallback(lines)
    assert_collectives_in_graphs(lines, "CompiledAutograd", {"all_reduce"})


# --- c. FSDP2 (fully_shard): its hooks stay outside the graphs, parity is the bar -------------


def test_fsdp2_compiled_blocks_matches_eager() -> None:
    assert_parity(_launch("fsdp2_blocks", 2))


def test_fsdp2_whole_step_compiled_autograd_matches_torchs_own_compile() -> None:
    """torch 2.13 gets this setting wrong with any backend: under compiled autograd FSDP2's
    root post-backward callback (queued with Variable._execution_engine.queue_callback) never
    runs, parameters stay unsharded and losses leave eager's from step 2. The bar is torch's
    own compile (``aot_eager``) of the same step; the second check fails once torch fixes it,
    and this test should then compare with eager again."""
    lines = _launch("fsdp2_compiled_autograd", 2)
    assert_parity(lines)  # "eager" is the aot_eager reference in this setting
    for line in lines:
        assert line["plain_eager"] != pytest.approx(line["eager"], rel=1e-3), line


# --- d. SimpleFSDP: all-gather in the forward graph, reduce-scatter in the backward -----------


def test_simple_fsdp_matches_eager() -> None:
    assert_parity(_launch("simple_fsdp_mlp", 2))


def test_simple_fsdp_collectives_are_compiled() -> None:
    lines = _launch("simple_fsdp_mlp", 2)
    assert_no_collective_fallback(lines)
    assert_collectives_in_graphs(lines, "forward", {"all_gather_into_tensor"})
    assert_collectives_in_graphs(lines, "backward", {"reduce_scatter_tensor"})


def test_simple_fsdp_uneven_shards_matches_eager() -> None:
    # Graphs that differ between ranks (pads where a shard is short) must still issue the same
    # collectives in the same order on every rank.
    assert_parity(_launch("simple_fsdp_uneven", 2))


# --- e. tensor parallel (DTensor) on a Llama-style model --------------------------------------


def test_tp_matches_eager() -> None:
    lines = _launch("tensor_parallel", 2)
    assert_parity(lines)
    _same_across(lines, [0, 1])  # one batch stream: every TP rank computes the same loss


def test_tp_collectives_are_compiled() -> None:
    lines = _launch("tensor_parallel", 2)
    assert_no_collective_fallback(lines)
    # Sequence parallel: activations are all-gathered into the TP region and reduce-scattered
    # out of it, in both directions. (The norm weights' gradients stay Partial: DTensor
    # all-reduces them when the optimizer reads them, outside the graphs.)
    for kind in ("forward", "backward"):
        assert_collectives_in_graphs(
            lines, kind, {"all_gather_into_tensor", "reduce_scatter_tensor"}
        )


# --- f. 2 x 2 mesh: SimpleFSDP on "dp" x TP on "tp" -------------------------------------------


def test_tp_simple_fsdp_2d_matches_eager() -> None:
    lines = _launch("tp_simple_fsdp_2d", 4)
    assert_parity(lines)
    _same_across(lines, [0, 1])  # mesh [[0, 1], [2, 3]]: ranks 0 and 1 form dp group 0
    _same_across(lines, [2, 3])
    assert lines[0]["eager"] != lines[2]["eager"]  # the dp groups saw different batches


def test_tp_simple_fsdp_2d_collectives_are_compiled() -> None:
    lines = _launch("tp_simple_fsdp_2d", 4)
    assert_no_collective_fallback(lines)
    assert_collectives_in_graphs(
        lines, "forward", {"all_gather_into_tensor", "reduce_scatter_tensor"}
    )
    # + the all-reduce (over tp) of the norm weights' gradients, made in simple_fsdp's backward
    ops = {"all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce"}
    assert_collectives_in_graphs(lines, "backward", ops)


# --- g. Hugging Face Trainer under torchrun ---------------------------------------------------


@pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None,
    reason="transformers is not installed (pip install -e '.[hf]')",
)
def test_hf_trainer_torch_compile_neuron_matches_eager() -> None:
    lines = _launch("hf_trainer", 2, launcher="torchrun")
    assert_parity(lines)
    _same_across(lines, [0, 1])  # Trainer logs the loss averaged over ranks


# --- the example users copy -------------------------------------------------------------------


def test_train_tp_fsdp_example_runs_under_torchrun() -> None:
    # The documented command (torchrun --nproc-per-node 4 examples/train_tp_fsdp.py); the
    # example itself asserts compiled == eager on every rank, so rc 0 is the parity check.
    ((stdout, _),) = launch(EXAMPLES / "train_tp_fsdp.py", ["--steps", "2"], 4, launcher="torchrun")
    losses = re.findall(r"losses +(eager|compiled) +\[(.*)\]", stdout)
    assert [kind for kind, _ in losses] == ["eager", "compiled"], stdout
    assert all(len(values.split(",")) == 2 for _, values in losses), stdout
    graphs = re.search(r"(\d+) graphs compiled for cpu", stdout)
    assert graphs and int(graphs.group(1)) > 0, stdout
