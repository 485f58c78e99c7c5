"""OpInfo conformance harness: PyTorch's OpInfo samples, compiled with ``backend="neuron"`` vs eager.

For each OpInfo and dtype the OpInfo declares on CPU, a few deterministic samples run through a tiny
function whose inputs are the sample's tensors (every other argument is closed over), compiled with
``torch.compile(fn, backend="neuron", dynamic=False, fullgraph=True)``. Forward outputs and, for
floating dtypes of differentiable ops, input gradients (random cotangents) are compared with eager.

Each (op, variant, dtype, phase) gets one outcome:

- ``pass``      every sample matched eager within tolerance, entirely through the StableHLO path
- ``fallback``  the backend ran ops eagerly (``neuron_compile.get_fallback_ops()``), or, before the
                partitioner is wired, refused the graph with NC101 (reason ``unsupported: ...``)
- ``xfail``     not passing, and listed in ``expectations.toml`` (reason from there)
- ``mismatch``  numerics differ (max abs/rel error recorded)
- ``error``     any other exception (type, first line, our NC code)
- ``skip``      not applicable: no usable sample, eager itself raised, random/uninitialized output,
                out of scope (sparse/complex), or Dynamo did not capture the op into a graph

Usable from pytest (``run_entry``) and from ``python -m tests.conformance.run`` (``run_sweep``).
"""

from __future__ import annotations

import contextlib
import itertools
import re
import signal
import sys
import threading
import tomllib
import types
import unittest
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

import neuron_compile
from neuron_compile.errors import NeuronCompileError

from .compare import compare, leaves, to64

EXPECTATIONS = Path(__file__).with_name("expectations.toml")
OUTCOMES = ("pass", "fallback", "xfail", "mismatch", "error", "skip")
# When samples disagree, a phase reports its most severe sample outcome.
_SEVERITY = {"error": 5, "mismatch": 4, "fallback": 3, "xfail": 2, "pass": 1, "skip": 0}
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int32": torch.int32,
    "int64": torch.int64,
    "bool": torch.bool,
}
# OpInfo names whose outputs are random or uninitialized: eager parity is not defined for them
# (RNG ops are checked statistically elsewhere, as issue 3 allows).
_NONDETERMINISTIC = re.compile(
    r"(^|[._])(rand|randn|randint|bernoulli|normal|uniform|multinomial|exponential|geometric|"
    r"cauchy|log_normal|dropout\w*|rrelu|empty\w*|new_empty\w*|feature_alpha_dropout\w*|"
    r"alpha_dropout|fractional_max_pool\dd|svd_lowrank|pca_lowrank)(_like)?($|[._])"
)
_OUT_OF_SCOPE_NAME = re.compile(r"sparse|quantiz|complex|view_as_real|\bpolar\b|mkldnn")
_OUT_OF_SCOPE_VARIANT = re.compile(r"sparse|complex|quantiz")
REF_NOTE = "outside tolerance of eager but as close to the float64 reference"
DEFAULT_SAMPLES = 3
DEFAULT_TIMEOUT = 30.0


@dataclass
class Result:
    """One CSV row."""

    op: str
    variant: str
    dtype: str
    phase: str  # forward | backward
    outcome: str
    reason: str = ""
    max_abs_err: float | None = None
    max_rel_err: float | None = None

    @property
    def entry(self) -> tuple[str, str, str]:
        return (self.op, self.variant, self.dtype)

    def as_row(self) -> dict[str, Any]:
        row = asdict(self)
        for k in ("max_abs_err", "max_rel_err"):
            row[k] = "" if row[k] is None else f"{row[k]:.3g}"
        return row


class OpTimeout(BaseException):
    """The per-entry time budget ran out (a BaseException: no `except Exception` swallows it)."""


# --------------------------------------------------------------------------- OpInfo database


def _call_op(op: Callable, *args: Any, **kwargs: Any) -> Any:
    return op(*args, **kwargs)


def load_op_db() -> list[Any]:
    """PyTorch's OpInfo list. ``torch.testing._internal`` imports ``expecttest`` for its TestCase
    base class only; when that test-only package is absent a stand-in module is registered.

    Some OpInfos (SDPA, multi-head attention, ...) call their op through ``wrapper_set_seed``,
    which Dynamo refuses to trace (it saves and restores the RNG state). The harness seeds the RNG
    itself and skips random samples, so that wrapper is replaced by a plain call."""
    try:
        import expecttest  # noqa: F401
    except ImportError:
        stub = types.ModuleType("expecttest")
        stub.TestCase = unittest.TestCase
        stub.ACCEPT = False
        sys.modules["expecttest"] = stub
    from torch.testing._internal import common_methods_invocations as cmi

    cmi.wrapper_set_seed = _call_op
    return list(cmi.op_db)


def full_name(op: Any) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def select_ops(op_db: Iterable[Any], names: Iterable[str] | None = None) -> list[Any]:
    """OpInfos by name, in the order given: ``softmax`` selects every variant of softmax,
    ``softmax.with_dtype`` only that variant. ``None`` selects all, in database order."""
    ops = list(op_db)
    if names is None:
        return ops
    chosen: list[Any] = []
    for name in names:
        hits = [op for op in ops if name in (op.name, full_name(op))]
        if not hits:
            raise KeyError(f"no OpInfo named {name!r}")
        chosen.extend(op for op in hits if op not in chosen)
    return chosen


def scope_reason(op: Any) -> str | None:
    """Why ``op`` is out of scope for parity testing, or ``None``."""
    if _OUT_OF_SCOPE_NAME.search(op.name) or _OUT_OF_SCOPE_VARIANT.search(op.variant_test_name):
        return "out of scope: sparse/complex/quantized variant"
    if _NONDETERMINISTIC.search(op.name):
        return "random or uninitialized output: no eager parity (statistical tests instead)"
    return None


# --------------------------------------------------------------------------- expectations


def load_expectations(path: Path | str | None = EXPECTATIONS) -> list[dict[str, str]]:
    """Entries of ``[[xfail]]`` tables: ``op`` (name or name.variant), ``reason``, optional
    ``dtype`` and ``phase`` (default: any)."""
    if path is None or not Path(path).exists():
        return []
    with open(path, "rb") as f:
        data = tomllib.load(f)
    entries = data.get("xfail", [])
    for e in entries:
        if not e.get("op") or not e.get("reason"):
            raise ValueError(f"{path}: every [[xfail]] needs op and reason: {e}")
    return entries


def expected_failure(
    expectations: list[dict[str, str]], op: str, variant: str, dtype: str, phase: str
) -> str | None:
    """The reason ``op`` is expected to fail, or ``None``. An entry's ``op`` is an OpInfo name
    (all its variants) or ``name.variant`` (that variant only)."""
    name = f"{op}.{variant}" if variant else op
    for e in expectations:
        if e["op"] not in (op, name):
            continue
        if e.get("dtype", "*") in ("*", dtype) and e.get("phase", "*") in ("*", phase):
            return e["reason"]
    return None


# --------------------------------------------------------------------------- samples


def _split_tensors(obj: Any, tensors: list[torch.Tensor]) -> Callable[[tuple], Any]:
    """Return a builder that re-creates ``obj`` from a tuple of tensors; collects the tensors.
    Containers without tensors (``torch.Size``, dtypes, ...) are closed over untouched."""
    if isinstance(obj, torch.Tensor):
        i = len(tensors)
        tensors.append(obj)
        return lambda ts: ts[i]
    if isinstance(obj, (list, tuple)) and _has_tensor(obj):
        parts = [_split_tensors(x, tensors) for x in obj]
        if isinstance(obj, list):
            return lambda ts: [p(ts) for p in parts]
        if hasattr(obj, "_fields"):  # namedtuple
            cls = type(obj)
            return lambda ts: cls(*[p(ts) for p in parts])
        return lambda ts: tuple(p(ts) for p in parts)
    if isinstance(obj, dict) and _has_tensor(obj):
        items = [(k, _split_tensors(v, tensors)) for k, v in obj.items()]
        return lambda ts: {k: p(ts) for k, p in items}
    return lambda ts: obj


def _has_tensor(obj: Any) -> bool:
    if isinstance(obj, torch.Tensor):
        return True
    if isinstance(obj, (list, tuple)):
        return any(_has_tensor(x) for x in obj)
    if isinstance(obj, dict):
        return any(_has_tensor(x) for x in obj.values())
    return False


def _copy(t: torch.Tensor, grad: bool) -> torch.Tensor:
    """A fresh leaf with the same values and strides (non-contiguous samples stay so)."""
    with torch.no_grad():
        try:
            c = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
            c.copy_(t)
        except RuntimeError:  # overlapping (expanded) layouts cannot be written to
            c = t.detach().clone()
    return c.requires_grad_(grad and t.requires_grad)


def pick_samples(op: Any, dtype: torch.dtype, grad: bool, k: int) -> list[Any]:
    """``k`` samples spread over the first ``4k`` (the first few are often all scalars)."""
    samples = list(itertools.islice(op.sample_inputs("cpu", dtype, requires_grad=grad), 4 * k))
    if len(samples) <= k:
        return samples
    step = len(samples) / k
    return [samples[int(i * step)] for i in range(k)]


# --------------------------------------------------------------------------- one sample


def _fallback_api() -> tuple[Callable[[], Any] | None, Callable[[], Any] | None]:
    return (
        getattr(neuron_compile, "get_fallback_ops", None),
        getattr(neuron_compile, "clear_fallback_ops", None),
    )


def _clear_fallbacks() -> None:
    clear = _fallback_api()[1]
    if clear is not None:
        clear()


def _fallback_reason() -> str | None:
    """``fell back: op xN, ...`` from ``neuron_compile.get_fallback_ops()`` when wired."""
    get = _fallback_api()[0]
    if get is None:
        return None
    report = get()
    if not report:
        return None
    names: list[str] = []
    if isinstance(report, dict):
        names = [f"{k} x{v}" if isinstance(v, int) else str(k) for k, v in report.items()]
    else:
        for item in report:
            op = item.get("op") if isinstance(item, dict) else getattr(item, "op", item)
            names.append(str(op))
    return "fell back: " + ", ".join(sorted(set(names)))


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
            op = getattr(ours, "op", None) or "?"
            why = getattr(ours, "reason", None) or first_line(str(ours))
            return "fallback", f"unsupported: {op}: {why}"
        what = first_line(getattr(ours, "what", None) or str(ours))
        where = f" ({ours.op})" if getattr(ours, "op", None) else ""
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


def _graphs() -> int:
    return len(neuron_compile.metrics())


def _run_compiled(fn: Callable, args: list[torch.Tensor]) -> Any:
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="neuron", dynamic=False, fullgraph=True)
    return compiled(*args)


def run_sample(op: Any, sample: Any, dtype: torch.dtype, backward: bool) -> dict[str, Result]:
    """Forward (and backward) results of one sample, keyed by phase. Never raises (except for
    ``OpTimeout`` and ``KeyboardInterrupt``, which end the whole entry)."""
    key = (op.name, op.variant_test_name, _dtype_name(dtype))
    fwd = _run_forward(op, sample, dtype, backward, key)
    results = {"forward": fwd[0]}
    if backward:
        if fwd[0].outcome in ("pass", "mismatch"):
            results["backward"] = _run_backward(sample, dtype, fwd[1], key)
        else:
            results["backward"] = Result(*key, "backward", "skip", "forward did not run")
    return results


def _run_forward(op: Any, sample: Any, dtype: torch.dtype, grad: bool, key: tuple) -> tuple:
    tensors: list[torch.Tensor] = []
    build = _split_tensors((sample.input, sample.args, sample.kwargs), tensors)
    if "out" in sample.kwargs:
        return Result(*key, "forward", "skip", "out= sample"), None
    if isinstance(sample.kwargs.get("dropout_p"), float) and sample.kwargs["dropout_p"] > 0:
        return Result(*key, "forward", "skip", "random output: dropout sample"), None
    target = op.op

    def fn(*ts: torch.Tensor) -> Any:
        inp, args, kwargs = build(ts)
        return target(inp, *args, **kwargs)

    eager_in = [_copy(t, grad) for t in tensors]
    torch.manual_seed(0)
    try:
        expected = fn(*eager_in)
    except Exception as e:
        return Result(*key, "forward", "skip", f"eager raised {type(e).__name__}"), None
    if any(
        isinstance(x, torch.Tensor) and (x.is_complex() or x.is_sparse) for x in leaves(expected)
    ):
        return Result(*key, "forward", "skip", "complex or sparse output: out of scope"), None
    comp_in = [_copy(t, grad) for t in tensors]
    before = _graphs()
    _clear_fallbacks()
    torch.manual_seed(0)
    try:
        actual = _run_compiled(fn, comp_in)
    except BaseException as e:
        _reraise_fatal(e)
        outcome, reason = classify_exception(e, reached_backend=_graphs() > before)
        return Result(*key, "forward", outcome, reason), None
    state = (fn, eager_in, comp_in, expected, actual, sample)
    if _graphs() == before:
        return Result(*key, "forward", "skip", "not captured by Dynamo: no graph compiled"), None
    fell_back = _fallback_reason()
    if fell_back:
        return Result(*key, "forward", "fallback", fell_back), state
    why, abs_err, rel_err = compare(actual, expected, dtype)
    note = ""
    if why and why.endswith("differs") and dtype.is_floating_point:
        with contextlib.suppress(Exception), torch.no_grad():
            ref = fn(*[to64(t, False) for t in eager_in])
            why = compare(actual, expected, dtype, ref)[0]
            note = "" if why else REF_NOTE
    if why is None:  # an op that mutates its arguments must mutate them the same way
        why = compare(comp_in, eager_in, dtype)[0]
        why = why and f"mutated input: {why.removeprefix('output ')}"
    if why:
        return Result(*key, "forward", "mismatch", why, abs_err, rel_err), state
    return Result(*key, "forward", "pass", note, abs_err, rel_err), state


def _differentiable(out: Any) -> list[torch.Tensor]:
    return [
        x
        for x in leaves(out)
        if isinstance(x, torch.Tensor) and x.requires_grad and x.is_floating_point()
    ]


def _run_backward(sample: Any, dtype: torch.dtype, state: tuple, key: tuple) -> Result:
    _fn, eager_in, comp_in, expected, actual, sample = state
    process = sample.output_process_fn_grad
    e_outs, a_outs = _differentiable(process(expected)), _differentiable(process(actual))
    e_ins = [t for t in eager_in if t.requires_grad]
    a_ins = [t for t in comp_in if t.requires_grad]
    if not e_outs or not e_ins:
        return Result(*key, "backward", "skip", "no differentiable output or input")
    if len(a_outs) != len(e_outs):
        why = f"{len(a_outs)} differentiable outputs, eager has {len(e_outs)}"
        return Result(*key, "backward", "mismatch", why)
    gen = torch.Generator().manual_seed(0)
    cots = [torch.randn(o.shape, generator=gen, dtype=torch.float32).to(o.dtype) for o in e_outs]
    try:
        e_grads = torch.autograd.grad(e_outs, e_ins, cots, allow_unused=True)
    except Exception as e:
        return Result(*key, "backward", "skip", f"eager backward raised {type(e).__name__}")
    _clear_fallbacks()
    try:
        a_grads = torch.autograd.grad(a_outs, a_ins, cots, allow_unused=True)
    except BaseException as e:
        _reraise_fatal(e)
        outcome, reason = classify_exception(e, reached_backend=True)
        return Result(*key, "backward", outcome, reason)
    fell_back = _fallback_reason()
    if fell_back:
        return Result(*key, "backward", "fallback", fell_back)
    why, abs_err, rel_err = compare(list(a_grads), list(e_grads), dtype)
    note = ""
    if why and why.endswith("differs"):
        with contextlib.suppress(Exception):
            why = compare(list(a_grads), list(e_grads), dtype, _ref_grads(state, cots))[0]
            note = "" if why else REF_NOTE
    if why:
        return Result(*key, "backward", "mismatch", "grad " + why, abs_err, rel_err)
    return Result(*key, "backward", "pass", note, abs_err, rel_err)


def _ref_grads(state: tuple, cots: list[torch.Tensor]) -> tuple:
    """Eager input gradients computed in float64 (same cotangents)."""
    fn, eager_in, _, _, _, sample = state
    ins = [to64(t, True) for t in eager_in]
    outs = _differentiable(sample.output_process_fn_grad(fn(*ins)))
    cots64 = [c.to(o.dtype) for c, o in zip(cots, outs, strict=True)]
    grads = torch.autograd.grad(
        outs, [t for t in ins if t.requires_grad], cots64, allow_unused=True
    )
    return grads


# --------------------------------------------------------------------------- one entry


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


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


def _merge(results: list[Result]) -> Result:
    """One phase result from per-sample results: the most severe sample wins; errors of equal
    severity keep the first reason; the worst numeric error is reported."""
    worst = max(results, key=lambda r: _SEVERITY[r.outcome])
    merged = Result(**asdict(worst))
    errs = [r.max_abs_err for r in results if r.max_abs_err is not None]
    if errs and merged.outcome in ("pass", "mismatch"):
        merged.max_abs_err = max(errs)
    if merged.outcome == "pass":
        merged.reason = next((r.reason for r in results if r.reason), "")
    return merged


def run_entry(
    op: Any,
    dtype: torch.dtype,
    *,
    samples: int = DEFAULT_SAMPLES,
    timeout: float | None = DEFAULT_TIMEOUT,
    expectations: list[dict[str, str]] | None = None,
) -> list[Result]:
    """Results (one per phase) of ``op`` at ``dtype``. Never raises except KeyboardInterrupt."""
    name, variant, dt = op.name, op.variant_test_name, _dtype_name(dtype)
    backward = bool(op.supports_autograd) and dtype.is_floating_point
    out_of_scope = scope_reason(op)
    if out_of_scope:
        results = [Result(name, variant, dt, "forward", "skip", out_of_scope)]
    else:
        try:
            with _time_limit(timeout), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                results = _run_samples(op, dtype, backward, samples)
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # a timeout, or a failure outside the per-sample guards
            outcome, reason = classify_exception(e, reached_backend=True)
            results = [Result(name, variant, dt, "forward", outcome, reason)]
            if isinstance(e, KeyboardInterrupt):
                raise
        finally:
            torch._dynamo.reset()
    expectations = expectations if expectations is not None else []
    for r in results:
        xfail = expected_failure(expectations, r.op, r.variant, r.dtype, r.phase)
        if xfail is None:
            continue
        if r.outcome in ("pass",):
            r.reason = "XPASS: listed in expectations.toml but passes"
        elif r.outcome != "skip":
            r.reason = f"{xfail} [{r.outcome}: {r.reason}]"
            r.outcome = "xfail"
    return results


def _run_samples(op: Any, dtype: torch.dtype, backward: bool, k: int) -> list[Result]:
    key = (op.name, op.variant_test_name, _dtype_name(dtype))
    try:
        chosen = pick_samples(op, dtype, backward, k)
    except Exception as e:
        reason = f"sample_inputs raised {type(e).__name__}: {first_line(str(e))}"
        return [Result(*key, "forward", "skip", reason)]
    if not chosen:
        return [Result(*key, "forward", "skip", "no sample inputs")]
    per_phase: dict[str, list[Result]] = {}
    for sample in chosen:
        for phase, r in run_sample(op, sample, dtype, backward).items():
            per_phase.setdefault(phase, []).append(r)
    return [_merge(rs) for rs in per_phase.values()]


def entry_outcome(results: list[Result]) -> Result:
    """The entry's overall result: forward if it did not pass, else backward (if any)."""
    fwd = next(r for r in results if r.phase == "forward")
    bwd = next((r for r in results if r.phase == "backward"), None)
    if fwd.outcome != "pass" or bwd is None or bwd.outcome == "skip":
        return fwd
    return bwd


def applicable_dtypes(op: Any, dtypes: Iterable[torch.dtype]) -> list[torch.dtype]:
    supported = op.supported_dtypes("cpu")
    return [d for d in dtypes if d in supported]


def run_sweep(
    ops: list[Any],
    dtypes: list[torch.dtype],
    *,
    samples: int = DEFAULT_SAMPLES,
    timeout: float | None = DEFAULT_TIMEOUT,
    expectations: list[dict[str, str]] | None = None,
    progress: Callable[[int, int, str], None] | None = None,
) -> Iterator[Result]:
    """Results of every (op, dtype) the OpInfo declares, dtype-major (all float32 first)."""
    work = [(d, op) for d in dtypes for op in ops if d in applicable_dtypes(op, [d])]
    for i, (dtype, op) in enumerate(work):
        if progress is not None:
            progress(i, len(work), f"{_dtype_name(dtype)} {full_name(op)}")
        yield from run_entry(op, dtype, samples=samples, timeout=timeout, expectations=expectations)
    if progress is not None:
        progress(len(work), len(work), "done")
