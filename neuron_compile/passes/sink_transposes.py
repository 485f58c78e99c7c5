"""sink_transposes: fold operand transposes of ``mm``/``bmm`` into ``dot_general`` dimensions.

AOTAutograd backward graphs compute ``mm(permute(a, [1, 0]), b)`` and
``bmm(permute(x, [0, 2, 1]), y)`` everywhere; lowered as written, each permute is a
``stablehlo.transpose`` that materializes a copy. ``stablehlo.dot_general`` reads either operand
in any layout through its dimension numbers, so the permute can go.

Requires: ``meta["val"]`` on the matmul and its operands (dtype and rank checks).
Guarantees: ``mm``/``bmm`` on floating-point operands where at least one operand is a permute
(``permute``, ``transpose.int``, ``t``) that keeps the batch dim in place becomes
``neuron_compile.dot_general`` on the permutes' inputs, with the same result (shape, dtype and
values: the op's result dims are batch, lhs free, rhs free, which is ``mm``/``bmm``'s order).
A linear layer's ``addmm(bias, x, t(w))`` (``beta == alpha == 1``) becomes
``add(dot_general(x, w), bias)`` when the transpose dies with it, in float32 and float64 only:
eager adds a half-precision bias to the float32 product and rounds once, where the split would
round the product first (up to ~100 ulps off where the sum cancels). New nodes take over the
matmul's ``meta`` (their values are the same tensors by construction). A permute left without
users is erased; one that other nodes still read stays (the ``mm``/``bmm`` rewrite then removes
no op but adds none either, and the matmul no longer waits on the transpose). Ops with effects
(``effects.has_effects``) are never rewritten or erased. Runs late: it introduces a custom op that
other passes do not know.
"""

from __future__ import annotations

import logging

import torch
import torch.fx as fx

from ..ops import dot_general as _dot_general_op  # noqa: F401  (registers the op)
from .effects import has_effects, without_effects
from .fold_permutes import permutation_of
from .graph_edits import call_before
from .graph_queries import nodes_calling

log = logging.getLogger(__name__)

aten = torch.ops.aten
DOT_GENERAL = torch.ops.neuron_compile.dot_general.default

_FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
#: Where ``add(dot_general, bias)`` rounds as eager's addmm does (see the module docstring).
_SPLIT_ADDMM = (torch.float32, torch.float64)
_MATMULS = (aten.addmm.default, aten.mm.default, aten.bmm.default)


def _permutation(node: fx.Node) -> list[int] | None:
    """``permutation_of(node)`` unless ``node`` has effects (then it is not ours to sink)."""
    return None if has_effects(node) else permutation_of(node)


def _operand(
    node: fx.Node, batched: bool, contract_at: int
) -> tuple[fx.Node, list[int], list[int], bool]:
    """``(source, contract dims, batch dims, sunk)`` for one matmul operand: through a permute
    (sunk) if it has one that leaves the batch dim alone, else the operand as it is."""
    rank = 3 if batched else 2
    perm = _permutation(node)
    if perm is not None and len(perm) == rank and (not batched or perm[0] == 0):
        src = node.args[0]
        # Operand dim i is source dim perm[i].
        return src, [perm[contract_at]], [perm[0]] if batched else [], True
    return node, [contract_at], [0] if batched else [], False


def _addmm_parts(node: fx.Node) -> tuple[fx.Node, fx.Node, fx.Node] | None:
    """``(bias, a, b)`` of ``addmm(bias, a, b)`` with ``beta == alpha == 1`` (``bias + a @ b``)."""
    if len(node.args) != 3 or any(node.kwargs.get(k, 1) != 1 for k in ("beta", "alpha")):
        return None
    bias, a, b = node.args
    if not all(isinstance(x, fx.Node) for x in (bias, a, b)):
        return None
    return bias, a, b


def _dies_with(node: fx.Node, user: fx.Node) -> bool:
    return _permutation(node) is not None and set(node.users) == {user}


def sink_transposes(gm: fx.GraphModule) -> bool:
    graph = gm.graph
    sunk = erased = 0
    for node in nodes_calling(graph, without_effects(_MATMULS)):
        bias = None
        if node.target is aten.addmm.default:
            # A linear layer's forward: addmm(bias, x, t(w)). Split into dot_general + add only
            # when a transpose dies with it; otherwise the split would buy nothing.
            parts = _addmm_parts(node)
            if parts is None or not (_dies_with(parts[1], node) or _dies_with(parts[2], node)):
                continue
            bias, a, b = parts
        elif len(node.args) != 2:  # mm / bmm
            continue
        else:
            a, b = node.args
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or val.dtype not in _FLOATS:
            continue
        if bias is not None and val.dtype not in _SPLIT_ADDMM:
            continue
        if not isinstance(a, fx.Node) or not isinstance(b, fx.Node):
            continue
        batched = node.target is aten.bmm.default
        lhs, lc, lb, lhs_sunk = _operand(a, batched, 2 if batched else 1)
        rhs, rc, rb, rhs_sunk = _operand(b, batched, 1 if batched else 0)
        if not (lhs_sunk or rhs_sunk):
            continue
        args = (lhs, rhs, lc, rc, lb, rb)
        # Same value as the matmul it replaces, so it keeps the matmul's fake value (running the
        # op's fake implementation instead costs ~1 ms per node).
        new = call_before(node, DOT_GENERAL, args, node.meta)
        if bias is not None:  # bias + a @ b, with the addmm's value (same shape and dtype)
            new = call_before(new.next, aten.add.Tensor, (new, bias), node.meta)
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        sunk += 1
        for operand in {a, b}:
            if _permutation(operand) is not None and not operand.users:
                graph.erase_node(operand)
                erased += 1
    log.debug("sink_transposes: rewrote %d matmuls, erased %d transposes", sunk, erased)
    return sunk > 0
