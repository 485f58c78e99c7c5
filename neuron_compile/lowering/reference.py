"""Lower an op by tracing a PyTorch reference implementation and lowering that graph in place.

Used where an op has no StableHLO rule of its own on a target: the ops that stand for neuronx-cc
kernels (their reference is what XLA CPU runs), user NKI kernels (their reference PyTorch
function), and ATen ops we keep whole for trn targets (their PyTorch decomposition). The traced
graph goes through the same decomposition table and rules as everything else, so the CPU checks
exactly the math that stands behind each call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable
from typing import Any

import torch
import torch.fx as fx
from torch._guards import detect_fake_mode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..errors import LoweringError, UnsupportedOpError
from .context import LoweringContext

#: Traced references by (function, argument types and constants): a graph lowers the same kernel
#: op many times (every layer), and tracing costs milliseconds while lowering its graph does not.
_TRACES: dict[Hashable, fx.GraphModule] = {}
_MAX_TRACES = 512


def _trace_key(fn: Callable[..., Any], leaves: list[Any], spec: Any) -> Hashable | None:
    parts: list[Any] = [fn, str(spec)]
    for leaf in leaves:
        if isinstance(leaf, fx.Node):
            val = leaf.meta.get("val")
            if not isinstance(val, torch.Tensor):
                return None
            parts.append(("tensor", tuple(val.shape), val.dtype, val.device))
        else:
            parts.append((type(leaf), leaf))
    key = tuple(parts)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def trace_reference(node: fx.Node, fn: Callable[..., Any]) -> fx.GraphModule:
    """``fn`` called with ``node``'s arguments, traced to core ATen on the nodes' fake values."""
    leaves, spec = tree_flatten((node.args, node.kwargs))
    key = _trace_key(fn, leaves, spec)
    cached = _TRACES.get(key) if key is not None else None
    if cached is not None:
        return cached
    traced = _trace(fn, leaves, spec)
    if key is not None:
        if len(_TRACES) >= _MAX_TRACES:
            _TRACES.clear()
        _TRACES[key] = traced
    return traced


def _trace(fn: Callable[..., Any], leaves: list[Any], spec: Any) -> fx.GraphModule:
    from ..capture import decomposition_table

    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, fx.Node)]
    fakes = [leaves[i].meta["val"] for i in positions]

    def call(*tensors: Any) -> Any:
        filled = list(leaves)
        for i, t in zip(positions, tensors, strict=True):
            filled[i] = t
        args, kwargs = tree_unflatten(filled, spec)
        return fn(*args, **kwargs)

    mode = detect_fake_mode(fakes)
    with mode if mode is not None else contextlib.nullcontext():
        return make_fx(call, decomposition_table=decomposition_table())(*fakes)


def lower_reference(ctx: LoweringContext, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Emit ``fn``'s traced graph at ``ctx.node``; ``args``/``kwargs`` are the rule's (Values
    where the node has tensors). Returns what the node's rule must return."""
    from .lower_graph import lower_node

    node = ctx.node
    try:
        sub = trace_reference(node, fn)
    except Exception as e:
        raise LoweringError(
            f"could not trace the reference implementation {getattr(fn, '__qualname__', fn)}: "
            f"{type(e).__name__}: {e}",
            node=node,
            hint="the reference must be written with torch operations that work on fake tensors",
        ) from e
    values = [leaf for leaf in tree_flatten((args, kwargs))[0] if not _is_python_value(leaf)]
    env: dict[fx.Node, Any] = {}
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(values):
        raise LoweringError(
            f"reference takes {len(placeholders)} tensors, the node passes {len(values)}",
            node=node,
        )
    env.update(zip(placeholders, values, strict=True))
    for sub_node in sub.graph.nodes:
        if sub_node.op == "call_function":
            try:
                env[sub_node] = lower_node(ctx.emit, sub_node, env, ctx.module)
            except UnsupportedOpError as e:
                raise UnsupportedOpError(
                    f"the reference of {node.target} uses an op without a lowering",
                    node=node,
                    reason=f"{e.what}: {e.reason}" if e.reason else e.what,
                    hint=e.hint,
                ) from e
        elif sub_node.op == "get_attr":
            raise LoweringError(
                "the reference implementation creates a tensor constant; build constants with "
                "torch.full/arange inside the function instead",
                node=node,
            )
        elif sub_node.op == "output":
            return fx.node.map_arg(sub_node.args[0], lambda n: env[n])
    raise LoweringError("reference graph has no output", node=node)


def _is_python_value(leaf: Any) -> bool:
    from .emit import Value

    return not isinstance(leaf, Value)
