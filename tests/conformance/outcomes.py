"""How the harness classifies what a compile raised, and its time limits.

``classify_exception`` maps an exception from compiled code to an outcome (``harness.py``'s
module docstring lists them) and a reason: our NC code first, a trn legality rejection by rule
and NCC code, Dynamo's wrappers unwrapped. The fallback helpers read which ops ran on the CPU
and why; the time limits bound one entry (SIGALRM) and pause for PyTorch's own reference
compiles.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import neuron_compile
from neuron_compile.errors import LegalityError, NeuronCompileError


class OpTimeout(BaseException):
    """The per-entry time budget ran out (a BaseException: no `except Exception` swallows it)."""


def _fallback_api() -> tuple[Callable[[], Any] | None, Callable[[], Any] | None]:
    return (
        getattr(neuron_compile, "get_fallback_ops", None),
        getattr(neuron_compile, "clear_fallback_ops", None),
    )


def _clear_fallbacks() -> None:
    clear = _fallback_api()[1]
    if clear is not None:
        clear()


def _fell_back_ops() -> list[str]:
    """Ops ``neuron_compile.get_fallback_ops()`` saw run on the CPU since the last clear."""
    get = _fallback_api()[0]
    report = get() if get is not None else None
    if not report:
        return []
    items = report if isinstance(report, dict) else [getattr(x, "op", x) for x in report]
    return sorted({str(k) for k in items})


def _split_detail(err: NeuronCompileError) -> str:
    """``op: why; op: why`` from an NC101 error (every split reason when it carries them)."""
    pairs = getattr(err, "split_reasons", None)
    if not pairs:  # not about one op (e.g. a data-dependent number crossing into a region)
        op, why = getattr(err, "op", None), getattr(err, "reason", None)
        what = first_line(getattr(err, "what", None) or str(err))
        return f"{op}: {first_line(why or what)}" if op else what
    return "; ".join(dict.fromkeys(f"{p['op']}: {first_line(p['reason'] or '')}" for p in pairs))


def _fallback_detail(rerun: Callable[[], Any], ops: list[str]) -> str:
    """Why ``ops`` fell back: ``rerun`` compiles again with ``fallback="error"``, whose NC101
    error lists every split reason. Falls back to the op names."""
    try:
        rerun()
    except BaseException as e:
        _reraise_fatal(e)
        ours = next((x for x in _chain(e) if isinstance(x, NeuronCompileError)), None)
        if ours is not None and ours.code == "NC101":
            return "fell back: " + _split_detail(ours)
    return "fell back: " + ", ".join(ops)


_DYNAMO_WRAPPERS = ("BackendCompilerFailed", "InternalTorchDynamoError")


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in seen:
        seen.append(cur)
        cur = getattr(cur, "inner_exception", None) or cur.__cause__ or cur.__context__
    return seen


def _reraise_fatal(exc: BaseException) -> None:
    """Timeouts and Ctrl-C end the entry even when Dynamo wrapped them in its own exceptions."""
    for e in _chain(exc):
        if isinstance(e, (OpTimeout, KeyboardInterrupt)):
            raise e


def first_line(text: str, limit: int = 160) -> str:
    line = next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def classify_exception(exc: BaseException, *, reached_backend: bool) -> tuple[str, str]:
    """``(outcome, reason)`` for an exception raised by compiled code."""
    chain = _chain(exc)
    ours = next((e for e in chain if isinstance(e, NeuronCompileError)), None)
    if ours is not None:
        if ours.code == "NC101":
            return "fallback", "unsupported: " + _split_detail(ours)
        what = first_line(getattr(ours, "what", None) or str(ours))
        where = f" ({ours.op})" if getattr(ours, "op", None) else ""
        if isinstance(ours, LegalityError):  # "NC511 NCC_EVRF019 reduce_window: ...": per rule
            found = [v.split(": ", 1) for v in getattr(ours, "violations", [])]
            what = first_line(found[0][-1]) if found else what  # no graph name: runs compare
            also = sorted({v[0] for v in found} - {ours.ncc_code})
            more = f" [also {', '.join(also)}]" if also else ""
            return "illegal", f"{ours.code} {ours.ncc_code} {ours.rule}: {what}{where}{more}"
        why = f": {first_line(ours.reason)}" if getattr(ours, "reason", None) else ""
        return "error", f"{ours.code} {type(ours).__name__}: {what}{where}{why}"
    timeout = next((e for e in chain if isinstance(e, OpTimeout)), None)
    if timeout is not None:
        return "error", f"OpTimeout: {timeout}"
    if not reached_backend and not any(type(e).__name__ == "BackendCompilerFailed" for e in chain):
        inner = chain[-1] if type(chain[0]).__name__ in _DYNAMO_WRAPPERS else chain[0]
        return "skip", f"not captured by Dynamo: {type(inner).__name__}: {first_line(str(inner))}"
    inner = next((e for e in chain if type(e).__name__ not in _DYNAMO_WRAPPERS), chain[-1])
    return "error", f"{type(inner).__name__}: {first_line(str(inner))}"


@contextlib.contextmanager
def _time_limit_paused(allowance: float = 300.0) -> Iterator[None]:
    """The entry's time limit stopped while PyTorch's own compiler runs as a reference: Inductor's
    first compile in a process takes tens of seconds on a loaded machine, which is not the
    entry's time. ``allowance`` bounds the reference run instead."""
    if (
        not hasattr(signal, "setitimer")
        or threading.current_thread() is not threading.main_thread()
    ):
        yield
        return
    remaining, _ = signal.setitimer(signal.ITIMER_REAL, 0)
    if remaining:
        signal.setitimer(signal.ITIMER_REAL, allowance)
    try:
        yield
    finally:
        if remaining:
            signal.setitimer(signal.ITIMER_REAL, remaining)


@contextlib.contextmanager
def _time_limit(seconds: float | None) -> Iterator[None]:
    """Raise ``OpTimeout`` after ``seconds`` (SIGALRM; main thread on POSIX only)."""
    usable = (
        seconds
        and hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
    )
    if not usable:
        yield
        return

    def on_alarm(signum: int, frame: Any) -> None:
        raise OpTimeout(f"entry exceeded {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
