"""``neuron-compile check`` and the pytest plugin report frames that never reached the backend
(NC603, ``eager-frame``, gated by default), and ``check`` tells compiled graphs from graphs
loaded from the cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from neuron_compile.report import Report, formats
from neuron_compile.report.gate import DEFAULT_FAIL_ON, exit_code
from neuron_compile.report.model import Finding, GraphEntry
from tests.report.test_pytest_plugin import run_plugin_session

GRU_SCRIPT = """\
import torch, torch.nn as nn
{flag}
class TextClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(100, 16)
        self.rnn = nn.GRU(16, 32, num_layers=2, batch_first=True)
        self.head = nn.Linear(32, 4)

    def forward(self, tokens):
        out, h = self.rnn(self.emb(tokens))
        return self.head(out[:, -1])


model = torch.compile(TextClassifier(), backend="neuron")
print(model(torch.randint(0, 100, (4, 12))).shape)
"""

MLP_SCRIPT = """\
import torch, torch.nn as nn
net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
print(torch.compile(net, backend="neuron")(torch.randn(2, 8)).shape)
"""


def _env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "NEURON_COMPILE_CACHE_DIR": str(tmp_path / "cache"),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
    }


def _check(tmp_path: Path, script: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "neuron_compile", "check", str(script), *extra],
        cwd=tmp_path,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=600,
    )


def _line(script: str, text: str) -> int:
    return next(i for i, ln in enumerate(script.splitlines(), 1) if text in ln)


def test_check_fails_by_default_on_a_gru_model_naming_the_frame_line_and_fix(tmp_path):
    source = GRU_SCRIPT.format(flag="")
    script = tmp_path / "gru_model.py"
    script.write_text(source)
    proc = _check(tmp_path, script, "--json", str(tmp_path / "report.json"))
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    (line,) = [ln for ln in out.splitlines() if "NC603" in ln]
    rnn_line = _line(source, "self.rnn(self.emb(tokens))")
    def_line = _line(source, "def forward")
    # where Dynamo gave up, and the frame by name and its first line
    assert f"gru_model.py:{rnn_line}" in line, line
    assert f"TextClassifier.forward ({script}:{def_line})" in line, line
    assert "allow_rnn" in line and "RNN, GRU, or LSTM" in line
    assert "FAIL: 1 finding(s) in --fail-on categories: eager-frame" in out
    assert "0 graphs: 0 compiled, 0 loaded from the cache" in out
    doc = json.loads((tmp_path / "report.json").read_text())
    (finding,) = [f for f in doc["findings"] if f["category"] == "eager-frame"]
    assert finding["code"] == "NC603" and finding["details"]["function"] == "TextClassifier.forward"
    assert finding["details"]["fix"] == "set torch._dynamo.config.allow_rnn = True before compiling"
    assert doc["counts"]["eager-frame"] == 1 and doc["graph_sources"]["compiled"] == 0
    # the explicit opt-out still works
    assert _check(tmp_path, script, "--fail-on", "compile-error").returncode == 0


def test_check_passes_a_gru_model_with_allow_rnn(tmp_path):
    script = tmp_path / "gru_allowed.py"
    script.write_text(GRU_SCRIPT.format(flag="torch._dynamo.config.allow_rnn = True"))
    proc = _check(tmp_path, script)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "NC603" not in proc.stdout and "eager-frame=0" in proc.stdout
    assert "1 graph: 1 compiled, 0 loaded from the cache, 0 failed" in proc.stdout


def test_an_ordinary_graph_break_is_nc601_only(tmp_path):
    script = tmp_path / "breaks.py"
    script.write_text(
        "import torch\n"
        "def f(x):\n"
        "    y = x + 1\n"
        "    print('break')\n"
        "    return y * 2\n"
        "torch.compile(f, backend='neuron')(torch.ones(3))\n"
    )
    proc = _check(tmp_path, script)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "NC601" in proc.stdout and "NC603" not in proc.stdout
    assert "2 graphs: 2 compiled" in proc.stdout


def test_second_check_reports_the_graphs_as_loaded_from_the_cache(tmp_path):
    script = tmp_path / "mlp.py"
    script.write_text(MLP_SCRIPT)
    first = _check(tmp_path, script, "--json", str(tmp_path / "first.json"))
    second = _check(tmp_path, script, "--json", str(tmp_path / "second.json"))
    assert first.returncode == 0 and second.returncode == 0, first.stdout + second.stdout
    assert "1 graph: 1 compiled, 0 loaded from the cache, 0 failed" in first.stdout
    assert "1 graph: 0 compiled, 1 loaded from the cache, 0 failed" in second.stdout
    sources = json.loads((tmp_path / "second.json").read_text())["graph_sources"]
    assert sources == {"compiled": 0, "cached": 1, "failed": 0}


def test_graph_sources_count_cache_tiers_and_failures():
    graphs = [
        GraphEntry("a_forward_0", "forward", cache={"source": "compiled"}),
        GraphEntry("b_forward_0", "forward", cache={"source": "disk"}),
        GraphEntry("c_forward_0", "forward", cache={"source": "memory"}),
        GraphEntry("d_forward_0", "forward", cache={"source": "off"}),
        GraphEntry("e_forward_0", "forward", status="failed"),
    ]
    report = Report("t", "compile", graphs=graphs)
    assert report.graph_sources() == {"compiled": 2, "cached": 2, "failed": 1}
    head = formats.render_terminal(report).splitlines()[0]
    assert "5 graphs: 2 compiled, 2 loaded from the cache, 1 failed" in head
    assert "2 loaded from the cache" in formats.render_markdown(report)


def test_eager_frame_is_gated_by_default_and_has_a_sarif_rule():
    assert "eager-frame" in DEFAULT_FAIL_ON and "graph-break" not in DEFAULT_FAIL_ON
    finding = Finding("eager-frame", "NC603", "f (m.py:3) never reached the backend")
    report = Report("t", "compile", findings=[finding])
    assert exit_code(report, DEFAULT_FAIL_ON)[0] == 1
    sarif = json.loads(formats.render_sarif(report, DEFAULT_FAIL_ON))
    (rule,) = sarif["runs"][0]["tool"]["driver"]["rules"]
    assert rule["id"] == "NC603" and rule["name"] == "EagerFrame"
    assert sarif["runs"][0]["results"][0]["level"] == "error"


PLUGIN_TESTS = (
    GRU_SCRIPT.format(flag="")
    .replace(
        "model = torch.compile",
        "def test_gru():\n    model = torch.compile",
    )
    .replace("print(model(", "    print(model(")
)


def test_pytest_plugin_reports_nc603_for_a_gru_model(tmp_path):
    (tmp_path / "test_gru_sample.py").write_text(PLUGIN_TESTS)
    out = tmp_path / "out"
    proc = run_plugin_session(tmp_path, "test_gru_sample.py", f"--neuron-report={out}")
    # without --neuron-fail-on the report marks the finding but never fails the session
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "NC603" in proc.stdout and "allow_rnn" in proc.stdout
    report = json.loads((out / "report.json").read_text())
    (finding,) = [f for f in report["findings"] if f["category"] == "eager-frame"]
    assert finding["code"] == "NC603"
    assert finding["location"]["file"].endswith("test_gru_sample.py")
    assert finding["details"]["function"] == "TextClassifier.forward"
    gated = run_plugin_session(
        tmp_path, "test_gru_sample.py", f"--neuron-report={out}", "--neuron-fail-on=eager-frame"
    )
    assert gated.returncode == 1, gated.stdout + gated.stderr
