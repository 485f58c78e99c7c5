"""fold_permutes: canonicalize transposes so each chain of them becomes one ``permute`` (or none).

Requires: ``meta["val"]`` on transpose/permute nodes (for the rank of ``transpose.int``).
Guarantees: ``permute(permute(x, p), q)`` becomes ``permute(x, [p[i] for i in q])`` (``transpose.int``
counts as a permute); a permute that is the identity is dropped, except where that would make a
graph output the same object as a graph input or as another output. Inner permutes left without
users are erased. The rewritten graph reads every value it read before, so results are unchanged.
Ops with effects (``effects.has_effects``) are never part of a chain.
"""

from __future__ import annotations

import logging

import torch
import torch.fx as fx

from .effects import has_effects, without_effects
from .graph_edits import call_before
from .graph_queries import can_replace_output, nodes_calling

log = logging.getLogger(__name__)

aten = torch.ops.aten
#: The targets ``permutation_of`` understands.
_TRANSPOSES = (aten.t.default, aten.permute.default, aten.transpose.int)


def permutation_of(node: fx.Node) -> list[int] | None:
    """The permutation ``node`` applies to ``node.args[0]`` (``permute``, ``transpose.int``,
    ``t``), or None if it is not a transpose."""
    if node.op != "call_function" or not node.args or not isinstance(node.args[0], fx.Node):
        return None
    if node.target is aten.t.default:
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            return None
        return [1, 0] if val.dim() == 2 else list(range(val.dim()))  # t of a 0-d/1-d: identity
    if node.target is aten.permute.default:
        dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dims")
        if not isinstance(dims, list | tuple) or not all(isinstance(d, int) for d in dims):
            return None
        rank = len(dims)
        return [d % rank for d in dims] if rank else []
    if node.target is aten.transpose.int and len(node.args) == 3:
        val = node.meta.get("val")
        d0, d1 = node.args[1], node.args[2]
        if not isinstance(val, torch.Tensor) or not isinstance(d0, int) or not isinstance(d1, int):
            return None
        rank = val.dim()
        perm = list(range(rank))
        if rank:
            d0, d1 = d0 % rank, d1 % rank
            perm[d0], perm[d1] = perm[d1], perm[d0]
        return perm
    return None


def fold_permutes(gm: fx.GraphModule) -> bool:
    folded = dropped = 0
    graph = gm.graph
    for node in nodes_calling(graph, without_effects(_TRANSPOSES)):
        perm = permutation_of(node)
        if perm is None:
            continue
        src = node.args[0]
        inner = None if has_effects(src) else permutation_of(src)
        if inner is not None and len(inner) == len(perm):
            composed = [inner[i] for i in perm]
            new = call_before(node, aten.permute.default, (src.args[0], composed), node.meta)
            node.replace_all_uses_with(new)
            graph.erase_node(node)
            if not src.users:
                graph.erase_node(src)
            node, src, perm = new, new.args[0], composed
            folded += 1
        if perm == list(range(len(perm))) and can_replace_output(node, src):
            node.replace_all_uses_with(src)
            graph.erase_node(node)
            dropped += 1
    log.debug(
        "fold_permutes: folded %d permute pairs, dropped %d identity permutes", folded, dropped
    )
    return folded + dropped > 0
