"""remove_noops: drop ops that compute nothing in a functional graph.

Requires: a functionalized ATen graph (AOTAutograd output), ``meta["val"]`` on every node.
Guarantees: every removed node's users read its input instead; graph outputs keep their identity
with respect to graph inputs (a clone of an input that is returned stays a clone, because
returning the input itself would make the caller's output alias its argument).
"""

from __future__ import annotations

import torch
import torch.fx as fx

aten = torch.ops.aten

_ALWAYS_NOOP = {
    aten.alias.default,
    aten.clone.default,
    aten.detach.default,
    aten.lift_fresh_copy.default,
}


def _same_meta(a: fx.Node, b: fx.Node) -> bool:
    va, vb = a.meta.get("val"), b.meta.get("val")
    return (
        isinstance(va, torch.Tensor)
        and isinstance(vb, torch.Tensor)
        and va.shape == vb.shape
        and va.dtype == vb.dtype
    )


def _is_noop(node: fx.Node) -> bool:
    if node.op != "call_function" or not node.args or not isinstance(node.args[0], fx.Node):
        return False
    src = node.args[0]
    if node.target in _ALWAYS_NOOP:
        return _same_meta(node, src)
    if node.target in (aten.view.default, aten._unsafe_view.default, aten.reshape.default):
        return _same_meta(node, src)
    if node.target is aten._to_copy.default:
        extra = set(node.kwargs) - {"dtype", "layout", "device", "memory_format"}
        return not extra and _same_meta(node, src)
    return False


def remove_noops(gm: fx.GraphModule) -> bool:
    changed = False
    for node in list(gm.graph.nodes):
        if not _is_noop(node):
            continue
        src = node.args[0]
        feeds_output = any(user.op == "output" for user in node.users)
        if feeds_output and src.op == "placeholder":
            continue
        node.replace_all_uses_with(src)
        gm.graph.erase_node(node)
        changed = True
    return changed
