"""eliminate_common_subexpressions: merge nodes that compute the same value from the same inputs.

Requires: an FX graph in topological order (every FX graph is).
Guarantees: two nodes merge only if both are pure ATen/prims ops (or ``operator.getitem``) with
the same target and equal arguments, where equality is by value *and type* (``1``, ``1.0`` and
``True`` differ, as do ``0.0`` and ``-0.0``) and nodes compare by identity. Never merged: RNG ops,
ops that mutate, higher-order ops, ops whose arguments cannot be hashed. A mutation anywhere in the
graph forgets everything seen before it, so a value read before and after an in-place write is never
shared, and values written to later, or both returned as graph outputs, keep their own nodes.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Hashable
from typing import Any

import torch
import torch.fx as fx
from torch._ops import OpOverload

from .effects import alias_root, is_random, mutated_roots, mutates

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
    return _key_of_other(value)


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


def _mergeable(node: fx.Node) -> bool:
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return True
    target = node.target
    if not isinstance(target, OpOverload) or target.namespace not in _NAMESPACES:
        return False
    return not (mutates(node) or is_random(node))


def _feeds_output(node: fx.Node) -> bool:
    return any(user.op == "output" for user in node.users)


def eliminate_common_subexpressions(gm: fx.GraphModule) -> bool:
    seen: dict[Hashable, fx.Node] = {}
    written = mutated_roots(gm.graph)
    merged = 0
    for node in list(gm.graph.nodes):
        if mutates(node):
            seen.clear()  # values computed before a write may differ from the same op after it
            continue
        # A value that is later written to (directly or through a view) must keep its own buffer.
        if not _mergeable(node) or alias_root(node) in written:
            continue
        try:
            kwargs = _key_of(dict(node.kwargs)) if node.kwargs else None
            key = (node.target, _key_of(node.args), kwargs)
            hash(key)
        except (_Unhashable, TypeError):
            continue
        prior = seen.get(key)
        if prior is None:
            seen[key] = node
            continue
        if _feeds_output(node) and _feeds_output(prior):
            continue  # two outputs must not become one tensor object the caller sees twice
        node.replace_all_uses_with(prior)
        gm.graph.erase_node(node)
        merged += 1
    log.debug("eliminate_common_subexpressions: merged %d nodes", merged)
    return merged > 0
