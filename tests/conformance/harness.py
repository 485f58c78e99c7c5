"""OpInfo conformance harness: PyTorch's OpInfo samples, compiled with ``backend="neuron"`` vs eager.

For each OpInfo and dtype the OpInfo declares on CPU, a few deterministic samples run through a tiny
function whose inputs are the sample's tensors (every other argument is closed over), compiled with
``torch.compile(fn, backend="neuron", dynamic=False, fullgraph=True)``. Forward outputs and, for
floating dtypes of differentiable ops, input gradients (random cotangents) are compared with eager.

Each (op, variant, dtype, phase) gets one outcome:

- ``pass``      every sample matched eager within tolerance, entirely through the StableHLO path
- ``fallback``  the backend ran ops eagerly on the CPU (``neuron_compile.get_fallback_ops()``);
                the reason ``fell back: op: why; ...`` comes from re-compiling with
                ``fallback="error"``. An NC101 error (``fallback="error"`` set by the environment)
                is recorded the same way as ``unsupported: op: why``
- ``xfail``     not passing, and listed in ``expectations.toml`` (reason from there)
- ``mismatch``  numerics differ (max abs/rel error recorded). Outside tolerance of eager but as
                close to eager run in float64 counts as a pass (noted); so do indices that order
                equal values differently where the op allows it (sort with stable=False, topk, ...)
- ``illegal``   a trn target's legality rules rejected a graph (``run.py --target trn2``): the
                reason starts with our code, the neuronx-cc code it pre-empts and the rule name
                (``NC511 NCC_EVRF019 reduce_window: ...``); never an xfail, never on cpu
- ``error``     any other exception (type, first line, our NC code)
- ``skip``      not applicable: no usable sample, eager itself raised, random/uninitialized or
                seed-dependent output, out of scope (sparse/complex), Dynamo did not capture the op
                into a graph, or the same error happens with ``backend="aot_eager"`` (PyTorch's)

Usable from pytest (``run_entry``) and from ``python -m tests.conformance.run`` (``run_sweep``).
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import torch

import neuron_compile

from .compare import compare, layout, leaves, to64
from .opinfo import (
    copy_leaf,
    expected_failure,
    full_name,
    pick_samples,
    scope_reason,
    split_tensors,
    unordered_ties,
)
from .outcomes import (
    _clear_fallbacks,
    _fallback_detail,
    _fell_back_ops,
    _reraise_fatal,
    _time_limit,
    _time_limit_paused,
    classify_exception,
    first_line,
)

OUTCOMES = ("pass", "fallback", "xfail", "mismatch", "illegal", "error", "skip")
# When samples disagree, a phase reports its most severe sample outcome. A graph the target
# rejects does not run there at all, so "illegal" outranks another sample's mismatch.
_SEVERITY = {o: i for i, o in enumerate(("skip", "pass", "xfail", "fallback", "mismatch"))}
_SEVERITY.update(illegal=5, error=6)
REF_NOTE = "outside tolerance of eager but as close to the float64 reference"
GRAD_LAYOUT_NOTE = (
    "grad strides as aot_eager's (AOTAutograd's backward, not eager's autograd formula)"
)
INDUCTOR_LAYOUT_NOTE = (
    "strides as Inductor's (PyTorch's fake-tensor meta, which AOTAutograd records, lays this "
    "result out otherwise than eager's kernel)"
)
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
    warm: str = ""  # the warm run's verdict on the entry (``run.py --warm``; warm.py)

    @property
    def entry(self) -> tuple[str, str, str]:
        return (self.op, self.variant, self.dtype)

    def as_row(self) -> dict[str, Any]:
        row = asdict(self)
        for k in ("max_abs_err", "max_rel_err"):
            row[k] = "" if row[k] is None else f"{row[k]:.3g}"
        return row


# --------------------------------------------------------------------------- one sample


def _graphs() -> int:
    return len(neuron_compile.metrics())


# Called with every compiled result the harness compares with eager: ("forward", (outputs,
# inputs after the call)) and ("backward", input gradients). The warm mode (warm.py) digests
# them to compare a cold and a warm process bit for bit.
_OBSERVERS: list[Callable[[str, Any], None]] = []


@contextlib.contextmanager
def observing(observer: Callable[[str, Any], None]) -> Iterator[None]:
    """Call ``observer(phase, value)`` with every compiled result while the block runs."""
    _OBSERVERS.append(observer)
    try:
        yield
    finally:
        _OBSERVERS.remove(observer)


def _observe(phase: str, value: Any) -> None:
    for observer in _OBSERVERS:
        observer(phase, value)


_TARGET: list[str | None] = [None]  # innermost ``compiling_for`` last; None: cpu


@contextlib.contextmanager
def compiling_for(target: str | None) -> Iterator[None]:
    """Every ``backend="neuron"`` compile in the block gets ``options["target"] = target``
    merged into the options it passes (``fallback="error"`` or none); None: as they are."""
    _TARGET.append(target)
    try:
        yield
    finally:
        _TARGET.pop()


def _run_compiled(
    fn: Callable, args: list[torch.Tensor], options: dict | None = None, backend: str = "neuron"
) -> Any:
    torch._dynamo.reset()
    if backend == "neuron" and _TARGET[-1] is not None:
        options = {**(options or {}), "target": _TARGET[-1]}
    kw = {"options": options} if options else {}
    compiled = torch.compile(fn, backend=backend, dynamic=False, fullgraph=True, **kw)
    return compiled(*args)


def _blame(outcome: str, reason: str, rerun: Callable[[], Any]) -> tuple[str, str]:
    """A non-NC error is PyTorch's own when ``rerun`` (the same code through Dynamo and
    AOTAutograd with ``backend="aot_eager"``, no neuron-compile) fails too: then it is a skip."""
    if outcome != "error" or reason.startswith(("NC", "OpTimeout")):
        return outcome, reason
    try:
        rerun()
    except BaseException as e:
        _reraise_fatal(e)
        return "skip", f"PyTorch limitation (fails with backend='aot_eager' too): {reason}"
    finally:
        torch._dynamo.reset()
    return outcome, reason


_STRICT = {"fallback": "error"}
TIE_NOTE = "indices of equal values ordered differently (allowed: stable=False)"


class _Run(NamedTuple):
    """A sample's forward run, kept for its backward."""

    fn: Callable
    eager_in: list[torch.Tensor]
    comp_in: list[torch.Tensor]
    expected: Any
    actual: Any
    sample: Any
    ties: tuple[int | None, int] | None  # see opinfo.unordered_ties


def _seed_dependent(fn: Callable, tensors: list, expected: Any, dtype: torch.dtype) -> bool:
    """Eager run again under another seed: a different result means a random output."""
    torch.manual_seed(1)
    try:
        with torch.no_grad():
            again = fn(*[copy_leaf(t, False) for t in tensors])
    except Exception:
        return False
    return compare(again, expected, dtype)[0] is not None


def _compare_modulo_ties(state: _Run, dtype: torch.dtype) -> str | None:
    """Compare again with the compiled indices replaced by eager's, if both pick equal values."""
    pos, dim = state.ties
    actual, expected = state.actual, state.expected
    x = state.sample.input.detach()
    if pos is None or x.dim() == 0 or (pos >= 0 and not isinstance(actual, tuple)):
        return compare(actual, expected, dtype)[0]  # values only: nothing to reorder
    a_idx, e_idx = (actual, expected) if pos == -1 else (actual[pos], expected[pos])
    a_at, e_at = (
        (a_idx, e_idx) if a_idx.dim() == x.dim() else (a_idx.unsqueeze(dim), e_idx.unsqueeze(dim))
    )
    try:
        same = torch.equal(x.gather(dim, a_at), x.gather(dim, e_at))
    except RuntimeError:
        same = False
    if not same:
        return f"output {max(pos, 0)} differs"
    if pos == -1:
        return None
    swapped = tuple(e_idx if i == pos else a for i, a in enumerate(actual))
    return compare(swapped, expected, dtype)[0]


def run_sample(op: Any, sample: Any, dtype: torch.dtype, backward: bool) -> dict[str, Result]:
    """Forward (and backward) results of one sample, keyed by phase. Never raises (except for
    ``OpTimeout`` and ``KeyboardInterrupt``, which end the whole entry)."""
    key = (op.name, op.variant_test_name, _dtype_name(dtype))
    fwd = _run_forward(op, sample, dtype, backward, key)
    results = {"forward": fwd[0]}
    if backward:
        if fwd[0].outcome in ("pass", "mismatch"):
            results["backward"] = _run_backward(dtype, fwd[1], key)
        else:
            results["backward"] = Result(*key, "backward", "skip", "forward did not run")
    return results


def _run_forward(op: Any, sample: Any, dtype: torch.dtype, grad: bool, key: tuple) -> tuple:
    tensors: list[torch.Tensor] = []
    build = split_tensors((sample.input, sample.args, sample.kwargs), tensors)
    if "out" in sample.kwargs:
        return Result(*key, "forward", "skip", "out= sample"), None
    target = op.op

    def fn(*ts: torch.Tensor) -> Any:
        inp, args, kwargs = build(ts)
        return target(inp, *args, **kwargs)

    eager_in = [copy_leaf(t, grad) for t in tensors]
    torch.manual_seed(0)
    try:
        expected = fn(*eager_in)
    except Exception as e:
        return Result(*key, "forward", "skip", f"eager raised {type(e).__name__}"), None
    if any(
        isinstance(x, torch.Tensor) and (x.is_complex() or x.is_sparse) for x in leaves(expected)
    ):
        return Result(*key, "forward", "skip", "complex or sparse output: out of scope"), None
    if _seed_dependent(fn, tensors, expected, dtype):
        return Result(*key, "forward", "skip", "random output: eager depends on the seed"), None
    comp_in = [copy_leaf(t, grad) for t in tensors]
    before = _graphs()
    _clear_fallbacks()
    torch.manual_seed(0)
    try:
        actual = _run_compiled(fn, comp_in)
    except BaseException as e:
        _reraise_fatal(e)
        outcome, reason = classify_exception(e, reached_backend=_graphs() > before)
        copies = [copy_leaf(t, grad) for t in eager_in]
        rerun = functools.partial(_run_compiled, fn, copies, None, "aot_eager")
        outcome, reason = _blame(outcome, reason, rerun)
        return Result(*key, "forward", outcome, reason), None
    _observe("forward", (actual, comp_in))
    state = _Run(fn, eager_in, comp_in, expected, actual, sample, unordered_ties(op, sample))
    if _graphs() == before:
        return Result(*key, "forward", "skip", "not captured by Dynamo: no graph compiled"), None
    fell_back = _fell_back_ops()
    if fell_back:
        rerun = functools.partial(
            _run_compiled, fn, [copy_leaf(t, grad) for t in eager_in], _STRICT
        )
        return Result(*key, "forward", "fallback", _fallback_detail(rerun, fell_back)), state
    why, abs_err, rel_err = compare(actual, expected, dtype)
    note = ""
    if why and " strides " in why:
        copies = [copy_leaf(t, grad) for t in eager_in]
        if _layouts_as(actual, functools.partial(_run_compiled, fn, copies, None, "inductor")):
            why, abs_err, rel_err = compare(actual, expected, dtype, strides=False)
            note = INDUCTOR_LAYOUT_NOTE
    if why and why.endswith("differs") and dtype.is_floating_point:
        with contextlib.suppress(Exception), torch.no_grad():
            ref = fn(*[to64(t, False) for t in eager_in])
            why = compare(actual, expected, dtype, ref, strides=not note)[0]
            note = note if why else REF_NOTE
    if why and state.ties is not None:
        why, note = _compare_modulo_ties(state, dtype), TIE_NOTE
        abs_err = rel_err = None
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


def _run_backward(dtype: torch.dtype, state: _Run, key: tuple) -> Result:
    _fn, eager_in, comp_in, expected, actual, sample, ties = state
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
        rerun = functools.partial(_compiled_grads, state, cots, None, "aot_eager")
        outcome, reason = _blame(outcome, reason, rerun)
        return Result(*key, "backward", outcome, reason)
    _observe("backward", a_grads)
    fell_back = _fell_back_ops()
    if fell_back:
        rerun = functools.partial(_compiled_grads, state, cots)
        return Result(*key, "backward", "fallback", _fallback_detail(rerun, fell_back))
    why, abs_err, rel_err = compare(list(a_grads), list(e_grads), dtype)
    note = ""
    if why and " strides " in why:
        rerun = functools.partial(_compiled_grads, state, cots, None)
        for backend, layout_note in (
            ("aot_eager", GRAD_LAYOUT_NOTE),
            ("inductor", INDUCTOR_LAYOUT_NOTE),
        ):
            if _layouts_as(list(a_grads), functools.partial(rerun, backend)):
                why, abs_err, rel_err = compare(list(a_grads), list(e_grads), dtype, strides=False)
                note = layout_note
                break
    if why and why.endswith("differs"):
        with contextlib.suppress(Exception):
            ref = _ref_grads(state, cots)
            why = compare(list(a_grads), list(e_grads), dtype, ref, strides=not note)[0]
            note = note if why else REF_NOTE
    if why and ties is not None:
        return Result(*key, "backward", "skip", "ties in the input: " + TIE_NOTE)
    if why:
        return Result(*key, "backward", "mismatch", "grad " + why, abs_err, rel_err)
    return Result(*key, "backward", "pass", note, abs_err, rel_err)


def _compiled_grads(
    state: _Run, cots: list[torch.Tensor], options: dict | None = _STRICT, backend: str = "neuron"
) -> tuple:
    """Input gradients through a fresh compile (default: ``fallback="error"``)."""
    fn, eager_in, sample = state.fn, state.eager_in, state.sample
    ins = [copy_leaf(t, True) for t in eager_in]
    out = _run_compiled(fn, ins, options, backend)
    outs = _differentiable(sample.output_process_fn_grad(out))
    return torch.autograd.grad(outs, [t for t in ins if t.requires_grad], cots, allow_unused=True)


def _layouts_as(ours: Any, rerun: Callable[[], Any]) -> bool:
    """Whether ``ours`` are laid out as PyTorch's own compiled code (``rerun``: the same code
    through another backend) lays them out: a backend can only match the layouts AOTAutograd
    says the graph returns.

    ``aot_eager`` runs eager's kernels on AOTAutograd's traced graph: eager's grad strides come
    from each autograd formula's implementation, which the traced backward does not reproduce
    (``ormqr``'s grad is transposed in eager, contiguous under ``aot_eager`` and Inductor).
    ``inductor`` returns the strides AOTAutograd's fake-tensor trace records. Where PyTorch's meta
    functions lay a result out otherwise than its kernels (bf16 ``mul`` of an expanded grad in
    ``tensordot``'s backward; bf16 ``max_unpool2d``), that is the layout any compiled backend
    returns and the one a later frame's guards were traced with."""
    try:
        with _time_limit_paused():
            ref = rerun()
    except BaseException as e:
        _reraise_fatal(e)
        return False
    finally:
        torch._dynamo.reset()
    pairs = zip(leaves(ours), leaves(ref), strict=False)
    return all(
        not isinstance(a, torch.Tensor) or (isinstance(r, torch.Tensor) and layout(a) == layout(r))
        for a, r in pairs
    )


def _ref_grads(state: _Run, cots: list[torch.Tensor]) -> tuple:
    """Eager input gradients computed in float64 (same cotangents)."""
    fn, eager_in, sample = state.fn, state.eager_in, state.sample
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


def _merge(results: list[Result]) -> Result:
    """One phase result from per-sample results: the most severe sample wins; errors of equal
    severity keep the first reason; the worst numeric error is reported."""
    worst = max(results, key=lambda r: _SEVERITY[r.outcome])
    merged = Result(**asdict(worst))
    errs = [r.max_abs_err for r in results if r.max_abs_err is not None]
    if errs and merged.outcome in ("pass", "mismatch"):
        merged.max_abs_err = max(errs)
    if merged.outcome == "pass":
        merged.reason = next((r.reason for r in results if r.outcome == "pass" and r.reason), "")
    return merged


def run_entry(
    op: Any,
    dtype: torch.dtype,
    *,
    samples: int = DEFAULT_SAMPLES,
    timeout: float | None = DEFAULT_TIMEOUT,
    expectations: list[dict[str, str]] | None = None,
) -> list[Result]:
    """Results (one per phase) of ``op`` at ``dtype`` (for the target of an enclosing
    ``compiling_for``, else cpu). Never raises except KeyboardInterrupt."""
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
        finally:
            torch._dynamo.reset()
    expectations = expectations if expectations is not None else []
    for r in results:
        xfail = expected_failure(expectations, r.op, r.variant, r.dtype, r.phase)
        if xfail is None:
            continue
        if r.outcome in ("pass",):
            r.reason = "XPASS: listed in expectations.toml but passes"
        elif r.outcome not in ("skip", "illegal"):  # the expectations are the cpu target's
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
