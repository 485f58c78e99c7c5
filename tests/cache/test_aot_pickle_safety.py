"""PyTorch's AOTAutogradCache entries are pickles: reading one runs whatever code it names. A
directory another user can write (or owns) is never read (aot_cache._directory_is_ours): a planted
entry's payload must not run, and the frame still computes the right answer from a trace.

Real processes and real files: a cold process fills the caches, then every AOTAutograd entry is
replaced by a pickle whose payload creates a marker file, as an attacker who can write there would.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

from tests.helpers import run_child

_STEP = """
import json, torch, neuron_compile
from torch._dynamo.utils import counters
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
x = torch.randn(4, 6)
loss = torch.compile(model, backend="neuron")(x).square().mean()
loss.backward()
print(json.dumps({
    "loss": loss.item(),
    "grad": model[0].weight.grad.flatten().tolist(),
    "hit": counters["aot_autograd"]["autograd_cache_hit"],
    "saved": counters["aot_autograd"]["autograd_cache_saved"],
}))
"""


class _Payload:
    """Unpickling this creates ``marker``: what a planted entry would run instead."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _run(cache: Path) -> tuple[dict, str]:
    return run_child(_STEP, cache)


def _plant(cache: Path, marker: Path) -> int:
    """Replace every AOTAutograd entry file with the payload; how many were replaced."""
    files = [p for p in (cache / "torch" / "aotautograd").rglob("*") if p.is_file()]
    for path in files:
        path.write_bytes(pickle.dumps(_Payload(marker)))
    return len(files)


@pytest.fixture
def cold(tmp_path) -> tuple[Path, dict]:
    run, _ = _run(tmp_path)
    assert run["saved"] == 1
    return tmp_path, run


def test_a_directory_others_can_write_is_never_unpickled(cold, tmp_path):
    cache, first = cold
    marker = tmp_path / "payload-ran"
    assert _plant(cache, marker) >= 1
    os.chmod(cache / "torch", 0o777)  # what another local user could have written into
    run, stderr = _run(cache)
    assert not marker.exists()
    assert "NC404" in stderr and "writable by group or others" in stderr
    assert stderr.count("NC404") == 1  # said once per process
    assert run["hit"] == 0 and (run["loss"], run["grad"]) == (first["loss"], first["grad"])


def test_a_subdirectory_others_can_write_is_never_unpickled(cold, tmp_path):
    cache, first = cold
    marker = tmp_path / "payload-ran"
    _plant(cache, marker)
    entry_dir = next(p for p in (cache / "torch" / "aotautograd").iterdir() if p.is_dir())
    os.chmod(cache / "torch", 0o755)  # others can enter the root...
    os.chmod(entry_dir, 0o777)  # ...and write below it
    run, stderr = _run(cache)
    assert not marker.exists() and "NC404" in stderr
    assert (run["loss"], run["grad"]) == (first["loss"], first["grad"])


def test_group_writable_files_below_a_private_root_are_still_ours(cold, tmp_path):
    """PyTorch writes with the umask (002 makes group-writable files); below a root only we
    can enter, nobody else can reach them, so the tier stays in use."""
    cache, first = cold
    os.chmod(cache / "torch", 0o700)
    for top, dirs, files in os.walk(cache / "torch" / "aotautograd"):
        for name in (*dirs, *files):
            os.chmod(os.path.join(top, name), 0o775 if name in dirs else 0o664)
    run, stderr = _run(cache)
    assert "NC404" not in stderr and run["hit"] == 1
    assert (run["loss"], run["grad"]) == (first["loss"], first["grad"])


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another uid needs root")
def test_a_directory_another_user_owns_is_never_unpickled(cold, tmp_path):
    cache, first = cold
    marker = tmp_path / "payload-ran"
    _plant(cache, marker)
    os.chown(cache / "torch", 65534, 65534)  # nobody: e.g. created first in /tmp by another user
    run, stderr = _run(cache)
    assert not marker.exists() and "owned by uid 65534" in stderr
    assert (run["loss"], run["grad"]) == (first["loss"], first["grad"])


def test_control_our_own_directory_is_read(cold, tmp_path):
    """The planted file is a real attack: in a directory that is ours, torch does unpickle it
    (we trust our own cache), so the refusals above are what protect a shared directory."""
    cache, _ = cold
    marker = tmp_path / "payload-ran"
    _plant(cache, marker)
    _run(cache)
    assert marker.exists()
