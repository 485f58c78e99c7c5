"""A graph whose XLA temporaries exceed glibc's 32 MiB mmap limit does not page-fault them in again
on every call (``runtime/client.py:retain_freed_blocks``); ``NEURON_COMPILE_MALLOC_RETAIN_MB=0``
leaves malloc as it was, and then every call faults the whole buffer.

Each case is a fresh process: the malloc settings are process-wide and made once, with the
client. Page faults are the process's minor faults (``getrusage``) around each call.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not os.confstr("CS_GNU_LIBC_VERSION"),
    reason="glibc's malloc only",
)

_PROBE = """
import resource, torch
from neuron_compile.runtime.client import retain_freed_blocks

def f(x):  # the concatenation of nine operands XLA materializes: 36 MiB of temporaries
    return torch.cat([x * i for i in range(9)]).sin().sum()

compiled = torch.compile(f, backend="neuron")
x = torch.rand(1 << 20)
expected = f(x)
for _ in range(3):
    torch.testing.assert_close(compiled(x), expected, rtol=1e-5, atol=1e-2)
faults = []
for _ in range(9):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    compiled(x)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(*faults)
"""


def _faults_per_call(retain_mb: str | None) -> float:
    env = {k: v for k, v in os.environ.items() if k != "NEURON_COMPILE_MALLOC_RETAIN_MB"}
    if retain_mb is not None:
        env["NEURON_COMPILE_MALLOC_RETAIN_MB"] = retain_mb
    out = subprocess.run(
        [sys.executable, "-c", _PROBE],
        env={**env, "NEURON_COMPILE_CACHE_DIR": "off"},
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout.split()
    return statistics.median(int(n) for n in out)


def test_temporaries_are_not_faulted_in_every_call() -> None:
    pages = 9 * (1 << 20) * 4 // 4096
    assert _faults_per_call("0") >= pages * 0.9  # malloc as is: fresh pages every call
    assert _faults_per_call(None) < pages * 0.05


def test_a_value_that_is_not_a_number_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from neuron_compile.errors import OptionsError
    from neuron_compile.runtime.client import retain_freed_blocks

    monkeypatch.setenv("NEURON_COMPILE_MALLOC_RETAIN_MB", "1GB")
    with pytest.raises(OptionsError, match="NEURON_COMPILE_MALLOC_RETAIN_MB='1GB'"):
        retain_freed_blocks()


def test_a_bad_value_reaches_the_user_as_their_error_not_a_backend_bug() -> None:
    """Through a compile, the NC001 came wrapped in NC301 "XLA CPU failed to compile ... this is
    a neuron-compile bug", after a "cached executable unusable" warning."""
    probe = (
        "import torch, neuron_compile\n"
        "torch.compile(lambda x: x + 1, backend='neuron')(torch.ones(3))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
        env={**os.environ, "NEURON_COMPILE_MALLOC_RETAIN_MB": "abc", "NEURON_COMPILE_CACHE_DIR": "off"},
    )  # fmt: skip
    assert proc.returncode != 0
    assert "[NC001] invalid NEURON_COMPILE_MALLOC_RETAIN_MB='abc'" in proc.stderr
    assert "NC301" not in proc.stderr and "bug" not in proc.stderr
