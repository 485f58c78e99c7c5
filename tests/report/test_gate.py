"""--fail-on gating, --baseline regressions and the documented exit codes of `check`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from neuron_compile.cli import main
from neuron_compile.report import gate
from neuron_compile.report.model import Finding, Location, Report

ROOT = Path(__file__).resolve().parents[2]


def _report(*findings: Finding) -> Report:
    return Report(target="t", mode="compile", findings=list(findings))


def _break(line: int, count: int = 1) -> Finding:
    return Finding(
        "graph-break",
        "NC601",
        "graph break",
        location=Location(str(ROOT / "model.py"), line),
        count=count,
        details={"reason_class": "Data-dependent branching"},
    )


def test_parse_fail_on():
    assert gate.parse_fail_on(None) == ("compile-error", "eager-frame", "mismatch")
    assert gate.parse_fail_on("fallback, graph-break") == ("graph-break", "fallback")
    assert gate.parse_fail_on("none") == ()
    assert len(gate.parse_fail_on("all")) == 7
    with pytest.raises(ValueError, match="unknown --fail-on category nope"):
        gate.parse_fail_on("fallback,nope")


def test_exit_codes_without_baseline():
    clean, broken = _report(), _report(_break(3))
    assert gate.exit_code(clean, ["graph-break"])[0] == gate.EXIT_OK
    assert gate.exit_code(broken, ["compile-error"])[0] == gate.EXIT_OK
    code, line = gate.exit_code(broken, ["graph-break"])
    assert code == gate.EXIT_FINDINGS and "1 finding(s)" in line and "graph-break" in line
    crashed = _report()
    crashed.crash = "ValueError: boom"
    assert gate.exit_code(crashed, ["graph-break"])[0] == gate.EXIT_CRASH


def test_baseline_ignores_moved_lines_and_reports_regressions_in_one_line(monkeypatch):
    monkeypatch.chdir(ROOT)
    base = _report(_break(10))
    assert gate.exit_code(_report(_break(12)), ["graph-break"], base) == (
        gate.EXIT_OK,
        "baseline: no change",
    )
    code, line = gate.exit_code(_report(_break(12, count=3)), ["graph-break"], base)
    assert code == gate.EXIT_FINDINGS
    assert line == "baseline: +2 graph-break (model.py: Data-dependent branching)"
    code, line = gate.exit_code(_report(), ["graph-break"], base)
    assert (code, line) == (
        gate.EXIT_OK,
        "baseline: -1 graph-break (model.py: Data-dependent branching)",
    )


def test_check_cli_baseline_end_to_end(tmp_path, monkeypatch, capsys):
    """Clean model -> baseline; unchanged model -> 0; added graph break -> 1 with a one-line
    diff (that last run in a fresh `python -m neuron_compile check` process)."""
    monkeypatch.chdir(ROOT)
    base_dir = tmp_path / "base"
    assert main(["check", "tests.report.samples:run_clean", "--out", str(base_dir)]) == 0
    baseline = base_dir / "report.json"
    doc = json.loads(baseline.read_text())
    assert doc["counts"]["graph-break"] == 0 and len(doc["graphs"]) == 1
    torch._dynamo.reset()
    args = ["check", "tests.report.samples:run_clean", "--baseline", str(baseline)]
    assert main([*args, "--fail-on", "all"]) == 0
    assert capsys.readouterr().out.strip().endswith("baseline: no change")

    env = {**os.environ, "NEURON_COMPILE_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("GITHUB_STEP_SUMMARY", None)
    proc = subprocess.run(
        [sys.executable, "-m", "neuron_compile", "check", "tests.report.samples:run_with_break"]
        + ["--baseline", str(baseline), "--fail-on", "all", "--sarif", str(tmp_path / "r.sarif")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last == (
        "baseline: +1 graph-break (tests/report/samples.py: Failed to trace builtin operator)"
    )
    assert (tmp_path / "r.sarif").exists()


def test_check_cli_usage_errors_and_crashes(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    assert main(["check", "--print-schema"]) == 0
    assert json.loads(capsys.readouterr().out)["title"] == "neuron-compile check report"
    assert main(["check", "no_such_module_xyz:fn"]) == gate.EXIT_USAGE
    assert main(["check", "missing_script.py"]) == gate.EXIT_USAGE
    assert main(["check", "tests.report.samples:run_clean", "--fail-on", "bogus"]) == 2
    assert "unknown --fail-on category bogus" in capsys.readouterr().err
    md = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(md))
    assert main(["check", "tests.report.samples:run_crashing", "--quiet"]) == gate.EXIT_CRASH
    assert "FAIL: the target crashed (ValueError: a bug in the user's script)" in (
        capsys.readouterr().out
    )
    assert "**The target crashed**" in md.read_text()
    assert torch.compiler.get_default_backend() == "inductor"  # restored after the check


def test_report_paths_that_cannot_be_written_are_usage_errors(tmp_path, monkeypatch, capsys):
    """A directory as --json, an uncreatable --out or an unwritable GITHUB_STEP_SUMMARY ended in a
    Python traceback with exit 1, the code of "findings". Paths are checked before the target
    runs; a summary that fails at the end still prints the verdict, then exits 2."""
    monkeypatch.chdir(ROOT)
    blocker = tmp_path / "file"
    blocker.write_text("")
    for bad in (["--json", str(tmp_path)], ["--out", str(blocker / "reports")]):
        assert main(["check", "tests.report.samples:run_clean", *bad]) == gate.EXIT_USAGE
        err = capsys.readouterr().err
        assert "neuron-compile check:" in err and "Traceback" not in err
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(blocker / "summary.md"))
    assert main(["check", "tests.report.samples:run_clean", "--quiet"]) == gate.EXIT_USAGE
    out, err = capsys.readouterr()
    assert "OK: no finding" in out and "cannot append to GITHUB_STEP_SUMMARY" in err


def test_arguments_after_double_dash_reach_the_script_wherever_options_are(tmp_path):
    from neuron_compile.cli import main

    script = tmp_path / "argv_script.py"
    seen = tmp_path / "argv.txt"
    script.write_text(f"import sys\nopen({str(seen)!r}, 'w').write(' '.join(sys.argv[1:]))\n")
    assert main(["check", str(script), "--quiet", "--", "--steps", "3"]) == 0
    assert seen.read_text() == "--steps 3"
    assert main(["check", "--quiet", str(script), "--", "x"]) == 0
    assert seen.read_text() == "x"
