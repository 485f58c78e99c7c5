"""`pytest --neuron-report=DIR` (entry point pytest11) writes the report at session end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

TESTS = """
import torch

def test_compiles():
    f = torch.compile(lambda x: torch.relu(x) * 2, backend="neuron")
    assert f(torch.ones(3)).sum() == 6

def test_breaks():
    def g(x):
        y = x + 1
        print("break here")
        return y * 2
    torch.compile(g, backend="neuron")(torch.ones(3))
"""


def run_plugin_session(
    tmp_path: Path, test_file: str, *options: str
) -> subprocess.CompletedProcess:
    """``pytest test_file *options`` in a fresh process in ``tmp_path``, with the plugin (its entry
    point, or ``-p`` when the package is not installed) and a cache of its own."""
    plugins = entry_points(group="pytest11")
    registered = any(ep.value == "neuron_compile.pytest_plugin" for ep in plugins)
    args = [] if registered else ["-p", "neuron_compile.pytest_plugin"]
    env = {
        **os.environ,
        "NEURON_COMPILE_CACHE_DIR": str(tmp_path / "cache"),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
    }
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, test_file]
        + list(options),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_plugin_writes_every_format_and_gates(tmp_path):
    (tmp_path / "test_sample.py").write_text(TESTS)
    out = tmp_path / "out"
    proc = run_plugin_session(
        tmp_path, "test_sample.py", f"--neuron-report={out}", "--neuron-fail-on=graph-break"
    )
    # both tests pass, but the gate fails the session on the graph break
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "2 passed" in proc.stdout and "neuron-compile report" in proc.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["counts"]["graph-break"] == 1
    (gb,) = [f for f in report["findings"] if f["category"] == "graph-break"]
    line = TESTS.splitlines().index('        print("break here")') + 1
    assert gb["location"]["line"] == line and gb["location"]["file"].endswith("test_sample.py")
    assert len(report["graphs"]) == 3  # test_compiles: 1; test_breaks: 2 around the break
    assert {p.name for p in out.iterdir()} >= {"report.junit.xml", "report.md", "report.sarif"}
