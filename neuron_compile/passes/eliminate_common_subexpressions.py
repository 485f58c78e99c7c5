"""eliminate_common_subexpressions: merge nodes that compute the same value from the same inputs.

Requires: an FX graph in topological order (every FX graph is).
Guarantees: two nodes merge only if both are pure ATen/prims ops (or ``operator.getitem``) with
the same target and equal arguments, where equality is by value *and type* (``1``, ``1.0`` and
``True`` differ, as do ``0.0`` and ``-0.0``) and nodes compare by identity. Never merged: RNG ops,
ops that mutate, ops with effects (``effects.has_effects``: collectives, ``wait_tensor``, asserts),
higher-order ops, ops whose arguments cannot be hashed. A mutation or an op with effects anywhere
in the graph forgets everything seen before it, so a value read before and after an in-place write
(or before and after a ``wait_tensor``, which fills its argument without saying so in its schema)
is never shared, and nothing is hoisted across a collective; values written to later, or both
returned as graph outputs, keep their own nodes.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Hashable
from typing import Any

import torch
import torch.fx as fx
from torch._ops import OpOverload

from .effects import (
    alias_root,
    mutated_roots,
    mutating_nodes,
    target_has_effects,
    target_is_random,
    target_mutates,
)
from .graph_queries import feeds_output, nodes_calling_any

log = logging.getLogger(__name__)

_NAMESPACES = ("aten", "prims")


class _Unhashable(Exception):
    pass


_SEQUENCES = (list, tuple, torch.fx.immutable_collections.immutable_list)


def _key_of(value: Any) -> Hashable:
    """A hashable key that is equal only for values that mean the same to the op."""
    kind = type(value)  # exact-type fast paths for what ATen arguments almost always are
    if kind is fx.Node:
        return value  # by identity; never equal to the tuples below
    if kind is int or kind is bool or kind is str:
        return (kind, value)
    if kind in _SEQUENCES:
        return ("seq", tuple(map(_key_of, value)))
    if kind is float:
        return ("float", repr(value))  # as _key_of_other does
    if value is None:
        return ("NoneType", None)
    return _key_of_other(value)


def _key_of_kwargs(kwargs: dict[str, Any]) -> Hashable:
    """``_key_of(dict(kwargs))`` without the copy (FX kwargs are an ``immutable_dict``)."""
    return ("dict", tuple(sorted((k, _key_of(v)) for k, v in kwargs.items())))


def _key_of_other(value: Any) -> Hashable:
    if isinstance(value, fx.Node):
        return value
    if isinstance(value, bool | int | str) or value is None:
        return (type(value).__name__, value)
    if isinstance(value, float):
        return ("float", repr(value))  # repr keeps -0.0 apart from 0.0 and makes nan == nan
    if isinstance(value, complex):
        return ("complex", repr(value))
    if isinstance(value, list | tuple):  # includes torch.fx.immutable_collections.immutable_list
        return ("seq", tuple(_key_of(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((k, _key_of(v)) for k, v in value.items())))
    if isinstance(value, torch.dtype | torch.device | torch.layout | torch.memory_format):
        return (type(value).__name__, str(value))
    if isinstance(value, slice):
        return ("slice", _key_of(value.start), _key_of(value.stop), _key_of(value.step))
    if isinstance(value, torch.Tensor):
        return ("tensor", id(value))  # never compare tensors by value
    # SymInt/SymFloat and anything else: refuse rather than risk a false match.
    raise _Unhashable(type(value).__name__)


def _mergeable(target: object) -> bool:
    """Whether nodes calling ``target`` may be merged (pure ATen/prims ops and ``getitem``)."""
    if target is operator.getitem:
        return True
    if not isinstance(target, OpOverload) or target.namespace not in _NAMESPACES:
        return False
    return not (target_mutates(target) or target_is_random(target) or target_has_effects(target))


def _key(node: fx.Node) -> Hashable | None:
    """Equal only for nodes that compute the same value; None if an argument cannot be keyed."""
    try:
        kwargs = _key_of_kwargs(node.kwargs) if node.kwargs else None
        # NOTE: the target by identity (targets compare by identity anyway): hashing an
        # OpOverload runs Python code.
        key = (id(node.target), _key_of(node.args), kwargs)
        hash(key)
    except (_Unhashable, TypeError):
        return None
    return key


_NOT_BUILT = object()


class _Seen:
    """The nodes seen since the last mutation, to find an earlier node equal to a new one.

    Building a node's full key was most of this pass's time, and most nodes have no twin. Equal
    nodes share their target and first argument, so nodes are grouped by those first, and a
    node's full key is built only once another node lands in its group.
    """

    def __init__(self) -> None:
        self._groups: dict[tuple[int, fx.Node | None], list[list[Any]]] = {}

    def clear(self) -> None:
        self._groups.clear()

    def find_or_add(self, node: fx.Node) -> fx.Node | None:
        """The earliest remembered node equal to ``node``; if there is none, remember ``node``
        (unless it has no key) and return None."""
        first = node.args[0] if node.args else None
        group_key = (id(node.target), first if type(first) is fx.Node else None)
        group = self._groups.get(group_key)
        if group is None:
            self._groups[group_key] = [[node, _NOT_BUILT]]
            return None
        key = _key(node)
        if key is None:
            return None
        for entry in group:  # [node, its key], oldest first
            if entry[1] is _NOT_BUILT:
                entry[1] = _key(entry[0])  # its arguments are unchanged since it was seen
            if entry[1] == key:
                return entry[0]
        group.append([node, key])
        return None


def eliminate_common_subexpressions(gm: fx.GraphModule) -> bool:
    seen = _Seen()
    graph = gm.graph
    mutations = mutating_nodes(graph)
    written = mutated_roots(graph, mutations)
    # Only mergeable nodes and barriers (mutations, ops with effects) matter, in graph order;
    # every other node is skipped.
    candidates = nodes_calling_any(graph, _mergeable)
    barriers = set(mutations) | set(nodes_calling_any(graph, target_has_effects))
    if barriers:
        candidates = sorted(set(candidates) | barriers)
    merged = 0
    for node in candidates:
        if node in barriers:
            # Values computed before a write (or a wait on a collective) may differ from the
            # same op after it; merging would also move the later computation above the barrier.
            seen.clear()
            continue
        # A value that is later written to (directly or through a view) must keep its own buffer.
        if written and alias_root(node) in written:
            continue
        prior = seen.find_or_add(node)
        if prior is None:
            continue
        if feeds_output(node) and feeds_output(prior):
            continue  # two outputs must not become one tensor object the caller sees twice
        node.replace_all_uses_with(prior)
        graph.erase_node(node)
        merged += 1
    log.debug("eliminate_common_subexpressions: merged %d nodes", merged)
    return merged > 0
