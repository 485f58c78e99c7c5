"""collapse_casts: shorten dtype-cast chains where the middle cast cannot change a value.

Under autocast, AOTAutograd graphs chain ``_to_copy``/``prims.convert_element_type`` casts
(``bf16 -> f32 -> f16``, ``f16 -> f32 -> f16``). Rounding is what a cast *does*, so only exact
widenings are collapsed.

Requires: ``meta["val"]`` on the source of each chain (its dtype decides exactness).
Guarantees: ``cast(cast(x, A), B)`` becomes ``cast(x, B)`` only if ``A`` holds every value of
``x``'s dtype exactly (``f16``/``bf16 -> f32``, ``f32 -> f64``, ``int8 -> int32``, ``bool ->``
anything, ...: see ``_EXACT``); ``f32 -> bf16 -> f32`` rounds and stays. If ``B`` is ``x``'s
dtype the outer cast is dropped too (``x`` is read directly), unless that would make a graph
output alias a graph input or another output. Only when the inner cast has no other users
(otherwise the rewrite would add a cast), and never when the graph writes to any tensor of the
chain (a cast is then a real snapshot). A cast to the same dtype alone is ``remove_noops``' job.
Ops with effects (``effects.has_effects``) are never part of a chain.
"""

from __future__ import annotations

import logging

import torch
import torch.fx as fx

from .effects import alias_root, has_effects, mutated_roots, without_effects
from .graph_queries import can_replace_output, nodes_calling

log = logging.getLogger(__name__)

aten = torch.ops.aten
prims = torch.ops.prims

_INTS = (torch.int8, torch.int16, torch.int32, torch.int64)
#: dtype -> the dtypes that represent each of its values exactly (besides itself)
_EXACT: dict[torch.dtype, set[torch.dtype]] = {
    torch.bool: {torch.uint8, *_INTS, torch.float16, torch.bfloat16, torch.float32, torch.float64},
    torch.uint8: {*_INTS[1:], torch.float16, torch.bfloat16, torch.float32, torch.float64},
    torch.int8: {*_INTS[1:], torch.float16, torch.bfloat16, torch.float32, torch.float64},
    torch.int16: {torch.int32, torch.int64, torch.float32, torch.float64},
    torch.int32: {torch.int64, torch.float64},
    torch.float16: {torch.float32, torch.float64},
    torch.bfloat16: {torch.float32, torch.float64},
    torch.float32: {torch.float64},
}
_CASTS = (aten._to_copy.default, prims.convert_element_type.default)
# ``_to_copy`` kwargs that a pure dtype cast may carry; anything else (pin_memory,
# memory_format) makes it more than a cast.
_TO_COPY_KWARGS = {"dtype", "layout", "device", "non_blocking"}


def is_exact(src: torch.dtype, mid: torch.dtype) -> bool:
    """True if casting ``src`` to ``mid`` never changes a value."""
    return src == mid or mid in _EXACT.get(src, set())


def _dtype_of(node: fx.Node) -> torch.dtype | None:
    val = node.meta.get("val")
    return val.dtype if isinstance(val, torch.Tensor) else None


def _cast(node: fx.Node) -> tuple[fx.Node, torch.dtype] | None:
    """``(source, dtype)`` if ``node`` is a pure dtype cast, else None."""
    if node.op != "call_function" or not node.args or not isinstance(node.args[0], fx.Node):
        return None
    src = node.args[0]
    if node.target is prims.convert_element_type.default and len(node.args) == 2:
        dtype = node.args[1]
        return (src, dtype) if isinstance(dtype, torch.dtype) else None
    if node.target is not aten._to_copy.default or len(node.args) != 1:
        return None
    kwargs = node.kwargs
    dtype = kwargs.get("dtype")
    if not isinstance(dtype, torch.dtype) or set(kwargs) - _TO_COPY_KWARGS:
        return None
    if kwargs.get("layout") not in (None, torch.strided):
        return None
    src_val = src.meta.get("val")
    device = kwargs.get("device")
    if device is not None and (
        not isinstance(src_val, torch.Tensor) or torch.device(device) != src_val.device
    ):
        return None
    return src, dtype


def collapse_casts(gm: fx.GraphModule) -> bool:
    graph = gm.graph
    written = mutated_roots(graph)
    collapsed = dropped = 0
    for node in nodes_calling(graph, without_effects(_CASTS)):
        outer = _cast(node)
        if outer is None:
            continue
        inner_node, _ = outer
        inner = None if has_effects(inner_node) else _cast(inner_node)
        if inner is None or len(inner_node.users) != 1:
            continue
        x, mid = inner
        src = _dtype_of(x)
        if src is None or not is_exact(src, mid):
            continue
        if any(alias_root(n) in written for n in (node, inner_node, x)):
            continue
        if outer[1] == src and can_replace_output(node, x):
            node.replace_all_uses_with(x)
            graph.erase_node(node)
            dropped += 1
        else:
            node.replace_input_with(inner_node, x)
            collapsed += 1
        graph.erase_node(inner_node)
    log.debug("collapse_casts: collapsed %d cast pairs, dropped %d round trips", collapsed, dropped)
    return collapsed + dropped > 0
