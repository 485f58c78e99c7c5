"""eliminate_dead_code: delete nodes whose results nobody reads.

Requires: nothing beyond a well-formed FX graph.
Guarantees: only nodes with no users and no side effects are removed (see ``effects.is_impure``):
placeholders, the output, mutations (in-place, ``out=``, ``copy_`` back into inputs), RNG ops
(deleting an unused ``rand`` would shift every later random number), ops with effects
(collectives and ``wait_tensor``: the other ranks wait for this one; ``with_effects``, asserts;
see ``effects.has_effects``) and other higher-order ops always stay. Removal is iterated to a fixed point in one call, so a
second run returns False.
"""

from __future__ import annotations

import logging

import torch.fx as fx

from .effects import is_impure

log = logging.getLogger(__name__)


def eliminate_dead_code(gm: fx.GraphModule) -> bool:
    removed = 0
    # Reverse topological order: a node's users are visited (and possibly erased) before it, so
    # one sweep removes whole dead chains.
    for node in reversed(list(gm.graph.nodes)):
        if node.users or is_impure(node):
            continue
        gm.graph.erase_node(node)
        removed += 1
    log.debug("eliminate_dead_code: removed %d nodes", removed)
    return removed > 0
