"""``neuron-compile buckets plan``, run as a real process."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

from neuron_compile.bucket_planner import plan_buckets

LENGTHS = [3, 5, 5, 9, 17, 100, 120, 130, 400, 401, 64, 64, 64]


def _cli(*args: str, stdin: str | None = None, env: dict | None = None):
    return subprocess.run(
        [sys.executable, "-m", "neuron_compile", *args],
        capture_output=True,
        text=True,
        timeout=120,
        input=stdin,
        env={**os.environ, **(env or {})},
    )


def _lengths_file(tmp_path):
    path = tmp_path / "lengths.txt"
    path.write_text("# token counts\n" + "\n".join(map(str, LENGTHS)) + "\n")
    return str(path)


def test_plan_prints_table_and_comparison(tmp_path):
    proc = _cli("buckets", "plan", _lengths_file(tmp_path), "--max-buckets", "4")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "13 sequences, 10 distinct lengths, longest 401" in out
    assert "bucket    count  max len  padded tokens  waste %" in out
    plan = plan_buckets(LENGTHS, 4)
    rows = [
        line.split()
        for line in out.splitlines()
        if line.split()[:1] in [[str(b)] for b in plan.boundaries]
    ]
    assert [int(r[0]) for r in rows] == plan.boundaries
    assert [int(r[1]) for r in rows] == [b.count for b in plan.buckets]
    total = next(line.split() for line in out.splitlines() if line.strip().startswith("total"))
    assert total == ["total", "13", f"{plan.padded_tokens:,}", f"{100 * plan.waste:.2f}"]
    assert f"boundaries {plan.boundaries}" in out
    assert "powers of two" in out and "multiples of 128" in out


def test_plan_json_with_alignment_and_attention_cost(tmp_path):
    proc = _cli(
        "buckets",
        "plan",
        _lengths_file(tmp_path),
        "--max-buckets",
        "3",
        "--align",
        "32",
        "--cost",
        "attention",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    planner = result["planner"]
    assert planner["boundaries"] == plan_buckets(LENGTHS, 3, align=32, cost="attention").boundaries
    assert all(b % 32 == 0 for b in planner["boundaries"]) and len(planner["boundaries"]) <= 3
    assert planner["cost"] <= result["powers of two"]["cost"]
    assert set(result) == {"planner", "powers of two", "multiples of 32"}


def test_plan_reads_stdin():
    proc = _cli("--json", "buckets", "plan", "-", "--max-buckets", "1", stdin="7 8\n9\n")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["planner"]["boundaries"] == [9]


def test_plot_writes_a_png_or_explains_the_missing_extra(tmp_path):
    png = tmp_path / "waste.png"
    proc = _cli(
        "buckets", "plan", _lengths_file(tmp_path), "--max-buckets", "4", "--plot", str(png)
    )
    if importlib.util.find_spec("matplotlib") is not None:
        assert proc.returncode == 0, proc.stderr
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"wrote {png}" in proc.stdout
    else:
        assert proc.returncode == 2 and "neuron-compile[plot]" in proc.stderr


def test_plot_without_matplotlib_exits_2_with_a_clear_message(tmp_path):
    blocker = tmp_path / "block" / "matplotlib"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('matplotlib hidden for this test')\n")
    env = {"PYTHONPATH": f"{blocker.parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    png = tmp_path / "waste.png"
    proc = _cli("buckets", "plan", _lengths_file(tmp_path), "--plot", str(png), env=env)
    assert proc.returncode == 2
    assert (
        "--plot needs matplotlib" in proc.stderr
        and "pip install 'neuron-compile[plot]'" in proc.stderr
    )
    assert not png.exists() and proc.stdout == ""


def test_bad_inputs_exit_2(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("12 twelve\n")
    assert _cli("buckets", "plan", str(bad)).returncode == 2
    assert _cli("buckets", "plan", str(tmp_path / "missing.txt")).returncode == 2
    assert _cli("buckets", "plan", _lengths_file(tmp_path), "--max-buckets", "0").returncode == 2
    zero = tmp_path / "zero.txt"
    zero.write_text("0 4\n")
    proc = _cli("buckets", "plan", str(zero))
    assert proc.returncode == 2 and "positive" in proc.stderr
