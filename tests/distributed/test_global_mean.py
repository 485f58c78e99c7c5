"""Issue 16: a global mean over two real gloo ranks is exact when compiled.

``fold_constants`` used to evaluate the all_reduce of the (constant) element count at compile
time, keeping each rank's own count and leaving that collective unwaited; compiled results then
differed from eager and every process ended with "there are still 1 unwaited collective calls".
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

from tests.distributed.global_mean_worker import WORLD_SIZE

WORKER = Path(__file__).with_name("global_mean_worker.py")
ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="no gloo")
def test_global_mean_matches_eager_on_every_rank() -> None:
    port = str(_free_port())
    # The ranks import neuron_compile from this checkout, whatever the installed copy is.
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    ranks = [
        subprocess.Popen(
            [sys.executable, str(WORKER), port, str(rank)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(WORLD_SIZE)
    ]
    try:
        outputs = [rank.communicate(timeout=120) for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()  # no-op for a rank that exited; a hung rank must not outlive the test
    lines = []
    for rank, (stdout, stderr) in zip(ranks, outputs, strict=True):
        assert rank.returncode == 0, stderr[-4000:]
        # torch prints this at exit when a collective was issued but never waited on
        assert "unwaited collective" not in stderr, stderr[-4000:]
        lines += [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    assert sorted(line["rank"] for line in lines) == list(range(WORLD_SIZE)), lines
    for line in lines:
        assert line["compiled"] == [line["eager"]] * 2, line  # exactly, on the first call too
        assert line["graphs"] >= 1, line  # the neuron backend compiled it (no silent eager run)
        assert line["pending_works"] in (0, None), line
    # 3 + 4 elements in all: every rank sees the same global mean.
    assert len({line["eager"] for line in lines}) == 1, lines
