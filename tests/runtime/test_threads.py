"""The XLA CPU client runs each execution on as many threads as eager PyTorch would.

Each case is a fresh process: jaxlib sizes the client's intra-op pool once, when the client is
made, and names its threads ``tf_XLAEigen`` (``/proc/self/task/*/comm``).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    not os.path.isdir("/proc/self/task"), reason="counts threads through Linux /proc"
)

_PROBE = """
import os, torch
torch.set_num_threads({threads})
from neuron_compile.runtime import xla_cpu
xla_cpu._client()
names = [open(f"/proc/self/task/{{t}}/comm").read().strip() for t in os.listdir("/proc/self/task")]
print(names.count("tf_XLAEigen"), os.environ.get("PJRT_NPROC"))
"""


def _pool_size(threads: int, **env: str) -> tuple[int, str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("PJRT_NPROC", "NPROC")}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE.format(threads=threads)],
        env={**environ, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.split()
    return int(out[0]), out[1]


@pytest.mark.parametrize("threads", [1, 3])  # neither is a 2-core CI machine's default
def test_pool_matches_torch_threads(threads: int) -> None:
    size, left_behind = _pool_size(threads)
    assert size == threads
    assert left_behind == "None"  # the variable is set for the constructor only


def test_user_setting_wins() -> None:
    size, left_behind = _pool_size(2, PJRT_NPROC="1")
    assert size == 1
    assert left_behind == "1"
