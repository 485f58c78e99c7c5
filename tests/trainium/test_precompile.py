"""``neuron-compile precompile`` against the neuronx-cc double: graph collection, parallel
compile with a progress bar, JSON/terminal report, 100 % cache hits on a second run, retrying
failed graphs alone, and a cache-only (``NEURON_COMPILE_CACHE_ONLY=1``) run with zero compiles."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from neuron_compile.trainium import precompile

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    step = torch.compile(model, backend="neuron", dynamic=False)
    for batch in (4, 4, 8):  # two shapes: forward + backward each
        step(torch.randn(batch, 8)).square().mean().backward()
    print("script done")
    """
)


def _precompile(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "neuron_compile", "precompile", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        timeout=600,
    )


def test_pool_is_bounded_by_cores_and_ram(monkeypatch):
    monkeypatch.setattr(precompile, "host_ram_bytes", lambda: 16 * 2**30)
    cores = len(os.sched_getaffinity(0))
    assert precompile.pool_size(None, 100, 8 * 2**30) == min(cores, 2)
    assert precompile.pool_size(None, 100, 64 * 2**30) == 1  # RAM for one compile only
    assert precompile.pool_size(None, 1, 1) == 1  # never more workers than compiles
    assert precompile.pool_size(3, 100, 64 * 2**30) == 3  # --jobs wins


def test_collect_compile_report_rerun_and_retry(double, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    work = tmp_path / "collect"
    run = _precompile(str(script), "--target", "trn2", "--dir", str(work), "--jobs", "2", "--json")
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)  # --json: the report alone; the script printed to stderr
    assert "script done" in run.stderr
    rows = report["graphs"]
    kinds = sorted(r["graph_name"].split("_")[2] for r in rows)
    assert kinds == ["backward", "backward", "forward", "forward"]  # per shape
    assert {r["status"] for r in rows} == {"compiled"} and all(r["neff_bytes"] > 0 for r in rows)
    assert report["workers"] == 2 and "4/4" in run.stderr  # progress bar on stderr
    assert len(double.calls()) == 4 and (work / "report.json").exists()

    again = _precompile(str(script), "--target", "trn2", "--dir", str(work))
    assert again.returncode == 0, again.stderr
    assert "4 cached; cache hit rate 100 %" in again.stdout and len(double.calls()) == 4

    # Retry alone, from the collected jobs (no script run), against an empty cache: fails
    # (NCC code + triage in the report), then NC402 from the negative entry, then compiles.
    fresh = {"NEURON_COMPILE_CACHE_DIR": str(tmp_path / "other-cache")}
    name = rows[0]["graph_name"]
    only = ["--from", str(work), "--only", name, "--json"]
    double.mode("fail", code="NCC_EOOM001")
    failed = _precompile(*only, env=fresh)
    assert failed.returncode == 1
    (row,) = json.loads(failed.stdout)["graphs"]
    assert (row["status"], row["error_code"], row["ncc_code"], row["triage"]) == (
        "failed",
        "NC522",
        "NCC_EOOM001",
        "capacity",
    )
    double.mode("ok")
    (row,) = json.loads(_precompile(*only, env=fresh).stdout)["graphs"]
    assert (row["status"], row["error_code"]) == ("cached-failure", "NC402")
    retry = _precompile(*only, "--retry-failed", env=fresh)
    assert retry.returncode == 0, retry.stdout + retry.stderr
    (row,) = json.loads(retry.stdout)["graphs"]
    assert (row["graph_name"], row["status"]) == (name, "compiled")
    assert len(double.calls()) == 6


def test_a_script_whose_graphs_never_reach_the_backend_is_not_a_full_cache_hit(double, tmp_path):
    """`torch.compile(model)` without backend="neuron" ran under Inductor: 0 graphs collected,
    reported as "cache hit rate 100 %", exit 0."""
    script = tmp_path / "inductor.py"
    script.write_text("print('ran')\n")  # compiles nothing with neuron
    run = _precompile(str(script), "--target", "trn2", "--dir", str(tmp_path / "w"), "--json")
    assert run.returncode == 1 and "no graph reached the neuron backend" in run.stderr
    report = json.loads(run.stdout)
    assert report["summary"]["graphs"] == 0 and report["summary"]["cache_hit_rate"] is None


@pytest.mark.slow
def test_train_gpt_bucketed_precompile_then_cache_only(double, tmp_path):
    """Precompile, then a cache-only run, end to end on examples/train_gpt_bucketed.py (smaller
    run: 32 samples)."""
    args = ["examples/train_gpt_bucketed.py", "--target", "trn2", "--dir", str(tmp_path)]
    args += ["--args", "--samples 32 --buckets 2"]
    first = _precompile(*args)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    used = first.stdout.split("batches per bucket: ")[1].split(";")[0]
    n_buckets = used.count(":")
    report = json.loads((tmp_path / "report.json").read_text())
    names = [r["graph_name"] for r in report["graphs"]]
    assert len(names) == 2 * n_buckets  # forward and backward per bucket
    assert sum("_forward_" in n for n in names) == n_buckets
    assert report["summary"]["counts"] == {"compiled": 2 * n_buckets}
    assert "[##############################]" in first.stderr

    second = _precompile(*args)
    assert second.returncode == 0
    assert json.loads((tmp_path / "report.json").read_text())["summary"]["cache_hit_rate"] == 1.0

    check = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                """
                import runpy, sys
                import neuron_compile
                from neuron_compile.cache.tiers import cache_stats
                sys.path.insert(0, "examples")
                runpy.run_path("examples/train_gpt_bucketed.py")["main"](
                    ["--samples", "32", "--buckets", "2"])
                stats = cache_stats()
                print("COMPILES", stats["compiles"], stats["disk_misses"],
                      sorted({r.cache_source for r in neuron_compile.metrics()}))
                """
            ),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        # The same target as the precompile: the cpu target traces SDPA as eager's CPU kernel
        # (its graphs are not trn2's).
        env={**os.environ, "NEURON_COMPILE_CACHE_ONLY": "1", "NEURON_COMPILE_TARGET": "trn2"},
        timeout=600,
    )
    assert check.returncode == 0, check.stderr[-3000:]
    assert "COMPILES 0 0 ['disk']" in check.stdout
