"""Cheap queries on an FX graph's nodes, so a pass visits only the nodes it could rewrite.

Most passes rewrite a handful of ops (permutes, casts, matmuls); walking every node and hashing
its target to find them cost more than the rewrites. FX keeps an index of ``call_function``
nodes by target (``Graph.find_nodes``), which answers "which nodes call these ops" without a walk.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch.fx as fx


def nodes_calling(graph: fx.Graph, targets: Iterable[object]) -> list[fx.Node]:
    """The ``call_function`` nodes of ``graph`` whose target is one of ``targets``, in graph
    order (the order a walk over ``graph.nodes`` would meet them)."""
    found: list[fx.Node] = []
    for target in targets:
        found += graph.find_nodes(op="call_function", target=target, sort=False)
    found.sort()  # nodes compare by their position in the graph
    return found


def call_targets(graph: fx.Graph) -> list[object]:
    """The distinct targets of ``graph``'s ``call_function`` nodes (in no particular order)."""
    # NOTE: reads the index behind Graph.find_nodes, which has no public way to list its keys;
    # without it (another torch), fall back to a walk.
    index = getattr(graph, "_find_nodes_lookup_table", None)
    table = getattr(index, "table", None)
    if not isinstance(table, dict):
        return list({node.target: None for node in graph.nodes if node.op == "call_function"})
    return [target for (op, target), nodes in table.items() if op == "call_function" and nodes]


def feeds_output(node: fx.Node) -> bool:
    """True if the graph returns ``node``'s value."""
    return any(user.op == "output" for user in node.users)


def can_replace_output(node: fx.Node, src: fx.Node) -> bool:
    """Replacing ``node`` by ``src`` must not make an output alias an input or another output
    (the caller would see one tensor object twice, or its own input back)."""
    return not feeds_output(node) or (src.op != "placeholder" and not feeds_output(src))


def nodes_calling_any(graph: fx.Graph, wanted: Callable[[object], bool]) -> list[fx.Node]:
    """The ``call_function`` nodes whose target satisfies ``wanted``, in graph order;
    ``wanted`` is asked once per distinct target, not once per node."""
    return nodes_calling(graph, [t for t in call_targets(graph) if wanted(t)])
