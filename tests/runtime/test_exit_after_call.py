"""A process may exit right after a compiled call: nothing of the call may still be running.

With XLA's asynchronous CPU execution, a worker thread released each call's inputs (torch tensors
imported through dlpack, whose release takes the GIL) after the results were ready; a process that
reached interpreter finalization first aborted with "terminate called without an active
exception" (about 1 run in 10 with four processes on two cores). Calls now run synchronously
(``runtime.client.ASYNCHRONOUS_EXECUTION``), so the release happens inside the call.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from neuron_compile.runtime.client import ASYNCHRONOUS_EXECUTION

ROOT = Path(__file__).resolve().parents[2]

_STEP_THEN_EXIT = """
import torch
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
loss = torch.compile(model, backend="neuron")(torch.randn(5, 8)).square().mean()
loss.backward()
print(float(loss))
"""


def test_executions_are_synchronous():
    assert ASYNCHRONOUS_EXECUTION is False


def test_processes_exiting_right_after_a_call_never_abort(tmp_path):
    # Several at once: the abort needed a loaded machine to lose the race.
    procs = []
    for i in range(8):
        env = {
            **os.environ,
            "NEURON_COMPILE_CACHE_DIR": str(tmp_path / f"cache{i}"),
            "PYTHONPATH": str(ROOT),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", _STEP_THEN_EXIT],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    results = [(p.wait(timeout=600), *p.communicate()) for p in procs]
    for rc, out, err in results:
        assert rc == 0, err[-2000:]
        assert float(out.strip().splitlines()[-1]) >= 0.0


_COMPILE_THEN_EXIT = """
import sys, threading
import torch
from neuron_compile.runtime.xla_cpu import XlaCpuExecutable
assert "jax" not in sys.modules
text = '''func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = stablehlo.add %x, %x : tensor<4xf32>
  return %y : tensor<4xf32>
}'''
XlaCpuExecutable(text.encode())
names = [t.name for t in threading.enumerate()]
print("importing" if "neuron-compile-import-jax" in names or "jax" in sys.modules else "idle")
"""


def test_jax_imports_during_the_first_compile_and_a_compile_only_process_exits_cleanly():
    """The first array a call makes imports jax (~0.9 s); it is imported on another thread while
    XLA compiles, and a process that exits right after compiling waits for it, then exits 0."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for _ in range(3):
        proc = subprocess.run(
            [sys.executable, "-c", _COMPILE_THEN_EXIT], env=env, capture_output=True, text=True,
            timeout=300,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.strip() == "importing"
        assert "Fatal" not in proc.stderr and "terminate" not in proc.stderr
