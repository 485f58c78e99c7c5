"""Translate one AOTAutograd FX graph into a StableHLO module (text) plus its calling plan.

The plan says how runtime tensors map onto ``@main``'s arguments (unused inputs are not passed,
64-bit inputs are narrowed) and how its results map back onto the graph's outputs (``None``
gradients, outputs that are graph inputs, 64-bit outputs widened back).
"""

from __future__ import annotations

import bisect
import operator
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx
from torch._prims_common import is_non_overlapping_and_dense_or_false
from torch.utils._python_dispatch import _disable_current_modes

from ..collectives import reachable_ranks, world
from ..errors import BUG_HINT, LoweringError, UnsupportedOpError, user_frame
from ..narrowing import describe, widens
from . import registry
from .context import (
    CollectiveInfo,
    LoweringContext,
    ModuleContext,
    canonical_dtype,
    tensor_type,
)
from .emit import Emitter, TensorType, Value

if TYPE_CHECKING:
    from ..targets import Target

#: InputSpec.index of the per-call RNG seed (see lowering/stablehlo/random.py)
RNG_SEED = -2

#: ``get_attr`` tensors up to this many elements become inline ``stablehlo.constant``s instead
#: of ``@main`` arguments: no per-call transfer, and the values are part of the module text (and
#: so of the cache key). Bigger ones stay arguments so artifacts stay small.
INLINE_CONSTANT_MAX_ELEMENTS = 1024

_INLINE_DTYPES = {
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
}


def is_inline_constant(tensor: torch.Tensor) -> bool:
    """True if ``lower_graph`` emits this ``get_attr`` value inline rather than as an argument."""
    return (
        isinstance(tensor, torch.Tensor)
        and tensor.dtype in _INLINE_DTYPES
        and tensor.layout == torch.strided
        and tensor.numel() <= INLINE_CONSTANT_MAX_ELEMENTS
    )


def _inline_constant(emitter: Emitter, tensor: torch.Tensor, ttype: TensorType) -> Value:
    # Lowering runs inside AOTAutograd's compiler callback, where FakeTensorMode is active: leave
    # it, or the conversions below would produce a fake tensor without data.
    with _disable_current_modes():
        value = tensor.detach().cpu().to(ttype.dtype)
        if value.dtype in (torch.float16, torch.bfloat16):
            value = value.float()  # numpy has no bfloat16; f32 holds every value exactly
        array = value.numpy()
    if array.size == 0:
        return emitter.full(0, ttype.shape, ttype.dtype)
    return emitter.constant(array, ttype)


def is_effect_token(placeholder: fx.Node) -> bool:
    """A graph input that only threads AOTAutograd's effect token through ``with_effects``."""
    users = placeholder.users
    return bool(users) and all(u.target is torch.ops.higher_order.with_effects for u in users)


@dataclass(frozen=True)
class InputSpec:
    """One ``@main`` argument: graph input ``index``, a ``get_attr`` constant ``attr``, or the
    per-call RNG seed (``index == RNG_SEED``)."""

    index: int
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype  # the dtype the caller passes
    arg_dtype: torch.dtype  # the dtype @main takes (after the 64-bit policy)
    attr: str | None = None


#: ``GraphModule.meta`` key: how many leading outputs the caller sees as they are (a forward's
#: user outputs, before its saved activations); absent: all of them. Among those, an output that
#: eager returns as a view of another output or of an input is returned as that view.
USER_OUTPUTS = "neuron_user_outputs"


@dataclass(frozen=True)
class OutputSpec:
    """How graph output ``i`` is produced: ``kind`` is result | input | none | const, empty (a
    fresh torch tensor of shape ``value`` with no elements), or result_view | input_view: a view
    of result ``index`` (or of graph input ``index``) with ``value = (size, storage offset from
    the base's)`` and strides ``stride``, so that outputs eager returns aliased stay aliased (an
    in-place edit of one shows in the other). Their own result is still computed: the module
    does not depend on the aliasing."""

    kind: str
    index: int = -1  # result index into @main's results, or graph-input index
    dtype: torch.dtype | None = None  # the dtype the caller expects (results only)
    value: Any = None  # kind == "const"; (size, offset) for views
    #: Eager's strides of a result when they are not its shape's contiguous ones (a permuted
    #: input's layout kept by elementwise ops, channels_last): the caller gets them, or the next
    #: compiled frame's stride guards fail and Dynamo recompiles it.
    stride: tuple[int, ...] | None = None


@dataclass
class LoweredGraph:
    text: str
    inputs: list[InputSpec]
    outputs: list[OutputSpec]
    num_results: int
    downcasts: list[str] = field(default_factory=list)  # "name: float64 -> float32"
    emitter: Emitter | None = None
    module: ModuleContext | None = None

    @property
    def custom_calls(self) -> list[str]:
        """Custom-call targets in the module, in emission order."""
        return list(self.module.custom_call_targets) if self.module is not None else []

    @property
    def collectives(self) -> list[CollectiveInfo]:
        """Collectives in the module, in emission order (channel handles 1, 2, ...)."""
        return list(self.module.collectives) if self.module is not None else []

    @property
    def num_replicas(self) -> int:
        """Ranks the module runs on (1 without collectives)."""
        return self.module.num_replicas if self.module is not None else 1

    @property
    def reachable_ranks(self) -> tuple[int, ...]:
        """The ranks this rank's collectives exchange data with (``collectives.reachable_ranks``;
        empty without collectives)."""
        partitions = [c.replica_groups for c in self.collectives]
        return reachable_ranks(partitions, world()[0]) if partitions else ()

    def node_at_line(self, line: int) -> fx.Node | None:
        """FX node that emitted 1-based ``line`` of ``text`` (for verifier errors)."""
        if self.emitter is None:
            return None
        # A line inside an op's regions (a reduction body) belongs to the op that starts above it.
        index = line - self.emitter.body_line_offset()
        starts = sorted(self.emitter.line_nodes)
        at = bisect.bisect_right(starts, index) - 1
        if at < 0 or index >= self.emitter.body_lines:
            return None
        return self.emitter.line_nodes[starts[at]]


def _check_result(node: fx.Node, produced: list[Value | None]) -> None:
    """Inductor's validate_ir: each rule must produce exactly the types the FX metadata promises."""
    val = node.meta.get("val")
    expected = list(val) if isinstance(val, (tuple, list)) else [val]
    if len(expected) != len(produced):
        raise LoweringError(
            f"rule produced {len(produced)} results, the graph expects {len(expected)}",
            node=node,
            hint=BUG_HINT,
        )
    for i, (want, got) in enumerate(zip(expected, produced, strict=True)):
        if not isinstance(want, torch.Tensor) or got is None:
            continue
        if tensor_type(want) != got.type:
            raise LoweringError(
                f"result {i} has type {got.type}, the graph expects {tensor_type(want)}",
                node=node,
                hint=BUG_HINT,
            )


def _empty_result(node: fx.Node) -> list[TensorType] | None:
    """The types of ``node``'s results when every one is a tensor without elements (one tensor,
    or a tuple such as ``cummax``'s values and indices), else None.

    Such a result has no values, only the shape and dtype the graph's metadata (eager's meta
    kernel) gives it, so it lowers to an empty constant of that type whatever the op. Rules then
    never see zero-size edge cases where eager's shape rules are peculiar: ``_trilinear`` makes
    a dimension every input expands of size 0, not 1; ``unfold(0, 0, 1)`` of a 0-d tensor is a
    ``(0,)`` tensor. Random ops keep their rules (they thread the seed through the graph), and
    so do effectful ones: a collective on an empty tensor is still a collective, never dropped.
    """
    val = node.meta.get("val")
    vals = list(val) if isinstance(val, (tuple, list)) else [val]
    if not vals or not all(isinstance(v, torch.Tensor) and v.numel() == 0 for v in vals):
        return None
    from ..passes.effects import has_effects, is_random, mutates  # lazy: passes import lowering

    if is_random(node) or has_effects(node) or mutates(node):
        return None
    return [tensor_type(v) for v in vals]


def lower_node(
    emitter: Emitter, node: fx.Node, env: dict[fx.Node, Any], module: ModuleContext
) -> Any:
    """Lower one ``call_function`` node whose inputs are already in ``env``."""
    if node.target is operator.getitem:
        seq, idx = node.args
        return env[seq][idx]
    keys = module.target.lowering_keys if module.target is not None else ()
    entry = registry.lookup(node, keys)
    if isinstance(entry, str):
        raise UnsupportedOpError(
            f"cannot lower {node.target}",
            node=node,
            reason=entry,
            hint="rewrite the model to avoid the op, or report it so a lowering can be added "
            "(CPU fallback for unsupported ops is tracked in the op-coverage issue)",
        )
    empty = _empty_result(node)
    if empty is not None:
        results = [emitter.full(0, t.shape, t.dtype) for t in empty]
        return results if isinstance(node.meta["val"], (tuple, list)) else results[0]
    args = fx.node.map_arg(node.args, lambda n: env[n])
    kwargs = fx.node.map_arg(node.kwargs, lambda n: env[n])
    ctx = LoweringContext(emitter, node, module)
    try:
        result = entry.rule(ctx, *args, **kwargs)
    except (UnsupportedOpError, LoweringError):
        raise
    except Exception as e:
        raise LoweringError(
            f"lowering rule {entry.rule.__qualname__} failed: {type(e).__name__}: {e}",
            node=node,
            hint=BUG_HINT,
        ) from e
    produced = list(result) if isinstance(result, (tuple, list)) else [result]
    _check_result(node, produced)
    return result


def lower_graph(
    gm: fx.GraphModule,
    func_name: str = "main",
    *,
    target: Target | None = None,
    lnc: int | None = None,
) -> LoweredGraph:
    """Lower ``gm`` (ATen IR with ``meta["val"]`` on every node) to StableHLO text for
    ``target`` (None: the cpu target, reference rules only).

    A target's own forms (``Target.lowering_keys``: e.g. ``AwsNeuron*`` custom calls for
    neuronx-cc) win over the reference rules; ``lnc`` is the logical-core config its kernels
    are specialised for.
    """
    emitter = Emitter()
    module = ModuleContext(target=target, lnc=lnc)
    env: dict[fx.Node, Any] = {}
    inputs: list[InputSpec] = []
    downcasts: list[str] = []
    wide: dict[torch.dtype, list[fx.Node]] = {}  # ops that make 64-bit values (run narrowed)
    placeholder_index: dict[fx.Node, int] = {}
    n_placeholders = 0

    for node in gm.graph.nodes:
        emitter.current_node = node
        if node.op == "placeholder":
            placeholder_index[node] = n_placeholders
            n_placeholders += 1
            val = node.meta.get("val")
            if all(user.op == "output" for user in node.users):
                # Unused, or only returned as is (the output plan hands the caller's tensor
                # back): never transferred, which saves a dlpack round trip per call.
                continue
            if is_effect_token(node):
                # An effect token (threaded through _linalg_check_errors): AOTAutograd passes
                # None at runtime and the token carries no data, so it is never transferred.
                env[node] = emitter.full(0, tensor_type(val).shape, tensor_type(val).dtype)
                continue
            if not isinstance(val, torch.Tensor):
                raise UnsupportedOpError(
                    f"graph input {node.name} is a {type(val).__name__}, not a tensor",
                    node=node,
                    hint="pass numbers as tensors, or compile with dynamic=False",
                )
            ttype = tensor_type(val)
            if ttype.dtype != val.dtype:
                label = node.meta.get("user_input")  # backend._label_user_inputs
                position = placeholder_index[node]
                downcasts.append(describe(node, label, position, val.dtype, ttype.dtype))
            env[node] = emitter.arg(ttype)
            inputs.append(
                InputSpec(placeholder_index[node], node.name, ttype.shape, val.dtype, ttype.dtype)
            )
        elif node.op == "get_attr":
            tensor = getattr(gm, node.target)
            ttype = TensorType(tuple(tensor.shape), canonical_dtype(tensor.dtype))
            if is_inline_constant(tensor):
                env[node] = _inline_constant(emitter, tensor, ttype)
                continue
            env[node] = emitter.arg(ttype)
            inputs.append(
                InputSpec(-1, node.name, ttype.shape, tensor.dtype, ttype.dtype, attr=node.target)
            )
        elif node.op == "call_function":
            env[node] = lower_node(emitter, node, env, module)
            if (dtype := widens(node)) is not None:
                wide.setdefault(dtype, []).append(node)
        elif node.op == "output":
            emitter.current_node = None
            for dtype, nodes in wide.items():  # inputs are listed by name above
                downcasts.append(
                    f"{len(nodes)} op(s) computing {str(dtype).removeprefix('torch.')}, the first "
                    f"at {os.path.basename(user_frame(nodes[0]))}: {dtype} -> "
                    f"{canonical_dtype(dtype)}"
                )
            if module.rng_arg_index is not None:
                seed = emitter.args[module.rng_arg_index]
                spec = InputSpec(RNG_SEED, "rng_seed", seed.shape, seed.dtype, seed.dtype)
                inputs.insert(module.rng_arg_index, spec)
            outputs, results = _plan_outputs(
                node, env, placeholder_index, gm.meta.get(USER_OUTPUTS)
            )
            text = emitter.module_text(results, func_name, _module_attributes(module))
            return LoweredGraph(text, inputs, outputs, len(results), downcasts, emitter, module)
        else:
            raise UnsupportedOpError(f"FX node kind {node.op!r} is not supported", node=node)
    raise LoweringError("graph has no output node", hint=BUG_HINT)


def _module_attributes(module: ModuleContext) -> str:
    """A module with collectives states the replicas it runs on (XLA's HloModuleConfig reads
    them; every rank's module is the same text); others keep no attributes."""
    if not module.collectives:
        return ""
    return f"mhlo.num_partitions = 1 : i32, mhlo.num_replicas = {module.num_replicas} : i32"


def _layout(val: torch.Tensor) -> tuple[int, ...] | None:
    """``val``'s strides when a caller can tell them from contiguous ones, else None."""
    stride = val.stride()
    if val.numel() <= 1 or not all(isinstance(s, int) for s in (*stride, *val.shape)):
        return None
    if torch._debug_has_internal_overlap(val) == 1:
        return None  # a self-overlapping view (expand, as_strided): no copy can write it
    return None if val.is_contiguous() else tuple(stride)


def _broadcast_layout(val: torch.Tensor) -> tuple[int, ...] | None:
    """The strides of an expanded (broadcast) ``val``, stride 0 in its broadcast dims, when the
    rest is dense (``x.sum(0, keepdim=True).expand(3, 4)``: ``(0, 1)``); else None. The caller
    gets eager's layout: the values along the broadcast dims share one element."""
    stride, shape = val.stride(), val.shape
    if (
        val.numel() <= 1
        or 0 not in stride
        or not all(isinstance(v, int) for v in (*stride, *shape))
    ):
        return None
    rest = torch.empty_strided(  # the broadcast dims at size 1: dense?
        [1 if step == 0 else size for size, step in zip(shape, stride, strict=True)],
        stride,
        device="meta",
    )
    if not is_non_overlapping_and_dense_or_false(rest):
        return None
    return tuple(stride)


def _storage(val: Any) -> Any:
    """A key for ``val``'s storage (views share it), or None for a non-tensor or no storage."""
    from torch.multiprocessing.reductions import StorageWeakRef

    if not isinstance(val, torch.Tensor) or val.layout != torch.strided:
        return None
    return StorageWeakRef(val.untyped_storage())


def _spans_storage(val: Any) -> bool:
    """``val`` is its whole storage: offset 0, dense, as many bytes as the storage. (Fake tensors
    of multi-output views such as ``split`` do not say ``_is_view()``: the geometry does.)"""
    if _storage(val) is None or val.storage_offset() != 0 or val.numel() == 0:
        return False
    if not all(isinstance(v, int) for v in (*val.shape, *val.stride())):
        return False
    dense = val.is_contiguous() or _layout(val) is not None
    return dense and val.numel() * val.element_size() == val.untyped_storage().nbytes()


def _as_view(val: torch.Tensor, base: tuple[str, int, torch.Tensor] | None) -> OutputSpec | None:
    """``val`` as a view of ``base`` (kind, index, base value), if eager's ``val`` is one."""
    if base is None or base[2].dtype != val.dtype:
        return None  # a dtype-changing view (x.view(torch.int32)) cannot be rebuilt by as_strided
    kind, index, base_val = base
    offset = val.storage_offset() - base_val.storage_offset()
    geometry = (*val.shape, *val.stride(), offset)
    if not all(isinstance(v, int) for v in geometry):
        return None
    return OutputSpec(f"{kind}_view", index, val.dtype, (tuple(val.shape), offset), val.stride())


def _plan_outputs(
    node: fx.Node,
    env: dict[fx.Node, Any],
    placeholder_index: dict[fx.Node, int],
    user_outputs: int | None = None,
) -> tuple[list[OutputSpec], list[Value]]:
    (outs,) = node.args
    flat = list(outs) if isinstance(outs, (tuple, list)) else [outs]
    specs: list[OutputSpec] = []
    results: list[Value] = []
    # Storages the caller's outputs may view: the graph's inputs, then each user output that is
    # a fresh tensor (not itself a view, so its result spans the whole storage).
    bases: dict[Any, tuple[str, int, torch.Tensor]] = {}
    for ph, index in placeholder_index.items():
        if (key := _storage(ph.meta.get("val"))) is not None:
            bases.setdefault(key, ("input", index, ph.meta["val"]))
    n_user = len(flat) if user_outputs is None else user_outputs
    # A node returned twice (AOTAutograd returns an output that backward also needs both as a
    # user output and as a saved tensor) is one result: both slots then get the same tensor, so
    # an in-place edit of the output bumps the saved tensor's version and autograd objects, as
    # in eager; two copies would silently differentiate the stale value.
    result_of: dict[fx.Node, int] = {}

    def result(out: fx.Node) -> int:
        if out not in result_of:
            result_of[out] = len(results)
            results.append(env[out])
        return result_of[out]

    # A user output spanning its whole storage is the base of every other output viewing that
    # storage, wherever it stands among the outputs (``y[1], y``; ``y.t()[0], y``). A node that
    # is no view op comes first: with ``y.t(), y`` the caller's ``y`` must not be a view, or
    # autograd refuses in-place edits of the view AOTAutograd rebuilds from it (fake tensors do
    # not say ``_is_view()`` here, so the graph does).
    from ..passes.effects import alias_root  # lazy: passes import lowering

    spanning: dict[Any, fx.Node] = {}
    for out in flat[:n_user]:
        if (
            isinstance(out, fx.Node)
            and out.op != "placeholder"
            and _spans_storage(val := out.meta.get("val"))
        ):
            key = _storage(val)
            if key not in spanning or alias_root(spanning[key]) is not spanning[key]:
                spanning[key] = out
    for pos, out in enumerate(flat):
        if out is None:
            specs.append(OutputSpec("none"))
        elif isinstance(out, fx.Node) and out.op == "placeholder":
            # Returning a graph input: hand the caller's tensor back instead of a copy.
            specs.append(OutputSpec("input", placeholder_index[out]))
        elif isinstance(out, fx.Node):
            val = out.meta.get("val")
            if not isinstance(val, torch.Tensor):
                specs.append(OutputSpec("const", value=val))
                continue
            index = result(out)
            key = _storage(val) if pos < n_user else None
            if key is not None and key not in bases and (owner := spanning.get(key)) is not None:
                bases[key] = ("result", result(owner), owner.meta["val"])
            base = bases.get(key) if key is not None else None
            if base is not None and base[:2] == ("result", index):
                base = None  # the base itself, or the same node returned twice: one tensor
            if (view := _as_view(val, base)) is not None:
                specs.append(view)
                continue
            if pos < n_user and isinstance(val.numel(), int) and val.numel() == 0:
                # A fresh torch tensor per call: executor buffers cannot be resized, and an
                # empty tensor is mostly made to be (``out=``) after the frame.
                specs.append(OutputSpec("empty", -1, val.dtype, tuple(val.shape)))
                continue
            layout = _layout(val) or _broadcast_layout(val)
            specs.append(OutputSpec("result", index, val.dtype, stride=layout))
        else:
            specs.append(OutputSpec("const", value=out))
    return specs, results
