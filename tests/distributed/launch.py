"""Start N real gloo ranks of a worker script, collect one JSON line per rank, never leave one behind.

Two launchers, the same contract:

- ``subprocess`` (default): one ``python script`` per rank with torchrun's environment (``RANK``,
  ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), so the
  worker calls ``init_process_group("gloo")`` exactly as under torchrun, without torchrun's own
  start-up time.
- ``torchrun``: ``python -m torch.distributed.run --nproc-per-node N script``, for code that must
  be shown to work under the real launcher (Hugging Face Trainer, the examples).

Output goes to files, not pipes: a rank blocked writing a full pipe while another waits for it in a
collective would hang both. Every process runs in its own session, so a hung launch is killed
as a whole (torchrun and its children) by its process-group id, never by name.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
TAIL = 6000  # characters of a failed rank's stderr shown in the assertion message


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(extra: dict[str, str] | None) -> dict[str, str]:
    # The ranks import neuron_compile from this checkout (whatever the installed copy is) and the
    # examples' modules (simple_fsdp, train_tp_fsdp) as top-level names, as tests/conftest.py does.
    path = os.pathsep.join(p for p in (str(ROOT), str(EXAMPLES), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}  # N ranks share 2 cores
    env.update(extra or {})
    return env


def run_ranks(
    script: Path,
    args: list[str],
    world_size: int,
    *,
    launcher: str = "subprocess",
    timeout: float = 300.0,
    env: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Run ``script args`` on ``world_size`` gloo ranks; return their JSON lines sorted by rank.

    Fails as ``launch`` does, and when the ranks do not print exactly one JSON line each (a line
    starting with ``{`` that carries its ``rank``).
    """
    outputs = launch(script, args, world_size, launcher=launcher, timeout=timeout, env=env)
    lines = [
        json.loads(line)
        for stdout, _ in outputs
        for line in stdout.splitlines()
        if line.startswith("{")
    ]
    ranks = sorted(line.get("rank", -1) for line in lines)
    assert ranks == list(range(world_size)), f"expected one JSON line per rank, got {lines}"
    return sorted(lines, key=lambda line: line["rank"])


def launch(
    script: Path,
    args: list[str],
    world_size: int,
    *,
    launcher: str = "subprocess",
    timeout: float = 300.0,
    env: dict[str, str] | None = None,
) -> list[tuple[str, str]]:
    """Run ``script args`` on ``world_size`` gloo ranks; return (stdout, stderr) per process
    (one per rank, or torchrun's one for all).

    Fails (AssertionError with the stderr tails, in the order the processes ended) when one
    exits non-zero, hangs past ``timeout`` seconds, or reports unwaited collectives. ``env``
    entries override the inherited environment.
    """
    port = str(free_port())
    base = _env(env)
    if launcher == "torchrun":
        commands = [
            [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={world_size}",
             "--master-addr=127.0.0.1", f"--master-port={port}", str(script), *args]
        ]  # fmt: skip
        envs = [base]
    elif launcher == "subprocess":
        commands = [[sys.executable, str(script), *args]] * world_size
        envs = [
            {**base, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(world_size),
             "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
            for r in range(world_size)
        ]  # fmt: skip
    else:
        raise ValueError(f"launcher must be 'subprocess' or 'torchrun', not {launcher!r}")

    with tempfile.TemporaryDirectory(prefix="ranks-") as tmp:
        procs, files = [], []
        for i, (command, proc_env) in enumerate(zip(commands, envs, strict=True)):
            out, err = Path(tmp, f"{i}.out"), Path(tmp, f"{i}.err")
            files.append((out, err))
            with out.open("w") as o, err.open("w") as e:
                procs.append(
                    subprocess.Popen(
                        command, cwd=ROOT, env=proc_env, stdout=o, stderr=e,
                        start_new_session=True,
                    )
                )  # fmt: skip
        order, killed = _wait(procs, timeout)
        outputs = [(out.read_text(), err.read_text()) for out, err in files]

    # In the order they ended: the first failure is usually the cause, the others its echo
    # (a peer's connection reset, or killed while waiting for it in a collective).
    failures = []
    for i in order:
        if procs[i].returncode != 0:
            how = "was killed (hung, or waited for a failed peer)" if i in killed else "failed"
            failures.append(
                f"--- {launcher} process {i} {how} (rc {procs[i].returncode}):\n"
                f"{outputs[i][1][-TAIL:]}"
            )
    assert not failures, f"{script.name} {' '.join(args)}:\n" + "\n".join(failures)
    for i, (_, stderr) in enumerate(outputs):
        who = f"{launcher} process {i} of {script.name} {' '.join(args)}"
        # torch prints this at exit when a collective was issued but never waited on
        assert "unwaited collective" not in stderr, f"{who}:\n{stderr[-TAIL:]}"
    return outputs


def _wait(
    procs: list[subprocess.Popen], timeout: float, grace: float = 10.0
) -> tuple[list[int], set[int]]:
    """Wait for every process; return their indices in the order they ended (killed ones last)
    and those killed.

    A process still running at the deadline, or ``grace`` seconds after another one failed (its
    peers would wait in a collective for gloo's 30-minute timeout), is killed with its session.
    """
    deadline = time.monotonic() + timeout
    ended: list[int] = []
    killed: set[int] = set()
    while len(ended) < len(procs) and time.monotonic() < deadline:
        ended += [i for i, p in enumerate(procs) if i not in ended and p.poll() is not None]
        if any(procs[i].returncode != 0 for i in ended):
            deadline = min(deadline, time.monotonic() + grace)
        time.sleep(0.05)
    for i, proc in enumerate(procs):
        if i not in ended and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the session we started: torchrun + ranks
            except ProcessLookupError:
                pass
            proc.wait()
            killed.add(i)
        if i not in ended:
            ended.append(i)
    return ended, killed
