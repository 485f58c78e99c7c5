"""fold_constants: evaluate small subgraphs that read no graph input at compile time.

Requires: ``meta["val"]`` on the nodes to fold (their size decides whether they are folded).
Guarantees: a node is folded only if it is a pure op (``effects.is_impure`` is False: no
mutation, RNG, collective, ``wait_tensor`` or other op with effects, which would run at compile
time in this process only and keep its unreduced value; no ``empty``-style op whose values are
unspecified) whose every input is constant (a literal, a
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

import contextlib
import heapq
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


#: Types ``_is_literal`` accepts, matched exactly first (what ATen arguments almost always are);
#: subclasses go through the isinstance checks.
_LITERAL_TYPES = frozenset(
    {fx.Node, bool, int, float, complex, str, type(None)}
    | {torch.dtype, torch.device, torch.layout, torch.memory_format}
)


def _is_literal(value: Any) -> bool:
    """Arguments that are constants themselves (SymInts are not: they come from inputs). Nodes
    count here; whether they are constant is checked separately."""
    if type(value) in _LITERAL_TYPES or isinstance(value, fx.Node):
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
    """Every node whose value is known at compile time, with that value (evaluated eagerly), in
    graph order; except creation ops (no input nodes) that some node reads but no constant node
    does: those are never folded and never erased, so evaluating them would be wasted work."""
    # Almost every node depends on a graph input, so rather than test each node, start from the
    # nodes that read none (get_attrs, creation ops) and visit a node only once one of its inputs
    # turned out constant. A heap pops them in graph order (nodes compare by position, and users
    # come after their inputs), so each node's inputs are all decided when it is visited.
    pending = [
        n
        for n in gm.graph.nodes
        if n.op == "get_attr" or (n.op == "call_function" and not n.all_input_nodes)
    ]
    queued = set(pending)
    with _Evaluator(gm, reads_buffers=any(n.op == "get_attr" for n in pending)) as evaluator:
        while pending:
            node = heapq.heappop(pending)
            if evaluator.visit(node):
                for user in node.users:
                    if user not in queued:
                        queued.add(user)
                        heapq.heappush(pending, user)
    # Creation ops evaluated on demand joined late: restore graph order (fold_constants erases
    # users before their inputs by walking it backwards).
    return dict(sorted(evaluator.values.items(), key=lambda item: item[0]))


class _Evaluator(contextlib.ExitStack):
    """Decides, node by node in graph order, which nodes are constant, and evaluates them.

    A creation op (``scalar_tensor``, ``full``: no input nodes) that other nodes read is only
    *deferred*: it is evaluated once a node reading it is about to be evaluated. Backward graphs
    have many whose readers also read graph inputs, and each evaluation costs tens of µs.
    """

    def __init__(self, gm: fx.GraphModule, *, reads_buffers: bool) -> None:
        super().__init__()
        self.gm = gm
        self.values: dict[fx.Node, torch.Tensor] = {}
        self.deferred: set[fx.Node] = set()
        # A buffer the graph writes to (a BatchNorm running stat) is not a constant: its value
        # depends on where in the graph it is read.
        self.written = mutated_roots(gm.graph) if reads_buffers else set()
        self.evaluating = False
        self._foldable_targets: dict[int, bool] = {}

    def visit(self, node: fx.Node) -> bool:
        """True if ``node`` is constant (evaluated, or deferred)."""
        if node.op == "get_attr":
            attr = getattr(self.gm, node.target, None)
            # Only small constants: their values are part of the FX index key
            # (cache/fx_index.py), so a folded result baked into the module can never be
            # served for a graph whose big constant holds other values.
            if is_inline_constant(attr) and node not in self.written:
                self.values[node] = attr
                return True
            return False
        inputs = node.all_input_nodes
        if any(n not in self.values and n not in self.deferred for n in inputs):
            return False
        if not self._evaluable(node):
            return False
        if not inputs and node.users:
            self.deferred.add(node)
            return True
        for n in inputs:  # deferred inputs are needed now
            if n in self.deferred and not self._evaluate(n):
                return False
        return self._evaluate(node)

    def _evaluate(self, node: fx.Node) -> bool:
        self.deferred.discard(node)
        if not self.evaluating:
            # Entered only once something is evaluated: entering them costs about as much as the
            # rest of the pass on a graph with nothing to fold.
            self._leave_compile_modes()
            self.evaluating = True
        args = fx.node.map_arg(node.args, lambda n: self.values[n])
        kwargs = fx.node.map_arg(node.kwargs, lambda n: self.values[n])
        try:
            result = node.target(*args, **kwargs)
        except Exception as e:  # an op that cannot run on CPU here simply stays
            log.debug("fold_constants: cannot evaluate %s (%s)", node.name, e)
            return False
        val = node.meta["val"]
        if (
            not isinstance(result, torch.Tensor)
            or result.dtype != val.dtype
            or tuple(result.shape) != tuple(val.shape)
        ):
            return False
        self.values[node] = result
        return True

    def _leave_compile_modes(self) -> None:
        """Until the evaluator closes, leave fake mode (the compiler callback runs under it),
        autocast (a caller's autocast region would change the dtypes the graph already fixed) and
        autograd."""
        self.enter_context(_disable_current_modes())
        self.enter_context(torch.autocast("cpu", enabled=False))
        self.enter_context(torch.no_grad())

    def _evaluable(self, node: fx.Node) -> bool:
        """Whether ``node`` may be evaluated once its inputs are constant."""
        if node.op != "call_function":
            return False
        # _foldable_op depends on the target alone (and on torch's effect registrations, which
        # do not change during a pass); it is the slowest of these checks.
        foldable = self._foldable_targets.get(id(node.target))
        if foldable is None:
            foldable = self._foldable_targets[id(node.target)] = _foldable_op(node)
        if not foldable:
            return False
        numel = _numel(node)
        return (
            _is_literal([node.args, node.kwargs])
            and numel is not None
            and numel <= _MAX_EVALUATED_ELEMENTS
        )


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
