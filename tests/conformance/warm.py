"""Cold and warm conformance runs (``python -m tests.conformance.run --warm``).

The selection runs twice, in two processes with the same cache directories (ours,
``NEURON_COMPILE_CACHE_DIR``, and PyTorch's, ``TORCHINDUCTOR_CACHE_DIR``, which holds the
AOTAutogradCache entries of ``neuron_compile/aot_cache.py``): first cold, on empty caches, then
warm. Each process writes one JSON line per entry as it finishes: its rows, a bit-exact digest
of every compiled result the harness compared (outputs and mutated inputs, input gradients),
the fallback counts at that moment, and what the caches did (``tests.helpers.CacheProbe``).

An entry is ``same`` warm when its rows (outcome, reason, errors) and digests are identical,
every frame it stored cold is an AOTAutogradCache hit and every graph it compiled was read from
our cache (``tests.helpers.warm_cache_problems``). Entries whose graphs are never stored (a
CPU-fallback graph makes AOTAutogradCache bypass the save) are ``same`` when their results are.

A process that dies (a crash in XLA, a signal) is restarted after the entry it died in, which
is recorded as ``crashed``: one crash costs one entry, not the rest of the sweep.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from tests.helpers import CacheProbe, cache_env, tensor_digest, warm_cache_problems

from . import harness, outcomes
from .harness import Result
from .opinfo import full_name

PROCESS_TIMEOUT = 4 * 3600.0
#: The child process command, before its arguments.
CHILD = (sys.executable, "-m", "tests.conformance.run")
#: Warm verdicts of entries that are the same warm as cold (``WarmRun.verdicts``).
SAME = ("same: stored, loaded", "same: not stored", "same: no graph")

Entry = tuple[str, str, str]  # (op, variant, dtype)


# --------------------------------------------------------------------------- in a child process


def work_list(ops: list[Any], dtypes: list[torch.dtype]) -> list[tuple[torch.dtype, Any]]:
    """The (dtype, op) pairs of a sweep, in ``harness.run_sweep``'s order."""
    return [(d, op) for d in dtypes for op in ops if harness.applicable_dtypes(op, [d])]


def _entry_seed(op: Any, dtype: torch.dtype) -> int:
    # OpInfo samples draw from the global RNG: seeding per entry makes each entry's samples
    # independent of the entries before it (so a restarted process sees the same samples).
    text = f"{full_name(op)}/{dtype}".encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:4], "little")


def probe_entry(op: Any, dtype: torch.dtype, **kwargs: Any) -> dict[str, Any]:
    """``harness.run_entry`` with what the warm check compares: JSON-able."""
    import neuron_compile

    observed: list[list[Any]] = []

    def observe(phase: str, value: Any) -> None:
        fallback = neuron_compile.get_fallback_ops()
        observed.append([phase, tensor_digest(value), dict(sorted(fallback.items()))])

    torch.manual_seed(_entry_seed(op, dtype))
    probe = CacheProbe()
    with harness.observing(observe):
        rows = harness.run_entry(op, dtype, **kwargs)
    rows_json = [asdict(r) for r in rows]
    return {
        "entry": _key(op, dtype),
        "rows": rows_json,
        "observed": observed,
        "cache": probe.facts(),
    }


def _key(op: Any, dtype: torch.dtype) -> list[str]:
    return [op.name, op.variant_test_name, str(dtype).removeprefix("torch.")]


def probe_sweep(
    work: list[tuple[torch.dtype, Any]],
    out: Path,
    *,
    start: int = 0,
    progress: Callable[[int, int, str], None] | None = None,
    **kwargs: Any,
) -> None:
    """Run ``work[start:]``, appending one JSON line per entry to ``out`` as it finishes; a
    ``{"start": i, ...}`` line before each entry lets the parent name the entry a crash
    happened in."""
    with open(out, "a") as f:
        for i in range(start, len(work)):
            dtype, op = work[i]
            if progress is not None:
                progress(i, len(work), _name(tuple(_key(op, dtype))))
            f.write(json.dumps({"start": i, "of": len(work), "key": _key(op, dtype)}) + "\n")
            f.flush()
            record = probe_entry(op, dtype, **kwargs)
            f.write(json.dumps({"i": i, **record}) + "\n")
            f.flush()
    if progress is not None:
        progress(len(work), len(work), "done")


# --------------------------------------------------------------------------- in the parent


@dataclass
class ProcessRun:
    """Entries one mode (cold or warm) finished, the ones it crashed in, and its wall time."""

    records: dict[Entry, dict[str, Any]] = field(default_factory=dict)
    crashed: dict[Entry, str] = field(default_factory=dict)  # entry -> why
    order: list[Entry] = field(default_factory=list)  # entries started, in work-list order
    seconds: float = 0.0
    total: int = 0  # entries in the work list


def _read(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of ``path``; a line still being written (read while polling) is left out."""
    if not path.exists():
        return []
    out = []
    with open(path) as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def run_mode(
    mode: str,
    child_args: list[str],
    root: Path,
    timeout: float,
    progress: Callable[[int, int, str], None] | None = None,
    child: tuple[str, ...] = CHILD,
) -> ProcessRun:
    """Run the selection in child processes (restarted after a crash) with both caches under
    ``root``; ``child_args`` select the entries (``run.py``'s selection options). A child's
    stderr goes to ``root/<mode>.log``."""
    out, log = root / f"{mode}.jsonl", root / f"{mode}.log"
    out.unlink(missing_ok=True)
    run = ProcessRun()
    start, began = 0, time.perf_counter()
    while True:
        cmd = [*child, *child_args, "--probe-out", str(out), "--probe-start", str(start)]
        with open(log, "a") as err:
            proc = subprocess.Popen(cmd, env=cache_env(root), stdout=err, stderr=err)
            returncode = _wait(proc, out, mode, timeout, progress)
        lines = _read(out)
        done = {r["i"] for r in lines if "entry" in r}
        started = [r for r in lines if "start" in r]
        run.total = started[0]["of"] if started else 0
        if returncode == 0:
            break
        tail = " | ".join(log.read_text().strip().splitlines()[-4:])
        if not started or started[-1]["start"] in done:  # died outside any entry
            raise RuntimeError(f"{mode} process exited {returncode}: {tail}")
        last = started[-1]
        run.crashed[tuple(last["key"])] = f"{mode} process died (exit {returncode}): {tail}"
        start = last["start"] + 1
    for r in lines:
        if "entry" in r:
            run.records[tuple(r["entry"])] = r
        elif "start" in r:
            run.order.append(tuple(r["key"]))
    run.seconds = time.perf_counter() - began
    return run


def _wait(
    proc: subprocess.Popen,
    out: Path,
    mode: str,
    timeout: float,
    progress: Callable[[int, int, str], None] | None,
) -> int:
    """The child's exit status; its entries reported to ``progress`` as they start."""
    deadline, shown = time.monotonic() + timeout, -1
    while True:
        try:
            returncode = proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            returncode = None
        if progress is not None:
            started = [r for r in _read(out) if "start" in r]
            if started and started[-1]["start"] != shown:
                last = started[-1]
                shown = last["start"]
                progress(shown, last["of"], f"{mode} {_name(tuple(last['key']))}")
        if returncode is not None:
            return returncode
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            return -9


# Graph names count the process's compiles (``fn_1549_backward_0``): a process restarted after a
# crash counts differently, so reasons are compared without those numbers.
_GRAPH_NAME = re.compile(r"\b(\w+?)_\d+_(forward|backward|inference)_\d+\b")


def _comparable(row: dict[str, Any]) -> str:
    """``row`` as compared cold vs warm: JSON (so NaN errors are equal), graph names unnumbered."""
    return json.dumps({**row, "reason": _GRAPH_NAME.sub(r"\1_N_\2", row["reason"])}, sort_keys=True)


def compare_entry(cold: dict[str, Any], warm: dict[str, Any]) -> list[str]:
    """Why an entry's warm run differs from its cold run ([] if it does not)."""
    problems = []
    for c, w in zip(cold["rows"], warm["rows"], strict=False):
        if _comparable(c) != _comparable(w):
            changed = [k for k in c if json.dumps(c[k]) != json.dumps(w.get(k))]
            phase = c["phase"]
            if "outcome" in changed:
                problems.append(
                    f"{phase} {c['outcome']} -> {w['outcome']}: {outcomes.first_line(w['reason'])}"
                )
            else:
                problems.append(f"{phase} {', '.join(changed)} changed: {c} -> {w}")
    if len(cold["rows"]) != len(warm["rows"]):
        problems.append(f"{len(cold['rows'])} rows cold, {len(warm['rows'])} warm")
    for i, (c, w) in enumerate(zip(cold["observed"], warm["observed"], strict=False)):
        if c[1] != w[1]:
            problems.append(f"compiled result {i} ({c[0]}) differs: {_leaf_diff(c[1], w[1])}")
        if c[2] != w[2]:
            problems.append(f"compiled result {i} ({c[0]}): fallback counts {c[2]} -> {w[2]}")
    if len(cold["observed"]) != len(warm["observed"]):
        n, m = len(cold["observed"]), len(warm["observed"])
        problems.append(f"{n} compiled results cold, {m} warm")
    return problems + warm_cache_problems(cold["cache"], warm["cache"])


def _leaf_diff(cold: list[Any], warm: list[Any], limit: int = 3) -> str:
    """The leaves of two ``tensor_digest``s that differ, as ``leaf i: dtype[shape] #bits``."""

    def show(leaf: Any) -> str:
        if isinstance(leaf, list):
            dtype, shape, digest = leaf
            return f"{dtype}{shape} #{digest[:8]}"
        return str(leaf)

    if len(cold) != len(warm):
        return f"{len(cold)} leaves cold, {len(warm)} warm"
    pairs = enumerate(zip(cold, warm, strict=True))
    diffs = [f"leaf {i}: {show(c)} -> {show(w)}" for i, (c, w) in pairs if c != w]
    more = [f"+{len(diffs) - limit} more"] if len(diffs) > limit else []
    return ", ".join(diffs[:limit] + more)


def verdict(cold: ProcessRun, warm: ProcessRun, key: Entry) -> str:
    """The warm column of one entry: one of ``SAME``, ``differs: ...`` or ``crashed ...``."""
    for run in (cold, warm):
        if key in run.crashed:
            return "crashed: " + run.crashed[key]
    c, w = cold.records.get(key), warm.records.get(key)
    if c is None or w is None:
        return f"never ran {'cold' if c is None else 'warm'}"
    problems = compare_entry(c, w)
    if problems:
        return "differs: " + "; ".join(problems)
    if c["cache"]["aot"]["saved"]:
        return SAME[0]
    return SAME[2] if not c["cache"]["sources"] else SAME[1]


@dataclass
class WarmRun:
    """Both modes of one selection and the warm verdict of every entry."""

    cold: ProcessRun
    warm: ProcessRun
    verdicts: dict[Entry, str]

    def results(self) -> list[Result]:
        """The cold run's rows, each with its entry's warm verdict (the report's warm column);
        an entry a process crashed in is one ``error`` row."""
        rows = []
        for key, warm in self.verdicts.items():
            record = self.cold.records.get(key)
            if record is None:
                rows.append(Result(*key, "forward", "error", warm, warm=warm))
                continue
            rows += [Result(**{**row, "warm": warm}) for row in record["rows"]]
        return rows

    def failures(self) -> list[str]:
        """``entry: verdict`` for every entry that is not the same warm (crashes included)."""
        out = [f"{_name(k)}: {v}" for k, v in self.verdicts.items() if v not in SAME]
        for mode, run in (("cold", self.cold), ("warm", self.warm)):
            if run.total != len(self.verdicts):
                out.append(f"{mode}: {run.total} entries selected, {len(self.verdicts)} ran")
        return out

    def counts(self) -> dict[str, int]:
        """Entries per warm verdict kind, and AOTAutogradCache totals of each mode."""
        out = {v: sum(1 for x in self.verdicts.values() if x == v) for v in SAME}
        out["differs"] = sum(1 for v in self.verdicts.values() if v not in SAME)
        for mode, run in (("cold", self.cold), ("warm", self.warm)):
            for k in ("saved", "hit", "miss", "bypass"):
                out[f"{mode}_{k}"] = sum(r["cache"]["aot"][k] for r in run.records.values())
        return out


def _name(key: Entry) -> str:
    op, variant, dtype = key
    return f"{op}.{variant} {dtype}" if variant else f"{op} {dtype}"


def run_cold_warm(
    child_args: list[str],
    root: Path,
    timeout: float = PROCESS_TIMEOUT,
    progress: Callable[[int, int, str], None] | None = None,
) -> WarmRun:
    """Run the selection cold, then warm, with both caches under ``root`` (empty at first)."""
    for sub in ("neuron", "torch"):
        if (root / sub).exists() and any((root / sub).iterdir()):
            raise ValueError(f"{root / sub} is not empty: a cold run needs empty caches")
    cold = run_mode("cold", child_args, root, timeout, progress)
    warm = run_mode("warm", child_args, root, timeout, progress)
    keys = [*cold.order, *warm.order]
    verdicts = {k: verdict(cold, warm, k) for k in dict.fromkeys(keys)}
    return WarmRun(cold, warm, verdicts)
