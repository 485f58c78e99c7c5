"""``neuron-compile check`` and ``precompile`` with ``--nproc-per-node N``: the script runs as N
real gloo ranks under torchrun, every rank's graphs are collected, a graph several ranks compile
(one cache key) is one row listing its ranks, and each key is compiled once. Plus the property
that makes that true at run time: N ranks sharing one cache compile each key exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import jsonschema
import pytest
import torch.distributed as dist

from neuron_compile import cli
from neuron_compile.report.schema import REPORT_SCHEMA

ROOT = Path(__file__).resolve().parents[1]
DOUBLES = ROOT / "tests" / "trainium" / "doubles"

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo"
)

#: Every rank compiles the MLP at batch 4 (forward + backward, the same keys on every rank) and,
#: unless ``ONLY_MLP`` is set, a function with a graph break; rank 1 also runs batch 6 (graphs
#: only rank 1 has).
RANK_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    step = torch.compile(model, backend="neuron", dynamic=False)

    def with_break(x):
        y = x + 1
        print("", end="")  # a graph break on every rank
        return y * 2

    dist.barrier()  # every rank compiles at the same time: the shared cache sees contention
    step(torch.randn(4, 8)).square().mean().backward()
    if not os.environ.get("ONLY_MLP"):
        torch.compile(with_break, backend="neuron")(torch.randn(3))
        if rank == 1:
            step(torch.randn(6, 8)).square().mean().backward()
    out = os.environ.get("RANK_RECORDS")
    if out:
        import neuron_compile
        from neuron_compile.cache.tiers import cache_stats

        records = [
            {"name": r.name, "key": r.cache_key, "source": r.cache_source, "rank": r.rank}
            for r in neuron_compile.metrics()
        ]
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump({"records": records, "cache": cache_stats()}, f)
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank} done")
    """
)


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return {
        **os.environ,
        "PYTHONPATH": path,
        "OMP_NUM_THREADS": "1",
        "NEURON_COMPILE_CACHE_DIR": str(tmp_path / "cache"),  # one cache, shared by the ranks
        **extra,
    }


def _double_env(tmp_path: Path) -> dict[str, str]:
    """The neuronx-cc test double on PATH (tests/trainium/conftest.py), logging every call."""
    return {
        "PATH": f"{DOUBLES}{os.pathsep}{os.environ.get('PATH', '')}",
        "NEURONX_CC_DOUBLE_PYTHON": sys.executable,
        "NEURONX_CC_DOUBLE_LOG": str(tmp_path / "double.log"),
        "NEURONX_CC_DOUBLE_MODE": "ok",
    }


def _double_compiles(tmp_path: Path) -> list[list[str]]:
    log = tmp_path / "double.log"
    rows = (
        [json.loads(line)["argv"] for line in log.read_text().splitlines()] if log.exists() else []
    )
    return [r for r in rows if r[:1] == ["compile"]]


def _run(
    command: list[str], env: dict[str, str], timeout: float = 240
) -> subprocess.CompletedProcess:
    """Run in a session of its own so a hung launch (torchrun and its ranks) is killed whole."""
    proc = subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"timed out: {command}\n{err[-4000:]}")
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def _script(tmp_path: Path) -> Path:
    path = tmp_path / "train_ranks.py"
    path.write_text(RANK_SCRIPT)
    return path


def test_nproc_per_node_must_be_positive(capsys):
    assert cli.main(["check", "x.py", "--nproc-per-node", "0"]) == 2
    assert "--nproc-per-node must be >= 1" in capsys.readouterr().err


def test_check_nproc_per_node_reports_each_graph_once_with_its_ranks(tmp_path):
    out = tmp_path / "report.json"
    command = [sys.executable, "-m", "neuron_compile", "check", str(_script(tmp_path))]
    command += ["--nproc-per-node", "2", "--json", str(out), "--fail-on", "graph-break"]
    run = _run(command, _env(tmp_path))
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]  # the graph break gates
    assert "rank 0 done" in run.stdout and "rank 1 done" in run.stdout
    doc = json.loads(out.read_text())
    jsonschema.validate(doc, REPORT_SCHEMA, cls=jsonschema.Draft202012Validator)
    assert doc["world_size"] == 2 and doc["crash"] is None
    graphs = doc["graphs"]
    keys = [g["cache"]["key"] for g in graphs]
    assert all(keys) and len(keys) == len(set(keys))  # one row per cache key
    by_ranks = Counter(tuple(g["ranks"]) for g in graphs)
    # batch 4 forward + backward and the two graphs around the break: on both ranks;
    # batch 6 forward + backward: rank 1 only
    assert by_ranks == {(0, 1): 4, (1,): 2}, graphs
    only_one = sorted(g["kind"] for g in graphs if g["ranks"] == [1])
    assert only_one == ["backward", "forward"]
    (brk,) = [f for f in doc["findings"] if f["category"] == "graph-break"]
    assert brk["ranks"] == [0, 1] and brk["count"] == 1  # one break, seen by both ranks
    recompiles = [f for f in doc["findings"] if f["category"] == "recompile"]
    assert [f["ranks"] for f in recompiles] == [[1]]  # batch 6 recompiles on rank 1 only
    assert "2 ranks" in run.stdout and "[ranks 0-1]" in run.stdout


def test_check_a_rank_that_raises_is_a_crash_named_by_rank(tmp_path):
    # Rank 0 waits in a barrier for rank 1, which raises first. Rank 1's check exits non-zero
    # after writing its report, so torchrun stops rank 0 if gloo has not already failed its
    # barrier (either way rank 0 is accounted for) and the check never waits for gloo's timeout.
    script = tmp_path / "fails_on_rank_1.py"
    script.write_text(
        textwrap.dedent(
            """
            import torch
            import torch.distributed as dist

            dist.init_process_group("gloo")
            torch.compile(lambda x: x * 2, backend="neuron")(torch.randn(3))
            if dist.get_rank() == 1:
                raise RuntimeError("rank 1 gives up")
            dist.barrier()
            """
        )
    )
    out = tmp_path / "report.json"
    command = [sys.executable, "-m", "neuron_compile", "check", str(script)]
    command += ["--nproc-per-node", "2", "--json", str(out)]
    run = _run(command, _env(tmp_path), timeout=120)
    assert run.returncode == 3, run.stdout[-3000:] + run.stderr[-3000:]  # gate.EXIT_CRASH
    doc = json.loads(out.read_text())
    assert "rank 1: RuntimeError: rank 1 gives up" in doc["crash"], doc["crash"]
    # rank 0: its barrier failed ("rank 0: ...") or torchrun stopped it (no report)
    assert "rank 0: " in doc["crash"] or "rank(s) 0 wrote no report" in doc["crash"]
    (graph,) = doc["graphs"]  # x * 2, one cache key
    assert 1 in graph["ranks"]


def test_precompile_nproc_per_node_compiles_each_distinct_graph_once(tmp_path):
    collect = tmp_path / "collect"
    command = [sys.executable, "-m", "neuron_compile", "precompile", str(_script(tmp_path))]
    command += ["--target", "trn2", "--nproc-per-node", "2", "--dir", str(collect), "--jobs", "1"]
    run = _run(command, _env(tmp_path, **_double_env(tmp_path)))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads((collect / "report.json").read_text())
    rows = report["graphs"]
    assert report["world_size"] == 2 and report["summary"]["counts"] == {"compiled": len(rows)}
    assert len({r["key"] for r in rows}) == len(rows)  # each distinct graph once
    assert Counter(tuple(r["ranks"]) for r in rows) == {(0, 1): 4, (1,): 2}, rows
    assert len(_double_compiles(tmp_path)) == len(rows)  # ... and compiled once
    lines = run.stdout.splitlines()
    table = lines[next(i for i, line in enumerate(lines) if line.startswith("graph ")) :]
    assert table[0].split()[-2:] == ["ranks", "error"]  # the table's ranks column
    shown = Counter(line.split()[-1] for line in table[1:-1])
    assert shown == {"0-1": 4, "1": 2}  # each distinct graph once, with its ranks
    assert "graphs for trn2 (distinct over 2 ranks)" in table[-1]


def test_four_ranks_sharing_one_cache_compile_each_key_once(tmp_path):
    """4 ranks, one ``NEURON_COMPILE_CACHE_DIR``, compiling at once for trn2 (neuronx-cc
    double): every graph key's artifact is compiled by exactly one rank (the others read it from
    disk) and neuronx-cc runs once per key."""
    records = tmp_path / "records"
    records.mkdir()
    env = _env(tmp_path, RANK_RECORDS=str(records), NEURON_COMPILE_TARGET="trn2", ONLY_MLP="1")
    env.update(_double_env(tmp_path))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node=4", str(_script(tmp_path))]
    run = _run(command, env, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    ranks = {k: json.loads((records / f"rank{k}.json").read_text()) for k in range(4)}
    assert {r["rank"] for k, doc in ranks.items() for r in doc["records"] if r["rank"] == k} == {
        0,
        1,
        2,
        3,
    }  # every record carries its own rank
    sources: dict[str, list[str]] = {}
    for doc in ranks.values():
        for rec in doc["records"]:
            sources.setdefault(rec["key"], []).append(rec["source"])
    shared = {k: v for k, v in sources.items() if len(v) == 4}
    assert len(shared) == len(sources) == 2  # forward and backward, on every rank
    for key, seen in sources.items():
        assert seen.count("compiled") == 1, (key, seen)  # one rank compiled, the rest read
        assert set(seen) <= {"compiled", "disk"}, (key, seen)
    # the cache's own count of compiles under its key locks: one artifact and one NEFF per key
    assert sum(doc["cache"]["compiles"] for doc in ranks.values()) == 2 * len(sources)
    assert len(_double_compiles(tmp_path)) == len(sources)  # one neuronx-cc run per key


def test_precompile_the_tp_fsdp_example_on_four_ranks(tmp_path):
    """Issue 20's command: ``neuron-compile precompile --nproc-per-node 4
    examples/train_tp_fsdp.py --target trn2`` against the neuronx-cc double. Each distinct graph
    is compiled once; graphs whose modules differ by rank (each rank's own embedding offset)
    are distinct, and the report says which ranks had each."""
    collect = tmp_path / "collect"
    example = ROOT / "examples" / "train_tp_fsdp.py"
    command = [sys.executable, "-m", "neuron_compile", "precompile", str(example)]
    command += ["--target", "trn2", "--nproc-per-node", "4", "--dir", str(collect), "--jobs", "1"]
    command += ["--", "--steps", "1"]
    run = _run(command, _env(tmp_path, **_double_env(tmp_path)), timeout=400)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads((collect / "report.json").read_text())
    rows = report["graphs"]
    assert report["world_size"] == 4 and report["summary"]["counts"] == {"compiled": len(rows)}
    assert len({r["key"] for r in rows}) == len(rows)  # each distinct graph once
    assert sorted({rank for r in rows for rank in r["ranks"]}) == [0, 1, 2, 3]
    assert len(_double_compiles(tmp_path)) == len(rows)  # ... and compiled once
    assert "graphs for trn2 (distinct over 4 ranks)" in run.stdout
