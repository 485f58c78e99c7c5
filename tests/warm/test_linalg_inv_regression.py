"""Regression (issue 15): a user's script with ``torch.linalg.inv``, run twice with the same
cache directories, crashed the second time (IndexError in ``CompiledGraph._call_general``).

``inv`` traces with ``aten._linalg_check_errors``, an effectful op AOTAutograd threads through an
effect token. A warm start through AOTAutogradCache called the graphs without the token they
were compiled with. The script below is the user's, unchanged; it runs as ``__main__`` in two
real processes, cold then warm, seeded alike so that their printed results compare exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

USER_SCRIPT = """\
import torch
def f(x):
    return torch.linalg.inv(x)
x = torch.randn(5, 5) + 3 * torch.eye(5)
cf = torch.compile(f, backend="neuron", dynamic=False)
print("inference", (cf(x) - f(x)).abs().max().item())
xg = x.clone().requires_grad_()
cf(xg).sum().backward()
print("train ok")
"""

# Runs the script as __main__, then reports the AOTAutogradCache counters on a last line, so
# the test can tell a warm start from a second cold one.
_RUNNER = """
import json, runpy, sys, torch
torch.manual_seed(0)
runpy.run_path(sys.argv[1], run_name="__main__")
from torch._dynamo.utils import counters
aot = counters["aot_autograd"]
print(json.dumps({k: aot["autograd_cache_" + k] for k in ("hit", "miss", "saved", "bypass")}))
"""


def _run(script: Path, cache: Path) -> tuple[list[str], dict[str, int]]:
    env = {
        **os.environ,
        "NEURON_COMPILE_CACHE_DIR": str(cache / "neuron"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "torch"),
        "PYTHONPATH": str(ROOT),
    }
    proc = subprocess.run(
        [sys.executable, "-c", _RUNNER, str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    *printed, counts = proc.stdout.strip().splitlines()
    return printed, json.loads(counts)


def test_linalg_inv_script_runs_cold_then_warm(tmp_path):
    script = tmp_path / "user_script.py"
    script.write_text(USER_SCRIPT)
    cold, cold_aot = _run(script, tmp_path / "cache")
    assert cold[-1] == "train ok", cold
    # Two frames (inference, then a recompile for grad mode), both stored.
    assert cold_aot["saved"] == 2 and cold_aot["hit"] == 0, cold_aot

    warm, warm_aot = _run(script, tmp_path / "cache")
    assert warm == cold  # "train ok", and the same error against eager, to the last digit
    assert float(warm[0].split()[1]) < 1e-5, warm
    assert warm_aot["hit"] == 2 and warm_aot["miss"] == 0, warm_aot
