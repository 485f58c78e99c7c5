"""Graph edits shared by the rewriting passes, done the cheap way."""

from __future__ import annotations

from typing import Any

import torch.fx as fx


def call_before(
    anchor: fx.Node, target: Any, args: tuple[Any, ...], meta: dict[str, Any] | None = None
) -> fx.Node:
    """``graph.call_function(target, args)`` inserted right before ``anchor``, with a copy of
    ``meta`` (the node it replaces usually) as its ``meta``.

    The node is the one ``call_function`` would make (same name, arguments and users), but its
    arguments are set after it is created. NOTE: ``Graph.create_node`` walks the arguments with
    pytree only to warn about raw SymInts, and that walk costs as much as the rest of a rewrite;
    callers pass nodes and plain Python scalars and lists, which it would never warn about. The
    meta is copied into the node's own (empty) dict: assigning ``node.meta`` goes through
    ``Node.__setattr__``, which re-indexes the node by target each time.
    """
    graph = anchor.graph
    with graph.inserting_before(anchor):
        node = graph.call_function(target)
    node.args = args
    if meta is not None:
        node.meta.update(meta)
    return node
