"""Issue 20: with ``target="trn2"``, what neuronx-cc would receive holds every collective.

The settings of ``settings_worker.py`` run on real gloo ranks compiled for trn2 with dumps on;
each rank's dumped modules (``<dump_dir>/rank<k>/<graph>/module.stablehlo.mlir``) are read back:

- every collective of every graph AOTAutograd handed over is in that graph's module (none split
  out, none run eagerly);
- its replica groups are the partition the mesh implies, computed here from the mesh shape;
- every rank's module of a graph has the same collectives over the same groups (the module texts
  may differ: a vocabulary-parallel embedding subtracts each rank's own offset).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch.distributed as dist

from tests.distributed.launch import run_ranks

WORKER = Path(__file__).with_name("settings_worker.py")
_COLLECTIVE = re.compile(
    r'"stablehlo\.(all_reduce|all_gather|reduce_scatter|all_to_all)"'
    r".*?replica_groups = dense<(.*?)> : tensor<(\d+)x(\d+)xi64>"
)

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(), reason="torch built without gloo"
)


def collectives_in_module(text: str) -> list[tuple[str, list[list[int]]]]:
    """``(op, replica groups)`` of each collective in a dumped module, in order."""
    found = []
    for op, groups, rows, cols in _COLLECTIVE.findall(text):
        parsed = json.loads(groups) if groups.startswith("[") else [[int(groups)]]
        assert [len(parsed), len(parsed[0])] == [int(rows), int(cols)]
        found.append((op, parsed))
    return found


def mesh_groups(dp: int, tp: int) -> dict[str, list[list[int]]]:
    """The groups of a row-major ``(dp, tp)`` mesh: along tp (rows) and along dp (columns)."""
    rows = [[d * tp + t for t in range(tp)] for d in range(dp)]
    return {"tp": rows, "dp": [list(col) for col in zip(*rows, strict=True)]}


def _dumped(tmp_path: Path, setting: str, world: int) -> dict[str, list]:
    """``{graph: [(op, groups), ...]}`` of a setting's dumped trn2 modules, checked as above."""
    env = {"NEURON_COMPILE_TARGET": "trn2", "NEURON_COMPILE_DUMP_DIR": str(tmp_path)}
    lines = run_ranks(WORKER, [setting], world, env=env)
    modules = {
        (int(path.parts[-3].removeprefix("rank")), path.parent.name): path.read_text()
        for path in tmp_path.glob("rank*/*/module.stablehlo.mlir")
    }
    for line in lines:
        assert line["fallback_ops"] == [], line  # no collective (or anything) ran eagerly
        for graph, fx_counts in line["collectives_in_graphs"].items():
            found = collectives_in_module(modules[(line["rank"], graph)])
            assert sum(fx_counts.values()) == len(found), (graph, fx_counts, found)
    by_graph: dict[str, set[str]] = {}
    for (_, graph), text in modules.items():
        by_graph.setdefault(graph, set()).add(json.dumps(collectives_in_module(text)))
    assert all(len(found) == 1 for found in by_graph.values()), by_graph  # the same on all ranks
    return {graph: json.loads(found.pop()) for graph, found in by_graph.items()}


def test_python_reducer_backward_holds_every_gradient_all_reduce(tmp_path: Path) -> None:
    found = [c for graph in _dumped(tmp_path, "ddp_python_reducer", 2).values() for c in graph]
    # the MLP's 10 parameters (4 blocks + head, weight and bias), each reduced once
    assert [op for op, _ in found] == ["all_reduce"] * 10
    assert all(groups == [[0, 1]] for _, groups in found)


def test_tensor_parallel_modules_run_over_the_tp_group(tmp_path: Path) -> None:
    found = [c for graph in _dumped(tmp_path, "tensor_parallel", 2).values() for c in graph]
    assert found and all(groups == mesh_groups(1, 2)["tp"] for _, groups in found)


def test_simple_fsdp_x_tp_on_a_2x2_mesh_uses_both_dimensions(tmp_path: Path) -> None:
    expected = mesh_groups(2, 2)
    found = [c for graph in _dumped(tmp_path, "tp_simple_fsdp_2d", 4).values() for c in graph]
    used = {json.dumps(groups) for _, groups in found}
    assert used == {json.dumps(expected["dp"]), json.dumps(expected["tp"])}, used
    # FSDP's gathers run over dp, its reduce-scatters too; TP's over tp
    assert {op for op, groups in found if groups == expected["dp"]} >= {
        "all_gather",
        "reduce_scatter",
    }
