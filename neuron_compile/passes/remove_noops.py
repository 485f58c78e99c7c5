"""remove_noops: drop ops that compute nothing in a functional graph.

Requires: a functionalized ATen graph (AOTAutograd output), ``meta["val"]`` on every node.
Guarantees: every removed node's users read its input instead. Removed: ``alias``/``detach``
and same-shape ``view``/``reshape``/``_unsafe_view``/``expand``; ``clone``/``lift_fresh_copy``,
``_to_copy`` and ``prims.convert_element_type`` that change neither shape, dtype, device, layout
nor strides (memory format), of a value that is not a lazily conjugated or negated view
(copying one resolves the conj/neg bit: ``view_as_real`` needs it resolved). Copies stay whenever
the graph writes to the copy or to its source (directly or through a view), since then the copy
is a real snapshot. Graph outputs keep their identity: a no-op is kept if dropping it would make
an output the same object as a graph input (returning the input itself would make the caller's
output alias its argument), and a copy is kept if dropping it would make two outputs one object
or an output a view of a graph input. An ``alias`` of another output is dropped on purpose:
AOTAutograd returns ``(y, alias(y))`` when ``y`` is both a user output and a saved activation,
and returning one tensor twice is what lets autograd see an in-place edit of ``y``.
Ops with effects (``effects.has_effects``) are never removed; a copy a collective writes into
(``all_reduce_``) is a write like any other and stays.
"""

from __future__ import annotations

import logging

import torch
import torch.fx as fx

from .effects import alias_root, mutated_roots, without_effects
from .graph_queries import feeds_output, nodes_calling

log = logging.getLogger(__name__)

aten = torch.ops.aten
prims = torch.ops.prims

# Views of the whole input: removing them never changes which storage users see.
_VIEWS = {
    aten.alias.default,
    aten.detach.default,
    aten.view.default,
    aten._unsafe_view.default,
    aten.reshape.default,
    aten.expand.default,
}
# Copies: no-ops only while nobody writes to either side.
_COPIES = {
    aten.clone.default,
    aten.lift_fresh_copy.default,
    aten._to_copy.default,
    prims.convert_element_type.default,
}
# ``_to_copy`` kwargs that can leave the value unchanged; anything else (pin_memory) keeps it.
_TO_COPY_KWARGS = {"dtype", "layout", "device", "memory_format", "non_blocking"}


def _same_ints(a: object, b: object) -> bool:
    # NOTE: compares symbolic sizes by their expression text, so no shape guard is installed.
    # Plain ints (almost every size) compare directly: the same answer, without two str() calls.
    return len(a) == len(b) and all(
        x == y if type(x) is int and type(y) is int else str(x) == str(y)
        for x, y in zip(a, b, strict=True)
    )


def _same_meta(a: fx.Node, b: fx.Node, *, strides: bool = False) -> bool:
    va, vb = a.meta.get("val"), b.meta.get("val")
    if not (isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor)):
        return False
    # Shape first: most views change it, so this fails earliest (tensor attribute reads on fake
    # tensors are slow enough to matter here).
    if not _same_ints(va.shape, vb.shape):
        return False
    if va.dtype != vb.dtype or va.device != vb.device or va.layout != vb.layout:
        return False
    return not strides or va.layout != torch.strided or _same_ints(va.stride(), vb.stride())


def _is_noop(node: fx.Node, written: set[fx.Node]) -> bool:
    if node.op != "call_function" or not node.args or not isinstance(node.args[0], fx.Node):
        return False
    src = node.args[0]
    if node.target in _VIEWS:
        return _same_meta(node, src)
    if node.target not in _COPIES:
        return False
    if node.target is aten._to_copy.default and set(node.kwargs) - _TO_COPY_KWARGS:
        return False
    if node in written or alias_root(src) in written:
        return False
    val = src.meta.get("val")
    if isinstance(val, torch.Tensor) and (val.is_conj() or val.is_neg()):
        return False  # a copy of a lazily conjugated or negated view resolves it
    return _same_meta(node, src, strides=True)


def _copy_needed(src: fx.Node) -> bool:
    """Whether an output's copy of ``src`` must stay: ``src`` is another output, or a view of a
    graph input or attribute (an output in its place would alias the caller's tensor, and see the
    writes AOTAutograd applies to inputs after the graph: ``old = x[0].clone(); x.add_(1)``)."""
    return feeds_output(src) or alias_root(src).op in ("placeholder", "get_attr")


def remove_noops(gm: fx.GraphModule) -> bool:
    written = mutated_roots(gm.graph)
    removed = 0
    for node in nodes_calling(gm.graph, without_effects(_VIEWS | _COPIES)):
        if not _is_noop(node, written):
            continue
        src = node.args[0]
        if feeds_output(node) and (
            src.op == "placeholder" or (node.target in _COPIES and _copy_needed(src))
        ):
            continue
        node.replace_all_uses_with(src)
        gm.graph.erase_node(node)
        removed += 1
    log.debug("remove_noops: removed %d nodes", removed)
    return removed > 0
