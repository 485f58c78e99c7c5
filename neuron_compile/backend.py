"""The Dynamo entry point: ``torch.compile(model, backend="neuron")``.

Dynamo graph -> AOTAutograd (core ATen decompositions and ours, separate
forward / backward / inference compilers, boxed calling convention) -> ``compile_graph`` per graph.
Each frame publishes ``FrameStarted`` and ``FrameCompiled`` (events.py).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import re
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx

from . import events, registration
from .capture import decomposition_table, dropping_ignored_inputs, saving_random_ops
from .compiler import compile_graph
from .config import NeuronConfig, load_config
from .decompositions.functional import rewrite_functions
from .errors import DynamicShapeError, NeuronCompileError, through_dynamo
from .narrowing import user_name
from .saved import partition_with_link
from .saved_views import saving_parameters_for_views
from .shapes import (
    ShapeSpecializer,
    frame_key,
    input_specs,
    note_compile,
    requested_dynamic,
    symbolic_dims,
)
from .targets import get_target
from .warn_once import warn

log = logging.getLogger("neuron_compile")

_aot_ids = itertools.count()
_warned: set[str] = set()
_warn_lock = threading.Lock()


def _warn_once(key: str, message: str) -> None:
    with _warn_lock:
        if key in _warned:
            return
        _warned.add(key)
    warn(message)


def _frame_owner() -> tuple[str, torch.nn.Module | None]:
    """The module whose frame Dynamo is compiling (its class name and the module), else the
    function's name and None."""
    try:  # private API: degrade to a generic name if a torch release moves it
        from torch._dynamo.symbolic_convert import InstructionTranslator

        tx = InstructionTranslator.current_tx()
        f_locals, code = tx.f_locals, tx.f_code
    except Exception:
        return "graph", None
    # `self` for model.forward; `fn` for the wrapper Dynamo compiles around Module.__call__;
    # `args[0]` for a decorator's `wrapped_func(*args, **kwargs)` around a forward (Hugging Face
    # models), a code object every decorated model class shares.
    for value in f_locals.values():
        for item in value if isinstance(value, tuple) else (value,):
            if isinstance(item, torch.nn.Module):
                return type(item).__name__, item
    name = code.co_name
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name).strip("_") or "graph", None


def _identity(owner: torch.nn.Module | None) -> Any:
    """A key for ``owner``: a weak reference, equal for the same live module and never for a new
    one at a freed address (``id`` when the class forbids weak references)."""
    if owner is None:
        return None
    try:
        return weakref.ref(owner)
    except TypeError:
        return id(owner)


_LOCAL = re.compile(r"L\['(\w+)'\]$")


def _input_sources(gm: fx.GraphModule) -> list[str | None]:
    """Per Dynamo graph input, where it comes from in the user's code (``idx``,
    ``L['self']._modules['fc']._parameters['weight']``), when Dynamo recorded it."""
    names: list[str | None] = []
    for node in gm.graph.find_nodes(op="placeholder"):
        source = getattr(node.meta.get("grapharg"), "source", None)
        name = getattr(source, "name", None)
        name = name() if callable(name) else name
        local = _LOCAL.match(name) if isinstance(name, str) else None
        names.append(local.group(1) if local else name)
    return names


def _input_names(gm: fx.GraphModule) -> list[str]:
    """Names for recompile diagnoses: the user's name of each input (``x``, ``step``), the FX
    name of the sizes, strides and offsets of tensor inputs (size symbols such as ``s0``: the
    diagnosis skips them) and of inputs Dynamo recorded no source for."""
    nodes = gm.graph.find_nodes(op="placeholder")
    return [
        node.name if not source or _SIZE_SOURCE.search(source) else source
        for source, node in zip(_input_sources(gm), nodes, strict=True)
    ]


#: Sources of a tensor input's size, stride or storage offset (``L['x'].size()[0]``).
_SIZE_SOURCE = re.compile(r"\.(size|stride|storage_offset)\(\)")


def _symbolic_in_user_terms(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> list[str]:
    """``x dim 0 (s77)`` per dim that is still a symbol (a dim a guard pinned to one size, shown
    as ``8``, is static), and ``n (s3)`` per symbolic int input, in the user's names."""
    sources = _input_sources(gm)
    described = []
    for index, fx_name, dim, symbol in symbolic_dims(gm, example_inputs):
        source = sources[index] if index < len(sources) else None
        if symbol.lstrip("-").isdigit() or (dim is None and source and ".size()" in source):
            continue  # specialized, or the size of a tensor input listed by its dim
        name = user_name(source) if source else fx_name
        described.append(
            f"{name} dim {dim} ({symbol})" if dim is not None else f"{name} ({symbol})"
        )
    return described


def _errors_read_first(entry: Callable[..., Any]) -> Callable[..., Any]:
    """``entry`` with our errors leaving Dynamo as themselves, their message first and their
    traceback starting at ``entry`` (``errors.through_dynamo``)."""

    @functools.wraps(entry)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return entry(*args, **kwargs)
        except NeuronCompileError as err:
            tb = err.__traceback__  # this wrapper's frame, then entry's
            through_dynamo(err, tb.tb_next.tb_frame if tb is not None and tb.tb_next else None)
            raise

    return wrapper


def _label_user_inputs(fx_gm: fx.GraphModule, sources: list[str | None], kind: str) -> None:
    """Give AOTAutograd's placeholders that are plain user inputs (``primals_3``) the user's
    name for them (``meta["user_input"]``), for messages such as the 64-bit warning; in a
    backward graph the other inputs are activations the forward saved, and say so."""
    for node in fx_gm.graph.find_nodes(op="placeholder"):
        desc = node.meta.get("desc")
        index = getattr(desc, "idx", None) if type(desc).__name__ == "PlainAOTInput" else None
        if isinstance(index, int) and 0 <= index < len(sources) and sources[index]:
            node.meta["user_input"] = sources[index]
        elif kind == "backward" and desc is None:
            node.meta["user_input"] = f"%{node.name} (saved by the forward)"


def compile_frame(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    cfg: NeuronConfig,
    *,
    model: str,
    recompile: bool = False,
) -> Any:
    """Run AOTAutograd on one static Dynamo graph with our compilers for each resulting graph."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import default_partition

    aot_id = next(_aot_ids)
    frame_name = f"{model}_{aot_id}"
    started = events.FrameStarted(frame_name, model, gm, example_inputs, cfg, recompile)
    events.publish(started)
    cfg = started.cfg  # a subscriber may have replaced it (neuron-compile check's estimate)
    counters = dict.fromkeys(("forward", "backward", "inference"), 0)
    start = time.perf_counter()
    # aot_cache imports torch._inductor (over a second): only when a frame is compiled.
    from . import aot_cache

    cached = aot_cache.enabled(cfg)

    def next_name(kind: str) -> str:
        n = counters[kind]
        counters[kind] += 1
        return f"{frame_name}_{kind}_{n}"

    sources = _input_sources(gm)

    def compiler_for(kind: str):
        def compile_one(fx_gm: fx.GraphModule, inputs: Sequence[Any]) -> Any:
            _label_user_inputs(fx_gm, sources, kind)
            # The backward graph is traced together with the forward (joint graph): its capture
            # time is already in the forward's record.
            capture = 0.0 if kind == "backward" else time.perf_counter() - start

            # A backward compiles at its first call, after the frame: read the refusal now.
            refused = aot_cache.refused_reason() if cached else ""

            def compile_now(fx_key: str | None = None) -> Any:
                runner = compile_graph(
                    fx_gm,
                    inputs,
                    name=next_name(kind),
                    kind=kind,
                    cfg=cfg,
                    capture_s=capture,
                    recompile=recompile,
                    fx_key=fx_key,
                )
                runner.record.aot_cache_refused = refused
                return runner

            if not cached:
                return compile_now()
            if kind == "backward":  # compiled at its first call (aot_cache.defer)
                return aot_cache.defer(fx_gm, kind, cfg, compile_now)
            return aot_cache.wrap(compile_now(), fx_gm, kind, cfg)

        compile_one.__name__ = f"neuron_{kind}_compiler"
        # A backward compiles at loss.backward(), outside Dynamo: its errors need no disguise.
        return compile_one if kind == "backward" else _errors_read_first(compile_one)

    partition_fn = saving_random_ops(dropping_ignored_inputs(default_partition))
    if get_target(cfg.target).saves_parameters_for_views:
        partition_fn = saving_parameters_for_views(partition_fn, example_inputs)
    partition_fn = partition_with_link(partition_fn)
    fw_compiler: Any = compiler_for("forward")
    if cached:  # AOTAutogradCache stores and loads our OutputCode (aot_cache.py)
        from torch._functorch._aot_autograd.schemas import SerializableAOTDispatchCompiler

        partition_fn = aot_cache.partition_with_pair(partition_fn)
        fw_compiler = SerializableAOTDispatchCompiler(aot_cache.NeuronOutputCode, fw_compiler)
    compilers = dict(
        partition_fn=partition_fn,
        fw_compiler=fw_compiler,
        bw_compiler=compiler_for("backward"),
        inference_compiler=compiler_for("inference"),
        decompositions=decomposition_table(cfg.target),
    )
    rewrite_functions(gm)
    get_target(cfg.target).prepare_frame(gm, cfg)
    scope = (
        aot_cache.frame(cfg, next_name, start, recompile, example_inputs, gm=gm)
        if cached
        else contextlib.nullcontext()
    )
    with get_target(cfg.target).frame_routing(cfg), scope, _effect_tokens_inside_graphs():
        try:
            compiled = aot_autograd(**compilers)(gm, list(example_inputs))
        except AssertionError as e:
            if "set_ on a graph input" not in str(e):
                raise
            # `p.data = ...` beside other writes to p: AOTAutograd can only express the set_
            # inside the graph. The graph then writes its input (copy_, set_), which runs on
            # the CPU (a FallbackWarning names it), as aot_eager keeps it in its graph too.
            keep = aot_autograd(**compilers, keep_inference_input_mutations=True)
            compiled = keep(gm, list(example_inputs))
    done = events.FrameCompiled(frame_name, gm, compiled)
    events.publish(done)
    return done.compiled  # a subscriber may have wrapped it (neuron-compile check's run mode)


def _effect_tokens_inside_graphs() -> contextlib.AbstractContextManager:
    """Trace effectful ops (``_linalg_check_errors``, ``print``) with their effect tokens made
    and consumed inside the graph (``prims._make_token``/``_sink_tokens``), as Inductor does.

    Otherwise AOTAutograd lifts the tokens to graph inputs and outputs and wraps the compiled
    graph in an ``EffectTokensWrapper`` that adds and strips them on each call; its cache-hit path
    rebuilds every wrapper but that one (it assumes Inductor's unlifted graphs), so a warm start
    would call the graph without its token: a different calling convention than the one compiled.
    With unlifted tokens both paths call the graph alike (aot_cache also refuses any entry whose
    graph takes a token, as a guard)."""
    import torch._functorch.config as functorch_config

    return functorch_config.patch(unlift_effect_tokens=True)


def _run_nested_eagerly(
    gm: fx.GraphModule, model: str, nested: list[str], cfg: NeuronConfig
) -> Any:
    """A frame with nested-tensor inputs runs eagerly (one FallbackWarning), or NC201 with
    ``fallback="error"``."""
    from .fallback import FallbackWarning

    what = f"nested (ragged) tensor input {', '.join(nested)}"
    hint = (
        "pad it to a dense tensor before the compiled code (nested.to_padded_tensor(0.0, "
        "output_size=...)) with one of a few fixed sizes (neuron_compile.bucketing)"
    )
    if cfg.fallback == "error":
        raise DynamicShapeError(
            f"{model}: {what}", reason="Trainium graphs need every dimension static", hint=hint
        )
    warn(
        f"neuron-compile: {model} runs eagerly on the CPU: {what} has no static shape; {hint}",
        FallbackWarning,
    )
    return gm.forward


@_errors_read_first
def neuron_backend(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    options: dict[str, Any] | None = None,
    mode: str | None = None,
) -> Any:
    """Dynamo backend registered as ``neuron`` and ``neuron_compile``."""
    cfg = load_config(options)
    owner_name, owner = _frame_owner()
    model = cfg.model_name or owner_name
    # Recompiles are counted per frame and module: two models through one shared code object
    # (a decorator's wrapper) are two first compiles, though Dynamo recompiles that code.
    frame = frame_key(_identity(owner))
    registration.warn_if_name_clash()
    if mode not in (None, "default"):
        _warn_once(
            f"mode:{mode}",
            f"neuron-compile ignores mode={mode!r}: Trainium compilation has one mode; "
            "tune with options instead (see docs/options.md)",
        )
    names = _input_names(gm)
    # Nested (ragged) tensors have shapes no static graph can take.
    nested = [
        names[i] if i < len(names) else f"input {i}"
        for i, x in enumerate(example_inputs)
        if isinstance(x, torch.Tensor) and x.is_nested
    ]
    if nested:
        return _run_nested_eagerly(gm, model, nested, cfg)
    symbolic = _symbolic_in_user_terms(gm, example_inputs)
    if symbolic:  # else every symbolic dim was pinned to one size: a static graph
        requested = requested_dynamic(gm, example_inputs, ", ".join(symbolic))
        if requested is not None:
            import torch._dynamo.config as dynamo_config

            # dynamic=True patches assume_static_by_default=False around the frame's compile
            asked = (
                "torch._dynamo.mark_dynamic"
                if dynamo_config.assume_static_by_default
                else "torch.compile(dynamic=True)"
            )
            raise DynamicShapeError(
                f"dynamic shapes are not supported ({asked} made {', '.join(symbolic)} symbolic)",
                reason="Trainium's compiler needs every dimension static",
                hint="use torch.compile(..., dynamic=False), do not call "
                "torch._dynamo.mark_dynamic, and pad variable dimensions to a few fixed sizes "
                "(bucketing) so each size compiles once",
            )
        # Automatic dynamic (dynamic=None, a second shape seen): compile one static graph per
        # concrete shape instead of failing a user who simply called the model twice.
        log.info(
            "automatic dynamic shapes: specializing per concrete shape (%s)", ", ".join(symbolic)
        )
        return ShapeSpecializer(
            gm,
            cfg,
            functools.partial(compile_frame, model=model),
            frame_key=frame,
            frame_name=model,
            input_names=names,
        )
    # A static graph: Dynamo's first compile of this frame, or a recompile (dynamic=False meeting
    # a new shape, or another guard failing), counted and checked against the budget.
    recompile = note_compile(frame, model, input_specs(names, example_inputs), cfg)
    return compile_frame(gm, example_inputs, cfg, model=model, recompile=recompile)
