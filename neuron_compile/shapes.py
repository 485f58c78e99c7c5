"""Static shapes: detect symbolic inputs, reject requested dynamism, specialize automatic dynamism."""

from __future__ import annotations

import bisect
import itertools
import logging
import re
import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

from .config import NeuronConfig
from .errors import RecompileLimitError
from .narrowing import user_name
from .warn_once import NeuronCompileWarning, warn

log = logging.getLogger(__name__)


class RecompileWarning(NeuronCompileWarning):
    """A compiled frame met a new input shape and compiled another static graph."""


def symbolic_dims(
    gm: fx.GraphModule, example_inputs: Sequence[Any]
) -> list[tuple[int, str, int | None, str]]:
    """``(input index, name, dim or None for a size symbol, symbol)`` for every symbolic size.

    Dynamo's real example inputs carry concrete sizes; the symbols live in the placeholders'
    ``example_value`` metadata, so both are consulted.
    """
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    found = []
    for i in range(max(len(placeholders), len(example_inputs))):
        x = example_inputs[i] if i < len(example_inputs) else None
        node = placeholders[i] if i < len(placeholders) else None
        name = node.name if node is not None else f"input {i}"
        meta = node.meta.get("example_value", node.meta.get("val")) if node is not None else None
        for candidate in (meta, x):
            if isinstance(candidate, torch.SymInt):
                found.append((i, name, None, str(candidate)))
                break
            if isinstance(candidate, torch.Tensor) and any(
                isinstance(s, torch.SymInt) for s in candidate.shape
            ):
                found.extend(
                    (i, name, d, str(s))
                    for d, s in enumerate(candidate.shape)
                    if isinstance(s, torch.SymInt)
                )
                break
    return found


def requested_dynamic(
    gm: fx.GraphModule, example_inputs: Sequence[Any], symbolic: str
) -> str | None:
    """Why the graph is symbolic if the *user* asked for it, else None (automatic dynamic)."""
    import torch._dynamo.config as dynamo_config

    # torch.compile(dynamic=True) patches assume_static_by_default=False around the whole frame
    # compilation, including this backend call; dynamic=None leaves it True.
    if not dynamo_config.assume_static_by_default:
        return "torch.compile(dynamic=True) made " + symbolic
    marked = []
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    for i, x in enumerate(example_inputs):
        dims = getattr(x, "_dynamo_dynamic_indices", None) if isinstance(x, torch.Tensor) else None
        if dims:
            name = names[i] if i < len(names) else f"input {i}"
            marked.append(
                f"{name} dim{'s' if len(dims) > 1 else ''} {', '.join(map(str, sorted(dims)))}"
            )
    if marked:
        return "torch._dynamo.mark_dynamic marked " + "; ".join(marked)
    return None


def _signature(args: Sequence[Any]) -> tuple:
    return (torch.is_grad_enabled(), *map(_signature_of, args), _aliasing(args))


def _signature_of(value: Any) -> Hashable:
    """A hashable key of one argument; containers by their elements, tensors by metadata only."""
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), value.dtype, value.requires_grad)
    if isinstance(value, list | tuple):
        return (type(value).__name__, tuple(map(_signature_of, value)))
    if isinstance(value, dict):
        return ("dict", tuple((k, _signature_of(v)) for k, v in value.items()))
    # An unhashable object (never seen in Dynamo graphs' inputs so far) keys by its type: the
    # compiled graph takes it as a runtime argument, and a key per object would grow forever.
    return value if _hashable(value) else ("unhashable", type(value).__name__)


def _aliasing(args: Sequence[Any]) -> tuple:
    """Which tensor arguments share a storage: its size, and where in it each starts and how it
    steps. AOTAutograd traces arguments that alias each other as views of one base, laid out as
    at the first call: that graph must not serve separate tensors (it sized the base from the
    first call) or other overlaps. Runs on every call of a dynamic frame: one pointer per
    tensor, details only for the shared ones."""
    tensor = torch.Tensor
    try:
        ptrs = [a.untyped_storage().data_ptr() if isinstance(a, tensor) else 0 for a in args]
    except (RuntimeError, NotImplementedError):  # a tensor without storage (sparse, nested)
        ptrs = [_storage_ptr(a) if isinstance(a, tensor) else 0 for a in args]
    real = [p for p in ptrs if p]
    if len(set(real)) == len(real):
        return ()  # the common case: no two arguments share a storage
    seen: dict[int, list[int]] = {}
    for i, ptr in enumerate(ptrs):
        if ptr:
            seen.setdefault(ptr, []).append(i)
    groups = []
    for members in seen.values():
        if len(members) > 1:
            size = args[members[0]].untyped_storage().nbytes()
            views = [(i, args[i].storage_offset(), tuple(args[i].stride())) for i in members]
            groups.append((size, *views))
    return tuple(sorted(groups))


def _storage_ptr(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # no storage (sparse, nested): nothing shared
        return 0


class ShapeSpecializer:
    """Stands in for a symbolic Dynamo graph: compiles one static graph per concrete signature.

    Dynamo's automatic dynamic shapes (``dynamic=None``) hand us a symbolic graph after a frame met
    its second shape. Trainium needs static shapes, so each new signature is a new static compile,
    counted as a recompile and announced with the dims that changed.
    """

    def __init__(
        self,
        gm: fx.GraphModule,
        cfg: NeuronConfig,
        compile_frame: Callable[..., Any],
        frame_key: Hashable = None,
        frame_name: str = "graph",
        input_names: Sequence[str] | None = None,
    ) -> None:
        self.gm = gm
        #: placeholder names for diagnoses (the user's, where the backend knows them)
        self.input_names = list(
            input_names or (n.name for n in gm.graph.find_nodes(op="placeholder"))
        )
        self.frame_key = frame_key if frame_key is not None else id(self)
        self.frame_name = frame_name
        self.cfg = cfg
        self._compile_frame = compile_frame
        self._compiled: dict[tuple, Any] = {}
        self._symbolic_dims = symbolic_dims(gm, [])

    def describe(self, args: Sequence[Any]) -> str:
        """The symbolic dims with their concrete values now ("L_x_ dim 0=3")."""
        dims = [
            f"{name} dim {d}={args[i].shape[d]}"
            for i, name, d, _ in self._symbolic_dims
            if d is not None and i < len(args) and isinstance(args[i], torch.Tensor)
        ]
        ints = [
            f"{name}={args[i]}"
            for i, name, d, _ in self._symbolic_dims
            if d is None and i < len(args)
        ]
        return ", ".join(dims or ints) or "new input shapes"

    @property
    def num_specializations(self) -> int:
        return len(self._compiled)

    def __call__(self, *args: Any) -> Any:
        key = _signature(args)
        fn = self._compiled.get(key)
        if fn is None:
            specs = input_specs(self.input_names, args)
            again = note_compile(
                self.frame_key, self.frame_name, specs, self.cfg, specializing=True
            )
            fn = self._compile_static(args, recompile=again)
            self._compiled[key] = fn
        return fn(*args)

    def _compile_static(self, args: Sequence[Any], recompile: bool) -> Callable[..., Any]:
        """The graph compiled for ``args``' shapes, with their Python ints as constants.

        Size ints must be constants in the graph: AOTAutograd makes every int input a symbol
        when it traces with a ShapeEnv (which ``_static_fakes`` needs), and a symbol is a
        dynamic shape to Trainium (NC501). The signature keys on their values, so the
        compiled graph takes the other inputs only.
        """
        ints = {i for i, a in enumerate(args) if type(a) is int}
        if not ints:
            return self._compile_frame(self.gm, _static_fakes(args), self.cfg, recompile=recompile)
        gm = _with_constant_inputs(self.gm, {i: args[i] for i in ints})
        rest = [a for i, a in enumerate(args) if i not in ints]
        fn = self._compile_frame(gm, _static_fakes(rest), self.cfg, recompile=recompile)
        return lambda *call_args: fn(*(a for i, a in enumerate(call_args) if i not in ints))


def _with_constant_inputs(gm: fx.GraphModule, constants: dict[int, int]) -> fx.GraphModule:
    """A copy of ``gm`` whose inputs at the keys of ``constants`` are those values instead."""
    graph = fx.Graph()
    env: dict[fx.Node, Any] = {}
    placeholders = iter(range(len(gm.graph.find_nodes(op="placeholder"))))
    for node in gm.graph.nodes:
        if node.op == "placeholder" and (i := next(placeholders)) in constants:
            env[node] = constants[i]
        else:
            env[node] = graph.node_copy(node, lambda n: env[n])
    return fx.GraphModule(gm, graph, gm.__class__.__name__)


def _static_fakes(args: Sequence[Any]) -> list[Any]:
    """``args`` as the example inputs Dynamo would hand a backend, with static shapes: fake
    tensors of a mode with a ShapeEnv. AOTAutograd traces with that mode, which the graph needs
    for ``item()`` of the 0-d tensors Dynamo passes unspecialized Python floats as (real inputs
    got a mode without one: DataDependentOutputException), and for ``while_loop``'s tracing."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    mode = FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=True)
    return [
        mode.from_tensor(a, static_shapes=True) if isinstance(a, torch.Tensor) else a for a in args
    ]


# ---- recompile accounting ----------------------------------------------------------------------
# Each compiled frame (Dynamo's frame id, or a ShapeSpecializer) keeps the input specs of every
# static graph compiled for it. A second static compile of the same frame is a recompile, whether
# Dynamo recompiled the frame (dynamic=False, or a non-shape guard) or a ShapeSpecializer met a new
# shape (dynamic=None). Budget and strict mode are checked before the compile starts.


#: The pseudo-input every specialization records the grad mode under.
GRAD_MODE = "grad mode"


@dataclass(frozen=True)
class InputSpec:
    """What a static graph was specialized on, per input: shape/dtype/stride, or a Python value.

    Elements of list, tuple and dict inputs get specs of their own (``inputs[3]``, ``d['k']``).
    """

    name: str
    shape: tuple[int, ...] | None
    dtype: str | None = None
    value: Any = None
    stride: tuple[int, ...] | None = None


@dataclass
class _Frame:
    name: str
    history: list[tuple[InputSpec, ...]] = field(default_factory=list)
    recompiles: int = 0
    #: specs of the frame's static (Dynamo) compiles a ShapeSpecializer has not compiled again
    static: list[tuple[InputSpec, ...]] = field(default_factory=list)


_lock = threading.Lock()
_frames: dict[Hashable, _Frame] = {}
_events: list[str] = []
_warmup = {"done": False}
_known_buckets: set[int] = set()  # note_buckets
#: (frame id, frame compile id) -> (the CompileContext of that compile, its graph counter)
_graph_counter: dict[Any, tuple[Any, itertools.count]] = {}


_SIZE_SYMBOL = re.compile(r"s\d+$")  # a symbolic graph's size inputs: already named by tensor dims


def input_specs(names: Sequence[str], args: Sequence[Any]) -> tuple[InputSpec, ...]:
    """Specs of a graph's inputs (placeholder ``names``), plus the grad mode as a pseudo-input.

    Tensors, also inside lists, tuples and dicts, are described by shape, dtype and stride only:
    their values are never read or printed. NOTE: compiled autograd hands the backend a list of
    tensors whose storage FSDP2 has freed (``untyped_storage().resize_(0)``); printing one reads
    freed memory (a segfault), and printing live ones cost 0.36 s for 200 of them.
    """
    specs = [InputSpec(GRAD_MODE, None, value=torch.is_grad_enabled())]
    for i, a in enumerate(args):
        _add_specs(specs, user_name(names[i]) if i < len(names) else f"input {i}", a)
    return tuple(specs)


#: Nesting depth past which a container input is summarized by its type and length.
_MAX_DEPTH = 8


def _add_specs(specs: list[InputSpec], name: str, value: Any, depth: int = 0) -> None:
    if isinstance(value, torch.Tensor):
        specs.append(_tensor_spec(name, value))
        return
    if isinstance(value, list | tuple | dict) and depth < _MAX_DEPTH:
        # The container's own spec carries its length, so a list that grew is diagnosed as such.
        specs.append(InputSpec(name, None, value=f"{type(value).__name__} of {len(value)}"))
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            _add_specs(specs, f"{name}[{key!r}]", item, depth + 1)
        return
    if _hashable(value):
        specs.append(InputSpec(name, None, value=value))
    else:  # never repr(): it may be large, slow, or read tensors the object holds
        specs.append(InputSpec(name, None, value=f"<{type(value).__name__}>"))


def _tensor_spec(name: str, t: torch.Tensor) -> InputSpec:
    """Shape, dtype and stride: metadata only, so a tensor whose storage was freed (or is fake,
    or lives on another device) is described the same way as any other."""
    if t.is_nested:  # no single shape; its sizes live in a tensor of their own
        return InputSpec(name, None, str(t.dtype), value="nested tensor")
    shape = tuple(map(int, t.shape))
    stride = tuple(map(int, t.stride())) if t.layout == torch.strided else None
    return InputSpec(name, shape, str(t.dtype), stride=stride)


def _hashable(value: Any) -> bool:
    """True if ``value`` hashes (``isinstance(x, Hashable)`` is also True for a tuple holding a
    list, whose hash raises)."""
    try:
        hash(value)
    except TypeError:
        return False
    return True


def bucket_for(size: int, buckets: Sequence[int]) -> int | None:
    """The smallest bucket ``>= size`` of the ascending ``buckets``, or None when ``size``
    exceeds the largest: the one lookup behind ``bucketing.bucket_size`` and the planner's
    ``BucketPlan.bucket_for``."""
    i = bisect.bisect_left(list(buckets), size)
    return buckets[i] if i < len(buckets) else None


def _changes(
    old: tuple[InputSpec, ...], new: tuple[InputSpec, ...], buckets: Sequence[int] | None
) -> list[tuple[str, str]]:
    """Differences between two specializations, matched by input name, as ``(kind, text)``:
    kind "shape", "dtype", "value" (a Python number's), "mode" (the grad mode) or "gone".

    A symbolic graph (automatic dynamic) has extra size-symbol inputs (``s77``); inputs present on
    one side only are ignored unless they are tensors or numbers Dynamo had baked in before.
    """
    before = {o.name: o for o in old}
    out = []
    for n in new:
        o = before.pop(n.name, None)
        if o is None:
            if n.shape is not None:
                out.append(("shape", f"new input {n.name} shape {list(n.shape)}"))
            elif not _SIZE_SYMBOL.match(n.name):  # a number Dynamo had baked in before
                out.append(("value", f"new input {n.name}={n.value!r}"))
            continue
        if n.shape is not None and o.shape is not None and len(n.shape) == len(o.shape):
            for d, (a, b) in enumerate(zip(o.shape, n.shape, strict=True)):
                if a != b:
                    text = f"{n.name} dim {d}={b} (was {a})"
                    if buckets and b not in buckets:
                        bucket = bucket_for(b, buckets)
                        text += (
                            f", bucket {bucket} would have absorbed it"
                            if bucket is not None
                            else f", larger than the largest bucket {buckets[-1]}"
                        )
                    out.append(("shape", text))
        elif o.shape != n.shape:
            out.append(
                ("shape", f"{n.name} shape {list(n.shape or ())} (was {list(o.shape or ())})")
            )
        if o.dtype != n.dtype and o.dtype is not None and n.dtype is not None:
            out.append(("dtype", f"{n.name} dtype {n.dtype} (was {o.dtype})"))
        if (
            o.shape is None
            and n.shape is None
            and o.value != n.value
            and not _SIZE_SYMBOL.match(n.name)
        ):
            kind = "mode" if n.name == GRAD_MODE else "value"
            out.append((kind, f"{n.name}={n.value!r} (was {o.value!r})"))
    out.extend(("gone", f"input {o.name} gone") for o in before.values() if o.shape is not None)
    return out


def _same_shapes(
    history: Sequence[tuple[InputSpec, ...]], new: tuple[InputSpec, ...]
) -> list[tuple[InputSpec, ...]]:
    """The earlier specializations that had every tensor input ``new`` has, with the same shape
    (inputs that disappeared, such as BatchNorm's counter in eval mode, do not count)."""
    tensors = {
        n.name: n.shape for n in new if n.shape is not None and not _SIZE_SYMBOL.match(n.name)
    }
    same = []
    for old in history:
        before = {o.name: o.shape for o in old}
        if all(before.get(name) == shape for name, shape in tensors.items()):
            same.append(old)
    return same


def _fix(history: Sequence[tuple[InputSpec, ...]], new: tuple[InputSpec, ...]) -> str:
    """What to do about a recompile for ``new``: by what changed since the earlier compiles of
    the same shapes (none: a new shape)."""
    same = _same_shapes(history, new)
    if not same:
        return (
            "pad variable dimensions to fixed buckets (neuron_compile.bucketing; "
            "`neuron-compile buckets plan` picks them)"
        )
    kinds = {kind for old in same for kind, _ in _changes(old, new, None)}
    if "dtype" in kinds:
        return (
            "an input's dtype changed (model.half()/.to(dtype), or inputs of another dtype): "
            "each dtype is one compile; warm up each dtype you use"
        )
    if "value" in kinds:
        return (
            "a Python number among the inputs changed value, and each value is one compile: "
            "pass it as a tensor (torch.tensor(n)) if it is data, or keep it fixed"
        )
    # grad mode, model.train()/eval(), a flag: each such mode is one compile
    return (
        "no input shape changed: the graph depends on a mode (grad mode, "
        "model.train()/eval(), a global flag); run each mode you use once during warm-up"
    )


def diagnose(
    history: Sequence[tuple[InputSpec, ...]],
    new: tuple[InputSpec, ...],
    buckets: Sequence[int] | None = None,
) -> str:
    """What changed versus the closest previously compiled specialization (latest on ties)."""
    best: list[str] | None = None
    for old in reversed(history):
        changes = [text for _, text in _changes(old, new, buckets)]
        if best is None or len(changes) < len(best):
            best = changes
    if not best:
        return (
            "same input shapes as an earlier compile (Dynamo recompiled for another guard; "
            "TORCH_LOGS=recompiles shows which)"
        )
    return ", ".join(best)


def frame_key(owner: Hashable = None) -> Hashable:
    """Key of the frame Dynamo is compiling now: its frame id, ``owner`` (the module it runs, if
    any) and the graph's index in the compile."""
    try:  # private API: degrade to one key per backend call
        from torch._guards import CompileContext

        ctx = CompileContext.try_get()
        cid = ctx.compile_id if ctx is not None else None
    except Exception:
        ctx = cid = None
    if cid is None or cid.frame_id is None:
        return ("call", object())
    full = (cid.frame_id, cid.frame_compile_id)
    with _lock:
        seen = _graph_counter.get(full)
        if seen is None or seen[0] is not ctx:  # a new compile of this frame
            if cid.frame_compile_id == 0:
                # Dynamo's first compile of this frame id. torch._dynamo.reset() restarts frame
                # ids, so anything recorded under this id belongs to a frame from before it.
                stale = ("frame", cid.frame_id)
                for key in [k for k in _frames if isinstance(k, tuple) and k[:2] == stale]:
                    del _frames[key]
            seen = _graph_counter[full] = (ctx, itertools.count())
        n = next(seen[1])
    return ("frame", cid.frame_id, owner, n)


def note_compile(
    key: Hashable,
    name: str,
    specs: tuple[InputSpec, ...],
    cfg: NeuronConfig,
    *,
    specializing: bool = False,
) -> bool:
    """Record a static compile of frame ``key``; True if it is a recompile (warned about).

    Raises NC202 when the recompile is over ``cfg.max_recompiles`` or happens in strict mode
    after warm-up; nothing is recorded then, so the frame's count stays where it was.

    ``specializing``: a ShapeSpecializer's compile. Once Dynamo has an automatic-dynamic entry
    for a frame, every call reaches it, including the shapes a static compile of the frame
    covered; compiling one of those again, once, is not a recompile and spends no budget. (A
    specializer's own earlier shapes do count: a new specializer means Dynamo recompiled the
    frame for another guard.)
    """
    with _lock:
        frame = _frames.setdefault(key, _Frame(name))
        if specializing:
            for i, old in enumerate(frame.static):
                if not _changes(old, specs, None):
                    del frame.static[i]
                    log.info("%s: specializing again for shapes compiled before", name)
                    return False
        if not frame.history:
            frame.history.append(specs)
            if not specializing:
                frame.static.append(specs)
            return False
        why = diagnose(frame.history, specs, cfg.buckets)
        n = frame.recompiles + 1
        strict = cfg.strict_recompile and _warmup["done"]
        over = cfg.max_recompiles is not None and n > cfg.max_recompiles
        recorded = not strict and not over
        if recorded:
            frame.history.append(specs)
            if not specializing:
                frame.static.append(specs)
            frame.recompiles = n
            _events.append(f"{name}: {why}")
    what = f"{name}: new static compile for {why}"
    fix = _fix(frame.history[:-1] if recorded else frame.history, specs)
    if strict:
        raise RecompileLimitError(
            what,
            reason="strict_recompile is on and warm-up is over (neuron_compile.mark_warmup_done())"
            ", so every shape must already be compiled",
            hint=fix + ", or warm up every bucket before mark_warmup_done()",
            recompiles=n,
        )
    if over:
        raise RecompileLimitError(
            what,
            reason=f"recompile {n} of this frame exceeds max_recompiles={cfg.max_recompiles}; "
            "each recompile is a separate multi-minute Trainium compilation",
            hint=fix + ", or raise max_recompiles (NEURON_COMPILE_MAX_RECOMPILES)",
            recompiles=n,
        )
    if not _warmup["done"] and _warmup_compile(frame.history[:-1], specs, cfg.buckets):
        # What warm-up is for: one compile per bucket and mode, before mark_warmup_done().
        log.info("%s: warm-up compile for %s (recompile %d)", name, why, n)
        return True
    # Cut between changes, never inside one (a single long reason stays whole).
    short = (
        why if len(why) <= 100 or ", " not in why[:96] else why[:96].rsplit(", ", 1)[0] + ", ..."
    )
    warn(
        f"neuron-compile: recompiling for {short} (recompile {n} of {name}). Each recompile is "
        f"a separate Trainium compilation: {fix}.",
        RecompileWarning,
    )
    return True


def note_buckets(buckets: Sequence[int]) -> None:
    """Remember sizes the bucketing helpers pad to: a compile for one of them, during warm-up,
    is expected (logged, not warned about)."""
    with _lock:
        _known_buckets.update(int(b) for b in buckets)


def _warmup_compile(
    history: Sequence[tuple[InputSpec, ...]],
    new: tuple[InputSpec, ...],
    configured: Sequence[int] | None,
) -> bool:
    """Whether ``new`` is what a warm-up compiles: it differs from an earlier specialization
    only in tensor dims whose new sizes are buckets (``options={'buckets': ...}`` or ones the
    bucketing helpers padded to) and in grad mode (model.eval() under no_grad also drops
    BatchNorm's counter input)."""
    with _lock:
        buckets = set(configured or ()) | _known_buckets
    for old in history:
        before = {o.name: o for o in old}
        sizes: list[int] = []
        mode = False
        same_otherwise = True
        for n in new:
            o = before.get(n.name)
            if n.shape is not None and o is not None and o.shape is not None:
                if len(o.shape) != len(n.shape) or o.dtype != n.dtype:
                    same_otherwise = False
                sizes += [b for a, b in zip(o.shape, n.shape, strict=False) if a != b]
            elif n.shape is not None or (o is not None and o.shape is not None):
                same_otherwise = False  # a tensor input appeared, or one became a value
            elif o is not None and o.value != n.value and not _SIZE_SYMBOL.match(n.name):
                mode |= n.name == GRAD_MODE
                same_otherwise &= n.name == GRAD_MODE  # a flag, a Python number: not warm-up
        if same_otherwise and (sizes or mode) and all(size in buckets for size in sizes):
            return True
    return False


def mark_warmup_done(done: bool = True) -> None:
    """End warm-up: from now on, ``strict_recompile=True`` turns any recompile into NC202.

    Compile every bucket (one step per shape) first, then call this. ``reset_metrics()`` and
    ``mark_warmup_done(False)`` start a new warm-up.
    """
    _warmup["done"] = done


def recompiles() -> list[str]:
    """One line per recompile since the last ``reset_metrics()``: frame and what changed."""
    with _lock:
        return list(_events)


def reset_recompiles() -> None:
    """Forget every frame's compile history and recompile events; warm-up starts again."""
    with _lock:
        _frames.clear()
        _events.clear()
        _graph_counter.clear()
        _known_buckets.clear()
        _warmup["done"] = False
