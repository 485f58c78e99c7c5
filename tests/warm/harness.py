"""Runs warm-start scenario scripts (``tests/warm/scripts/*.py``) and prints what they computed.

``python -m tests.warm.harness --phase cold|warm SCRIPT...`` runs each script's ``run(out)`` in
this one process and prints a single JSON line ``{script name: facts}``. Several scripts share a
process because an interpreter with torch, jaxlib and Inductor's cache code costs ~4 s to start:
a process per script and phase would not fit the CI budget. Each script still starts from what a
fresh process would see: Dynamo reset, our metrics, fallback counts and RNG reset, torch's
counters read as differences. What a shared process cannot reset is our in-process executable
LRU; a graph it serves reports ``cache_source == "memory"``, which the tests accept as warm.

The facts of one script: every tensor it recorded, as dtype, shape and the hex of its bytes
(so cold and warm compare bit for bit); its error against eager; how its expected failures
failed; its stdout (prints inside compiled graphs are effects too); the warning categories it
raised; our per-graph metrics; the fallback counts; AOTAutogradCache's counters and its logged
reasons for bypassing. An exception in one script is recorded and the next script still runs,
so one broken scenario does not hide the others.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import runpy
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

import neuron_compile

#: torch's AOTAutogradCache counters (``counters["aot_autograd"]``), by our short name.
AOT_COUNTERS = {
    "hit": "autograd_cache_hit",
    "miss": "autograd_cache_miss",
    "saved": "autograd_cache_saved",
    "bypass": "autograd_cache_bypass",
}


def encode(t: torch.Tensor) -> dict[str, Any]:
    """A tensor as exact data: the hex of its bytes (any dtype, NaN payloads included)."""
    t = t.detach().cpu().contiguous()
    raw = t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)
    return {"dtype": str(t.dtype), "shape": list(t.shape), "hex": raw.numpy().tobytes().hex()}


def eager_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """Max absolute difference; for integer and bool tensors 0 if equal, else infinity."""
    got, want = got.detach(), want.detach()
    if got.shape != want.shape or got.dtype != want.dtype:
        return float("inf")
    if not got.is_floating_point():
        return 0.0 if torch.equal(got, want) else float("inf")
    if got.numel() == 0:
        return 0.0
    # NaN where eager has NaN is a match; anywhere else the error is infinite.
    diff = (got.double() - want.double()).abs()
    diff = torch.where(got.isnan() & want.isnan(), torch.zeros_like(diff), diff)
    return float(diff.nan_to_num(nan=float("inf")).max())


def _aot_counts() -> dict[str, int]:
    from torch._dynamo.utils import counters

    return {short: counters["aot_autograd"][key] for short, key in AOT_COUNTERS.items()}


def _minus(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: a[k] - b[k] for k in a}


class Outputs:
    """What a script hands back: ``check`` a compiled result against eager, ``raises`` an
    expected failure. Work that only the warm process does (a shape cold never compiled) goes
    inside ``warm_only()``: its results, graphs and cache counters are reported apart and
    compared with eager only."""

    def __init__(self, phase: str) -> None:
        self.phase = phase
        self.tensors: dict[str, dict[str, Any]] = {}
        self.warm_tensors: dict[str, dict[str, Any]] = {}
        self.eager: dict[str, dict[str, float]] = {}
        self.errors: dict[str, str] = {}
        #: (graph records, AOT counters) before and after the warm-only work.
        self.window: tuple[tuple[int, dict[str, int]], tuple[int, dict[str, int]]] | None = None
        self._in_window = False

    def check(self, name: str, got: torch.Tensor, want: torch.Tensor, *, tol: float = 1e-4) -> None:
        """Record ``got`` (a compiled result) and its distance from ``want`` (eager)."""
        if name in self.tensors or name in self.warm_tensors:
            raise ValueError(f"{name} recorded twice")
        (self.warm_tensors if self._in_window else self.tensors)[name] = encode(got)
        self.eager[name] = {"err": eager_error(got, want), "tol": tol}

    def train_step(
        self,
        name: str,
        model: torch.nn.Module,
        compiled: Callable[[torch.Tensor], torch.Tensor],
        eager: torch.nn.Module,
        x: torch.Tensor,
        loss: Callable[[torch.Tensor], torch.Tensor] = lambda y: y.square().sum(),
        *,
        keep_grads: bool = False,
    ) -> None:
        """One backward through ``compiled`` (wrapping ``model``) and through ``eager``, a copy:
        ``check`` the loss and every parameter's gradient, then clear the gradients (unless an
        optimizer step follows: ``keep_grads``)."""
        got, want = loss(compiled(x)), loss(eager(x))
        got.backward()
        want.backward()
        self.check(f"{name}.loss", got, want)
        for (pname, p), q in zip(model.named_parameters(), eager.parameters(), strict=True):
            self.check(f"{name}.grad.{pname}", p.grad, q.grad)
            if not keep_grads:
                p.grad = q.grad = None

    def raises(self, name: str, fn: Callable[[], Any]) -> None:
        """Record how ``fn`` fails (type and first line), e.g. an assert inside a graph."""
        try:
            fn()
        except Exception as e:
            first = str(e).splitlines()[0] if str(e) else ""
            self.errors[name] = f"{type(e).__name__}: {first}"
        else:
            self.errors[name] = "no exception"

    @contextlib.contextmanager
    def warm_only(self) -> Iterator[None]:
        if self.phase != "warm" or self.window is not None:
            raise RuntimeError("one warm_only() block per script, in the warm phase only")
        start = (len(neuron_compile.metrics()), _aot_counts())
        self._in_window = True
        try:
            yield
        finally:
            self._in_window = False
            self.window = (start, (len(neuron_compile.metrics()), _aot_counts()))


class _CacheLog(logging.Handler):
    """AOTAutogradCache's reasons for bypassing or not loading an entry (logged at INFO)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.notes: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith(("Bypassing", "AOTAutograd cache unable")):
            self.notes.append(message.splitlines()[0].strip())


def _graph_facts(records: list[Any]) -> list[dict[str, Any]]:
    keys = ("name", "kind", "cache_source", "fallback_ops", "regions")
    return [{k: getattr(r, k) for k in keys} for r in records]


@contextlib.contextmanager
def _cache_log() -> Iterator[_CacheLog]:
    handler = _CacheLog()
    logger = logging.getLogger("torch._functorch._aot_autograd.autograd_cache")
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    # INFO for our handler only: torch's own handlers would print every hit and miss.
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


def run_script(path: Path, phase: str) -> dict[str, Any]:
    """Run one script's ``run(out)`` from a clean state and collect its facts."""
    torch._dynamo.reset()
    neuron_compile.reset_metrics()
    neuron_compile.clear_fallback_ops()
    torch.manual_seed(0)
    before = _aot_counts()
    out = Outputs(phase)
    stdout = io.StringIO()
    error = None
    start = time.perf_counter()
    with (
        warnings.catch_warnings(record=True) as caught,
        contextlib.redirect_stdout(stdout),
        _cache_log() as cache_log,
    ):
        warnings.simplefilter("always")
        try:
            # A fresh namespace per run: nothing of the script survives in sys.modules.
            runpy.run_path(str(path), run_name="warm_scenario")["run"](out)
        except Exception:
            error = traceback.format_exc(limit=-10)
    seconds = time.perf_counter() - start
    records = list(neuron_compile.metrics())
    aot = _minus(_aot_counts(), before)
    warm_graphs, warm_aot = [], dict.fromkeys(AOT_COUNTERS, 0)
    if out.window is not None:
        (first, aot_start), (end, aot_end) = out.window
        warm_graphs = records[first:end]
        records = records[:first] + records[end:]
        warm_aot = _minus(aot_end, aot_start)
        aot = _minus(aot, warm_aot)
    return {
        "error": error,
        "seconds": round(seconds, 2),
        "tensors": out.tensors,
        "eager": out.eager,
        "raises": out.errors,
        "stdout": stdout.getvalue().splitlines(),
        "warnings": sorted({w.category.__name__ for w in caught}),
        "graphs": _graph_facts(records),
        "fallback_calls": neuron_compile.get_fallback_ops(),
        "aot": aot,
        "aot_notes": cache_log.notes,
        "warm_only": {
            "tensors": out.warm_tensors,
            "graphs": _graph_facts(warm_graphs),
            "aot": warm_aot,
        },
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phase", choices=("cold", "warm"), required=True)
    parser.add_argument("scripts", nargs="+", type=Path)
    args = parser.parse_args(argv)
    results = {path.stem: run_script(path, args.phase) for path in args.scripts}
    # One line, last on stdout: the test reads it whatever else the run printed.
    sys.stdout.write(json.dumps(results, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
