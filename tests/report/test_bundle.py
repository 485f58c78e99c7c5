"""Failure bundles reproduce the failure in a fresh process, without the model."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from neuron_compile.report.collect import _mode_switch

ROOT = Path(__file__).resolve().parents[2]


def test_verifier_bundle_replays_and_minimizes_in_a_fresh_process(sample_run, tmp_path):
    report, _, _ = sample_run
    (finding,) = [f for f in report.findings if f.code == "NC103"]
    bundle = Path(finding.bundle)
    meta = json.loads((bundle / "meta.json").read_text())
    assert meta["stage"] == "verify" and meta["code"] == "NC103"
    assert meta["verifier"]["message"] == (
        "'stablehlo.add' op requires the same shape for all operands and results"
    )
    assert set(meta["versions"]) >= {"torch", "jaxlib", "stablehlo", "neuron_compile"}
    assert meta["options"]["fallback"] == "cpu" and meta["neuronx_cc_command"] is None
    inputs = json.loads((bundle / "inputs.json").read_text())
    assert inputs == [{"name": "arg0_1", "shape": [4], "dtype": "torch.float32"}]  # no values
    assert "bad_verify" in (bundle / "graph.fx.py").read_text()
    # a copy elsewhere, replayed by a fresh process that never imports the model or the
    # test-only lowering
    bundle = Path(shutil.copytree(bundle, tmp_path / "bundle"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, str(bundle / "replay.py"), "--minimize"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "[NC103] reproduced: StableHLO verifier: line" in proc.stdout
    assert "requires the same shape for all operands and results" in proc.stdout
    assert "-> 1 ops: module.min.mlir" in proc.stdout
    assert '"stablehlo.add"' in (bundle / "module.min.mlir").read_text()


def test_train_eval_switch_is_not_a_recompile_finding():
    assert _mode_switch("ConvNet: grad mode=False (was True), input l_bn_num_batches_tracked_ gone")
    assert not _mode_switch("ConvNet: grad mode=False (was True), l_x_ dim 0=6 (was 4)")
    assert not _mode_switch("f: l_x_ dim 0=6 (was 4)")
