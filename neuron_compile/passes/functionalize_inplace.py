"""functionalize_inplace: turn in-place ATen ops on intermediates into their functional variants.

Requires: ``meta["val"]`` on the in-place node and its tensor arguments (to check that the
functional variant returns the same shape and dtype: ``a.mul_(b)`` keeps ``a``'s dtype where
``mul(a, b)`` would promote).
Guarantees: ``op_(t, ...)`` becomes ``op(t, ...)`` (same overload name, found through the schema,
not a list of names) only when
- the schema writes exactly one argument, ``self``, and returns one tensor aliasing it, and the
  functional variant exists, writes nothing and returns a fresh (non-view) tensor;
- ``t``'s storage belongs to an intermediate (``effects.alias_root`` is neither a placeholder nor
  a ``get_attr``): input mutations AOTAutograd keeps on purpose (``copy_`` into a graph input)
  and writes to module buffers are never touched;
- after the op, nothing reads ``t``'s storage except through the op's result: no later user of
  ``t``, of its base, or of any view of them that was not derived from the result (the output
  node counts as a reader).
Later users of the op's result then read the functional node instead. Ops with effects
(``effects.has_effects``) are never rewritten: ``_c10d_functional.all_reduce_`` has a functional
twin by schema, but which buffer a collective writes (and its ``wait_tensor`` waits on) is the
program's business. Graphs without such ops are returned unchanged.
"""

from __future__ import annotations

import logging

import torch
import torch.fx as fx
from torch._guards import detect_fake_mode
from torch._ops import OpOverload
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import _disable_current_modes

from .effects import alias_root, mutated_args, target_has_effects, target_mutates
from .graph_queries import nodes_calling_any

log = logging.getLogger(__name__)


def functional_variant(op: OpOverload) -> OpOverload | None:
    """The out-of-place overload of in-place ``op`` (``add_.Tensor`` -> ``add.Tensor``), or None
    if ``op`` is not a plain in-place op on ``self`` or has no such twin."""
    schema = op._schema
    if not schema.is_mutable or len(schema.returns) != 1 or not schema.arguments:
        return None
    written = [a for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    if written != [schema.arguments[0]] or schema.returns[0].alias_info is None:
        return None
    name = op.overloadpacket.__name__
    if not name.endswith("_") or name.endswith("__"):
        return None
    namespace = getattr(torch.ops, op.namespace)
    packet = getattr(namespace, name[:-1], None)
    variant = getattr(packet, op._overloadname, None) if packet is not None else None
    if not isinstance(variant, OpOverload):
        return None
    fschema = variant._schema
    if fschema.is_mutable or len(fschema.returns) != 1 or fschema.returns[0].alias_info:
        return None
    same_args = [(a.name, str(a.type), a.kwarg_only) for a in schema.arguments] == [
        (a.name, str(a.type), a.kwarg_only) for a in fschema.arguments
    ]
    return variant if same_args else None


def _has_functional_variant(target: object) -> bool:
    # target_mutates is cached and answers False for almost every op, so the schema reads in
    # functional_variant run for in-place ops only.
    if not isinstance(target, OpOverload) or not target_mutates(target):
        return False
    if target_has_effects(target):
        return False
    return functional_variant(target) is not None


def _derived_from(node: fx.Node, source: fx.Node) -> bool:
    """True if ``node`` reaches ``source`` by following view/alias arguments (as alias_root does)."""
    while True:
        if node is source:
            return True
        parent = _alias_step(node)
        if parent is None:
            return False
        node = parent


def _alias_step(node: fx.Node) -> fx.Node | None:
    """One step of ``effects.alias_root``: the node ``node``'s result aliases, or None."""
    root = alias_root(node)
    if root is node:
        return None
    # alias_root walks args[0] of view-like nodes and getitems; one step is args[0].
    first = node.args[0]
    return first if isinstance(first, fx.Node) else None


def _read_later(node: fx.Node) -> bool:
    """Does anything after ``node`` read its target's storage other than through its result?"""
    root = alias_root(node.args[0])
    for other in node.graph.nodes:
        if alias_root(other) is not root or _derived_from(other, node):
            continue
        if any(user > node for user in other.users):  # nodes compare by graph position
            return True
    return False


def _same_result(node: fx.Node, variant: OpOverload) -> bool:
    """Whether ``variant`` on the same arguments returns the type the in-place op did."""
    want = node.meta.get("val")
    if not isinstance(want, torch.Tensor):
        return False
    vals = [n.meta.get("val") for n in node.all_input_nodes]
    if not all(isinstance(v, torch.Tensor) for v in vals):
        return False
    fake_mode = detect_fake_mode(vals)
    env = {n: n.meta["val"] for n in node.all_input_nodes}
    args = fx.node.map_arg(node.args, env.__getitem__)
    kwargs = fx.node.map_arg(node.kwargs, env.__getitem__)
    try:
        if fake_mode is not None:
            with fake_mode:
                got = variant(*args, **kwargs)
        else:  # real tensors in meta (hand-built graphs): stay off the real data
            with _disable_current_modes(), FakeTensorMode(allow_non_fake_inputs=True):
                got = variant(*args, **kwargs)
    except Exception:
        return False
    return got.dtype == want.dtype and tuple(got.shape) == tuple(want.shape)


def functionalize_inplace(gm: fx.GraphModule) -> bool:
    graph = gm.graph
    rewritten = 0
    # Only in-place ops with a functional twin can be rewritten; most graphs have none.
    for node in nodes_calling_any(graph, _has_functional_variant):
        variant = functional_variant(node.target)
        if variant is None or mutated_args(node) != [node.args[0]]:
            continue
        root = alias_root(node.args[0])
        if root.op in ("placeholder", "get_attr"):
            continue
        if _read_later(node) or not _same_result(node, variant):
            continue
        with graph.inserting_before(node):
            new = graph.call_function(variant, node.args, dict(node.kwargs))
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        rewritten += 1
    log.debug("functionalize_inplace: rewrote %d in-place ops", rewritten)
    return rewritten > 0
