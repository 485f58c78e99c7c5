"""fold_constants: evaluate small subgraphs that read no graph input at compile time.

Requires: ``meta["val"]`` on the nodes to fold (their size decides whether they are folded).
Guarantees: a node is folded only if it is a pure op (``effects.is_impure`` is False, not random,
no ``empty``-style op whose values are unspecified) whose every input is constant (a literal, a
``get_attr`` tensor small enough to be inlined — whose values the FX index key covers — that the
graph never writes to, or another foldable node), so no placeholder is
reachable from it; and only if its result has at most ``MAX_FOLDED_ELEMENTS`` elements. Each
folded result that something else still reads becomes a ``get_attr`` of a new buffer ``_folded_constant_<n>`` on the module,
which the lowering inlines as a ``stablehlo.constant`` (the same limit): no new ``@main``
argument, so FX-index warm starts (which have no folded buffers) keep working. Bare creation ops
(``full``, ``arange``, ``scalar_tensor`` with only literal arguments) are left alone: they already
lower to a constant or an iota, which is as cheap as a folded literal. Replaced nodes are erased.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.fx as fx
from torch._ops import OpOverload
from torch.utils._python_dispatch import _disable_current_modes

from ..lowering.lower_graph import INLINE_CONSTANT_MAX_ELEMENTS, is_inline_constant
from .effects import is_impure, is_random, mutated_roots, op_name

log = logging.getLogger(__name__)

#: Folded results must be inlined by the lowering (see the module docstring), so the limit is its.
MAX_FOLDED_ELEMENTS = INLINE_CONSTANT_MAX_ELEMENTS
#: Intermediates evaluated on the way to a small result (``arange(4096).sum()``) are bounded too,
#: so folding never allocates much at compile time.
_MAX_EVALUATED_ELEMENTS = 1 << 16
#: Ops whose result values are unspecified: "folding" them would invent values.
_UNSPECIFIED_NAME_PARTS = ("empty",)


def _numel(node: fx.Node) -> int | None:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor) and all(isinstance(d, int) for d in val.shape):
        return val.numel()
    return None


def _foldable_op(node: fx.Node) -> bool:
    if node.op != "call_function" or not isinstance(node.target, OpOverload):
        return False
    if is_impure(node) or is_random(node):
        return False
    name = op_name(node.target).lower()
    return not any(part in name for part in _UNSPECIFIED_NAME_PARTS)


def _is_literal(value: Any) -> bool:
    """Arguments that are constants themselves (SymInts are not: they come from inputs). Nodes
    count here; whether they are constant is checked separately."""
    if isinstance(value, fx.Node):
        return True
    if isinstance(value, list | tuple):
        return all(_is_literal(v) for v in value)
    if isinstance(value, dict):
        return all(_is_literal(v) for v in value.values())
    return (
        isinstance(
            value,
            bool | int | float | complex | str | torch.dtype | torch.device | torch.layout,
        )
        or value is None
        or isinstance(value, torch.memory_format)
    )


def _constant_nodes(gm: fx.GraphModule) -> dict[fx.Node, torch.Tensor]:
    """Every node whose value is known at compile time, with that value (evaluated eagerly)."""
    values: dict[fx.Node, torch.Tensor] = {}
    # A buffer the graph writes to (a BatchNorm running stat) is not a constant: its value
    # depends on where in the graph it is read.
    written = mutated_roots(gm.graph)
    # Leave fake mode (the compiler callback runs under it), autocast (a caller's autocast region
    # would change the dtypes the graph already fixed) and autograd.
    with _disable_current_modes(), torch.autocast("cpu", enabled=False), torch.no_grad():
        for node in gm.graph.nodes:
            if node.op == "get_attr":
                attr = getattr(gm, node.target, None)
                # Only small constants: their values are part of the FX index key
                # (cache/fx_index.py), so a folded result baked into the module can never be
                # served for a graph whose big constant holds other values.
                if is_inline_constant(attr) and node not in written:
                    values[node] = attr
                continue
            # Cheap test first: almost every node depends on a graph input.
            if any(n not in values for n in node.all_input_nodes) or not _foldable_op(node):
                continue
            numel = _numel(node)
            if (
                not _is_literal([node.args, node.kwargs])
                or numel is None
                or numel > _MAX_EVALUATED_ELEMENTS
            ):
                continue
            args = fx.node.map_arg(node.args, lambda n: values[n])
            kwargs = fx.node.map_arg(node.kwargs, lambda n: values[n])
            try:
                result = node.target(*args, **kwargs)
            except Exception as e:  # an op that cannot run on CPU here simply stays
                log.debug("fold_constants: cannot evaluate %s (%s)", node.name, e)
                continue
            val = node.meta["val"]
            if (
                not isinstance(result, torch.Tensor)
                or result.dtype != val.dtype
                or tuple(result.shape) != tuple(val.shape)
            ):
                continue
            values[node] = result
    return values


def _new_buffer_name(gm: fx.GraphModule) -> str:
    i = 0
    while hasattr(gm, f"_folded_constant_{i}"):
        i += 1
    return f"_folded_constant_{i}"


def fold_constants(gm: fx.GraphModule) -> bool:
    graph = gm.graph
    values = _constant_nodes(gm)
    folded = 0
    for node, value in values.items():
        if node.op != "call_function" or not node.users:
            continue
        if all(user in values for user in node.users):
            continue  # only an input of other folded nodes: it dies with them
        if not node.all_input_nodes:
            continue  # a bare creation op is already a constant in StableHLO
        if (_numel(node) or 0) > MAX_FOLDED_ELEMENTS:
            continue
        name = _new_buffer_name(gm)
        with _disable_current_modes():
            gm.register_buffer(name, value.detach().clone().contiguous())
        with graph.inserting_before(node):
            constant = graph.get_attr(name)
        constant.meta["val"] = node.meta["val"]
        node.replace_all_uses_with(constant)
        folded += 1
    erased = 0
    # Reverse order: users go before their inputs, so whole folded chains disappear.
    for node in reversed(list(values)):
        if node.op == "call_function" and not node.users:
            graph.erase_node(node)
            erased += 1
    log.debug("fold_constants: folded %d constants, erased %d nodes", folded, erased)
    return folded + erased > 0
