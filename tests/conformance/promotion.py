"""Mixed-dtype (type-promotion) samples, compiled with ``backend="neuron"`` vs eager.

OpInfo samples rarely mix dtypes, which is how ``threshold_backward(int64 grad, float32 input)``
returned int64 unnoticed (eager: float32). These samples pair operands of different dtypes:

- binary ops: int with float, bf16 with f32, f16 with bf16, bool with int or float, a Python
  scalar with a tensor, a 0-dim tensor with a tensor;
- backward ops taking a grad and an input (``threshold_backward``, ``gelu_backward``, the loss
  backwards, the pooling backwards we lower, ...): the grad and the input of different dtypes,
  and a 0-dim grad.

Every op of one dtype combination runs in one compiled function (one compile per combination);
when that raises, each op runs alone to name the culprit. A result of another dtype or other
values than eager's is a ``mismatch``; an exception an ``error`` (unless ``backend="aot_eager"``
raises too: PyTorch's limitation, a ``skip``); an op eager rejects is left out. Ops that run on
the CPU through a fallback are counted (``fallback``) but give eager's answer by construction.

Run from pytest (``test_promotion.py``) or ``python -m tests.conformance.run --promotion``.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

import neuron_compile

from .compare import compare, to64

aten = torch.ops.aten
SHAPE = (3, 4)

# --------------------------------------------------------------------------- operands


@dataclass(frozen=True)
class Operand:
    """A tensor of ``dtype`` (0-dim when ``scalar_tensor``) or a Python number (``dtype`` None)."""

    dtype: torch.dtype | None
    number: int | float | bool | None = None
    scalar_tensor: bool = False

    @property
    def label(self) -> str:
        if self.dtype is None:
            return f"py{type(self.number).__name__}"
        name = str(self.dtype).removeprefix("torch.")
        return f"{name}[0d]" if self.scalar_tensor else name

    def make(self, gen: torch.Generator, shape: tuple[int, ...] = SHAPE) -> Any:
        if self.dtype is None:
            return self.number
        shape = () if self.scalar_tensor else shape
        if self.dtype == torch.bool:
            return torch.rand(shape, generator=gen) > 0.5
        if self.dtype.is_floating_point:
            return torch.randn(shape, generator=gen).to(self.dtype)
        low = 0 if self.dtype == torch.uint8 else -4
        return torch.randint(low, 5, shape, generator=gen).to(self.dtype)


def _t(dtype: torch.dtype, scalar_tensor: bool = False) -> Operand:
    return Operand(dtype, scalar_tensor=scalar_tensor)


def _n(number: int | float | bool) -> Operand:
    return Operand(None, number)


f32, bf16, f16, i64, i32, u8, i8, b = (
    torch.float32,
    torch.bfloat16,
    torch.float16,
    torch.int64,
    torch.int32,
    torch.uint8,
    torch.int8,
    torch.bool,
)

#: (left, right) operands of the binary samples
BINARY_COMBOS: tuple[tuple[Operand, Operand], ...] = (
    (_t(i64), _t(f32)),
    (_t(f32), _t(i32)),
    (_t(bf16), _t(f32)),
    (_t(f16), _t(bf16)),
    (_t(b), _t(f32)),
    (_t(u8), _t(i8)),
    (_t(i32), _t(i64)),
    (_t(b), _t(i32)),
    (_t(f32), _n(3)),
    (_t(bf16), _n(0.1)),
    (_t(i32), _n(2.5)),
    (_t(i64), _n(-3)),
    (_t(b), _n(2)),
    (_n(1.5), _t(bf16)),
    (_t(f32, True), _t(bf16)),
    (_t(bf16), _t(f32, True)),
    (_t(i64, True), _t(i32)),
    (_t(f32, True), _t(i32)),
    (_t(i32, True), _t(f16)),
)


#: the CI slice (``test_promotion.py``): one combination of each kind; ``run.py --promotion``
#: runs them all
CI_BINARY_COMBOS = tuple(BINARY_COMBOS[i] for i in (0, 2, 3, 4, 5, 9, 10, 13, 14, 16))


def _binary(name: str, fn: Callable[[Any, Any], Any]) -> tuple[str, Callable[[Any, Any], Any]]:
    return name, fn


#: ops over (a, b); a Python number lands in the position the combo gives it
BINARY_OPS: tuple[tuple[str, Callable[[Any, Any], Any]], ...] = (
    _binary("add", torch.add),
    _binary("add_alpha", lambda a, c: torch.add(a, c, alpha=2)),
    _binary("sub", torch.sub),
    _binary("rsub", lambda a, c: torch.rsub(a, c)),
    _binary("mul", torch.mul),
    _binary("div", torch.div),
    _binary("div_floor", lambda a, c: torch.div(a, c, rounding_mode="floor")),
    _binary("div_trunc", lambda a, c: torch.div(a, c, rounding_mode="trunc")),
    _binary("floor_divide", torch.floor_divide),
    _binary("remainder", torch.remainder),
    _binary("fmod", torch.fmod),
    _binary("pow", torch.pow),
    _binary("maximum", torch.maximum),
    _binary("minimum", torch.minimum),
    _binary("fmax", torch.fmax),
    _binary("fmin", torch.fmin),
    _binary("atan2", torch.atan2),
    _binary("hypot", torch.hypot),
    _binary("copysign", torch.copysign),
    _binary("xlogy", torch.xlogy),
    _binary("logaddexp", torch.logaddexp),
    _binary("eq", torch.eq),
    _binary("ne", torch.ne),
    _binary("lt", torch.lt),
    _binary("le", torch.le),
    _binary("gt", torch.gt),
    _binary("ge", torch.ge),
    _binary("logical_and", torch.logical_and),
    _binary("logical_or", torch.logical_or),
    _binary("logical_xor", torch.logical_xor),
    _binary("bitwise_and", torch.bitwise_and),
    _binary("bitwise_or", torch.bitwise_or),
    _binary("bitwise_xor", torch.bitwise_xor),
    _binary("where", lambda a, c: torch.where(torch.arange(12).reshape(SHAPE) % 3 == 0, a, c)),
    _binary("clamp_min", lambda a, c: torch.clamp(a, min=c)),
    _binary("clamp_max", lambda a, c: torch.clamp(a, max=c)),
    _binary("lerp", lambda a, c: torch.lerp(a, torch.zeros_like(a), c)),
    _binary("masked_fill", lambda a, c: torch.masked_fill(a, torch.eye(3, 4, dtype=b), c)),
    # value=1: Dynamo itself rewrites other values into a div/mul in the operands' own dtypes
    # before any backend sees the op (docs/semantics.md, what every backend shares)
    _binary("addcmul", lambda a, c: torch.addcmul(a, c, c)),
    _binary("addcdiv", lambda a, c: torch.addcdiv(a, c, torch.full_like(c, 3))),
)

# --------------------------------------------------------------------------- backward ops

#: (grad, input) operand pairs of the backward samples
BACKWARD_COMBOS: tuple[tuple[Operand, Operand], ...] = (
    (_t(i64), _t(f32)),
    (_t(f32), _t(i64)),
    (_t(i32), _t(f32)),
    (_t(bf16), _t(f32)),
    (_t(f32), _t(bf16)),
    (_t(f16), _t(f32)),
    (_t(b), _t(f32)),
    (_t(f32, True), _t(bf16)),
    (_t(bf16, True), _t(f32)),
)

CI_BACKWARD_COMBOS = tuple(BACKWARD_COMBOS[i] for i in (0, 1, 3, 4, 6, 7))

BackwardArgs = Callable[[Any, Any, torch.Generator], tuple[Any, ...]]


def _pointwise(*extra: Any) -> BackwardArgs:
    return lambda g, x, gen: (g, x, *extra)


def _unit(*extra: Any) -> BackwardArgs:
    """The input mapped into (0, 1) (logit's domain; a sigmoid's output)."""

    def args(g: Any, x: Any, gen: torch.Generator) -> tuple[Any, ...]:
        return (g, (x.float().sigmoid() * 0.9 + 0.05).to(x.dtype), *extra)

    return args


def _with_target(*extra: Any) -> BackwardArgs:
    return lambda g, x, gen: (g, x, torch.randn(SHAPE, generator=gen), *extra)


def _elu(g: Any, x: Any, gen: torch.Generator) -> tuple[Any, ...]:
    return (g, 1.0, 1.0, 1.0, False, x)


def _log_sigmoid(g: Any, x: Any, gen: torch.Generator) -> tuple[Any, ...]:
    return (g, x, torch.empty(0))


def _dropout(g: Any, x: Any, gen: torch.Generator) -> tuple[Any, ...]:
    return (g, x > 0, 2.0)  # (grad, mask, scale): the input is the mask here


def _grad_shaped(shape: tuple[int, ...], build: Callable[..., tuple[Any, ...]]) -> BackwardArgs:
    """A pooling-style backward: the grad has the output's shape, the input 1x2x4x4."""

    def args(g: Any, x: Any, gen: torch.Generator) -> tuple[Any, ...]:
        if g.dim() != 0:
            g = torch.randn(shape, generator=gen).to(g.dtype) if g.is_floating_point() else g
            g = g if g.shape == shape else torch.ones(shape, dtype=g.dtype)
        xs = torch.randn(1, 2, 4, 4, generator=gen).to(x.dtype)
        return build(g, xs)

    return args


def _max_pool(g: Any, x: Any) -> tuple[Any, ...]:
    idx = torch.nn.functional.max_pool2d_with_indices(x.float(), 2)[1]
    return (g, x, [2, 2], [2, 2], [0, 0], [1, 1], False, idx)


#: (name, op, arguments from (grad, input, generator)): every backward op taking a grad and an
#: input that reaches our lowering (``softshrink_backward``, ``hardshrink_backward`` and
#: ``rrelu_with_noise_backward`` have no lowering and run eagerly, so they are not here)
BACKWARD_OPS: tuple[tuple[str, Any, BackwardArgs], ...] = (
    ("threshold_backward", aten.threshold_backward.default, _pointwise(0.5)),
    ("gelu_backward", aten.gelu_backward.default, _pointwise()),
    ("gelu_backward_tanh", aten.gelu_backward.default, _pointwise("tanh")),
    ("silu_backward", aten.silu_backward.default, _pointwise()),
    ("sigmoid_backward", aten.sigmoid_backward.default, _unit()),
    ("tanh_backward", aten.tanh_backward.default, _pointwise()),
    ("hardtanh_backward", aten.hardtanh_backward.default, _pointwise(-0.5, 0.5)),
    ("leaky_relu_backward", aten.leaky_relu_backward.default, _pointwise(0.1, False)),
    ("softplus_backward", aten.softplus_backward.default, _pointwise(1.0, 20.0)),
    ("elu_backward", aten.elu_backward.default, _elu),
    ("hardsigmoid_backward", aten.hardsigmoid_backward.default, _pointwise()),
    ("hardswish_backward", aten.hardswish_backward.default, _pointwise()),
    ("mish_backward", aten.mish_backward.default, _pointwise()),
    ("logit_backward", aten.logit_backward.default, _unit(None)),
    ("logit_backward_eps", aten.logit_backward.default, _unit(1e-6)),
    ("log_sigmoid_backward", aten.log_sigmoid_backward.default, _log_sigmoid),
    ("native_dropout_backward", aten.native_dropout_backward.default, _dropout),
    ("mse_loss_backward", aten.mse_loss_backward.default, _with_target(1)),
    ("smooth_l1_loss_backward", aten.smooth_l1_loss_backward.default, _with_target(1, 1.0)),
    ("huber_loss_backward", aten.huber_loss_backward.default, _with_target(1, 1.0)),
    ("soft_margin_loss_backward", aten.soft_margin_loss_backward.default, _with_target(1)),
    ("_softmax_backward_data", aten._softmax_backward_data.default, _pointwise(1, f32)),
    ("_log_softmax_backward_data", aten._log_softmax_backward_data.default, _pointwise(1, f32)),
    (
        "avg_pool2d_backward",
        aten.avg_pool2d_backward.default,
        _grad_shaped((1, 2, 2, 2), lambda g, x: (g, x, [2, 2], [2, 2], [0, 0], False, True, None)),
    ),
    (
        "max_pool2d_with_indices_backward",
        aten.max_pool2d_with_indices_backward.default,
        _grad_shaped((1, 2, 2, 2), _max_pool),
    ),
    (
        "_adaptive_avg_pool2d_backward",
        aten._adaptive_avg_pool2d_backward.default,
        _grad_shaped((1, 2, 2, 2), lambda g, x: (g, x)),
    ),
    (
        "replication_pad2d_backward",
        aten.replication_pad2d_backward.default,
        _grad_shaped((1, 2, 6, 6), lambda g, x: (g, x, [1, 1, 1, 1])),
    ),
)


# --------------------------------------------------------------------------- running


#: every op that ran eagerly on the CPU in some sample (the report lists them)
FALLBACKS: set[str] = set()


@dataclass
class Outcome:
    """One (op, combination) sample."""

    op: str
    combo: str
    outcome: str  # pass | mismatch | error | fallback | skip
    reason: str = ""


@dataclass
class Sample:
    op: str
    combo: str
    fn: Callable[..., Any]  # over the tensor inputs
    inputs: tuple[torch.Tensor, ...]


def _split(args: tuple[Any, ...]) -> tuple[tuple[torch.Tensor, ...], Callable[..., tuple]]:
    """The tensors of ``args`` and a function rebuilding ``args`` from (copies of) them."""
    positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]

    def rebuild(*ts: torch.Tensor) -> tuple[Any, ...]:
        out = list(args)
        for i, t in zip(positions, ts, strict=True):
            out[i] = t
        return tuple(out)

    return tuple(args[i] for i in positions), rebuild


def _sample(name: str, combo: str, op: Callable[..., Any], args: tuple[Any, ...]) -> Sample:
    tensors, rebuild = _split(args)
    return Sample(name, combo, lambda *ts: op(*rebuild(*ts)), tensors)


def binary_samples(combo: tuple[Operand, Operand]) -> list[Sample]:
    gen = torch.Generator().manual_seed(0)
    label = f"{combo[0].label}+{combo[1].label}"
    a, c = combo[0].make(gen), combo[1].make(gen)
    return [_sample(name, label, fn, (a, c)) for name, fn in BINARY_OPS]


def backward_samples(combo: tuple[Operand, Operand]) -> list[Sample]:
    label = f"grad {combo[0].label}, input {combo[1].label}"
    out = []
    for name, op, build in BACKWARD_OPS:
        gen = torch.Generator().manual_seed(0)
        g, x = combo[0].make(gen), combo[1].make(gen)
        out.append(_sample(name, label, op, build(g, x, gen)))
    return out


def _copy(ts: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    return [t.clone() for t in ts]


def _compiled(fns: list[Callable[..., Any]], inputs: list[tuple[torch.Tensor, ...]], backend: str):
    """Every ``fns[i](*inputs[i])`` in one compiled function."""
    sizes = [len(ts) for ts in inputs]

    def together(*flat: torch.Tensor) -> tuple[Any, ...]:
        outs, at = [], 0
        for fn, n in zip(fns, sizes, strict=True):
            outs.append(fn(*flat[at : at + n]))
            at += n
        return tuple(outs)

    torch._dynamo.reset()
    compiled = torch.compile(together, backend=backend, dynamic=False, fullgraph=True)
    return compiled(*[t for ts in inputs for t in _copy(ts)])


def _eager(sample: Sample) -> Any:
    with torch.no_grad():
        return sample.fn(*_copy(sample.inputs))


def _judge(sample: Sample, actual: Any, expected: Any, fell_back: set[str]) -> Outcome:
    dtype = next((t.dtype for t in _tensors(expected) if t.is_floating_point()), torch.float32)
    why = compare(actual, expected, dtype)[0]
    if why and why.endswith("differs"):  # as close to eager run in float64 passes (harness.py)
        with contextlib.suppress(Exception), torch.no_grad():
            ref = sample.fn(*[to64(t, False) for t in sample.inputs])
            why = compare(actual, expected, dtype, ref)[0]
    if why:
        return Outcome(sample.op, sample.combo, "mismatch", why + _dtypes(actual, expected))
    if fell_back:
        return Outcome(sample.op, sample.combo, "fallback", ", ".join(sorted(fell_back)))
    return Outcome(sample.op, sample.combo, "pass")


def _tensors(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in _tensors(item)]
    return []


def _dtypes(actual: Any, expected: Any) -> str:
    a = [str(t.dtype).removeprefix("torch.") for t in _tensors(actual)]
    e = [str(t.dtype).removeprefix("torch.") for t in _tensors(expected)]
    return "" if a == e else f" (dtypes {a}, eager {e})"


def _first_line(e: BaseException) -> str:
    inner: BaseException = e
    while getattr(inner, "inner_exception", None) or inner.__cause__:
        inner = getattr(inner, "inner_exception", None) or inner.__cause__  # type: ignore[assignment]
    text = next((ln.strip() for ln in str(inner).splitlines() if ln.strip()), "")
    return f"{type(inner).__name__}: {text[:200]}"


def _run_alone(sample: Sample, expected: Any) -> Outcome:
    neuron_compile.clear_fallback_ops()
    try:
        actual = _compiled([sample.fn], [sample.inputs], "neuron")[0]
    except Exception as e:
        try:
            _compiled([sample.fn], [sample.inputs], "aot_eager")
        except Exception:
            return Outcome(sample.op, sample.combo, "skip", "fails with aot_eager too")
        return Outcome(sample.op, sample.combo, "error", _first_line(e))
    ops = set(neuron_compile.get_fallback_ops())
    FALLBACKS.update(ops)
    return _judge(sample, actual, expected, ops)


def run_samples(samples: list[Sample]) -> list[Outcome]:
    """Outcomes of ``samples``: one compile for all of them; when that raises, one compile per
    combination, and then per op, to name the culprit."""
    results: list[Outcome] = []
    runnable: list[tuple[Sample, Any]] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for s in samples:
            try:
                runnable.append((s, _eager(s)))
            except Exception as e:
                results.append(Outcome(s.op, s.combo, "skip", f"eager raised {_first_line(e)}"))
        results += _run_batch(runnable)
    torch._dynamo.reset()
    return results


def _run_batch(runnable: list[tuple[Sample, Any]]) -> list[Outcome]:
    if not runnable:
        return []
    if len(runnable) == 1:
        return [_run_alone(*runnable[0])]
    neuron_compile.clear_fallback_ops()
    try:
        fns, inputs = [s.fn for s, _ in runnable], [s.inputs for s, _ in runnable]
        actual = _compiled(fns, inputs, "neuron")
    except Exception:
        actual = None
    if actual is not None:  # a fallback gives eager's answer: name it by the op's name only
        ops = set(neuron_compile.get_fallback_ops())
        FALLBACKS.update(ops)
        return [
            _judge(s, a, e, {op for op in ops if f".{s.op.split('_backward')[0]}" in op})
            for (s, e), a in zip(runnable, actual, strict=True)
        ]
    combos = list(dict.fromkeys(s.combo for s, _ in runnable))
    if len(combos) == 1:
        return [_run_alone(s, e) for s, e in runnable]
    return [o for c in combos for o in _run_batch([r for r in runnable if r[0].combo == c])]


def all_samples(full: bool = True) -> Iterator[list[Sample]]:
    """Sample groups (one compile each): binary combinations, then backward combinations
    (``full=False``: the CI slice)."""
    for combo in BINARY_COMBOS if full else CI_BINARY_COMBOS:
        yield binary_samples(combo)
    for combo in BACKWARD_COMBOS if full else CI_BACKWARD_COMBOS:
        yield backward_samples(combo)


def summarize(outcomes: list[Outcome]) -> dict[str, int]:
    counts = dict.fromkeys(("pass", "mismatch", "error", "fallback", "skip"), 0)
    for o in outcomes:
        counts[o.outcome] += 1
    return counts


def main(full: bool = True) -> int:
    """``python -m tests.conformance.run --promotion``: every combination, a summary and each
    sample that is not a pass or a skip. Exit status 1 on a mismatch or an error."""
    outcomes: list[Outcome] = []
    for group in all_samples(full):
        outcomes += run_samples(group)
    for o in outcomes:
        if o.outcome not in ("pass", "skip"):
            print(f"{o.outcome:9s} {o.op} [{o.combo}] {o.reason}")
    if FALLBACKS:
        print("ran eagerly on the CPU (fallback):", ", ".join(sorted(FALLBACKS)))
    counts = summarize(outcomes)
    print(", ".join(f"{k} {v}" for k, v in counts.items()), f"({len(outcomes)} samples)")
    return 1 if counts["mismatch"] or counts["error"] else 0
