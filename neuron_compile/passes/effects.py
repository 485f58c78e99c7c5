"""Shared side-effect predicates for passes: which nodes must stay, which may be merged or moved.

Every pass that deletes, merges, evaluates, rewrites or reorders nodes asks these questions (and so
does the partitioner), so the answers live in one place and err on the side of keeping a node.

Two kinds of "impure" matter. ``is_impure``: deleting the node could change behaviour
(mutations, RNG, effects). ``has_effects``: the node talks to the world outside the graph
(collectives, ``wait_tensor``, prints, asserts, ops torch registered effects for); no pass may
evaluate, fold, merge, remove, rewrite or reorder it. NOTE: torch marks only some of these
(``wait_tensor`` is in FX's side-effect set, ``all_reduce`` is not: its schema is functional), so
communication is recognised by namespace and by schema as well.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable

import torch
import torch.fx as fx
from torch._ops import HigherOrderOperator, OpOverload, OpOverloadPacket

from .graph_queries import nodes_calling_any

# NOTE: a name-based backstop for RNG ops that carry no ``nondeterministic_seeded`` tag (prims and
# rngprims variants, custom ops): merging or deleting any of them changes the random stream.
_RANDOM_NAME_PARTS = ("rand", "bernoulli", "dropout", "rng", "seed", "normal", "uniform", "poisson")
_RANDOM_NAME_PARTS += ("multinomial", "exponential", "cauchy", "geometric", "philox")
_SIDE_EFFECT_NAME_PARTS = ("assert", "print", "profiler", "record_function", "effect", "token")
#: Op namespaces whose every op communicates with other processes. The functional collectives
#: (``_c10d_functional``, its autograd twin, the legacy ``c10d_functional``) have functional
#: schemas, so nothing else tells that their result depends on every other rank.
COMMUNICATION_NAMESPACES = frozenset(
    {"_c10d_functional", "_c10d_functional_autograd", "c10d_functional", "c10d", "_dtensor"}
)
#: Schema types of TorchBind objects (``ProcessGroup``, ``Work``, ``_RecordFunction``): an op that
#: takes or returns one acts on state outside the graph.
_SCRIPT_OBJECT_TYPE = "__torch__.torch.classes."


def op_name(target: object) -> str:
    if isinstance(target, OpOverload):
        return target.name()
    return getattr(target, "__name__", str(target))


class _PerOp:
    """Memoizes a predicate of an op target by the target's identity.

    Every pass asks these questions of every node it visits, and schema lookups dominated the
    pass pipeline's time. NOTE: keyed by ``id`` rather than by the target itself, because hashing
    an ``OpOverload`` runs Python code (``OpOverload.__hash__``), which cost as much as the lookup
    saved; the entry keeps the target alive, so its ``id`` cannot be reused while cached. This also
    answers unhashable targets.
    """

    def __init__(self, predicate: Callable[[object], bool], max_entries: int = 4096) -> None:
        self._predicate = predicate
        self._max_entries = max_entries
        self._answers: dict[int, tuple[object, bool]] = {}

    def __call__(self, target: object) -> bool:
        hit = self._answers.get(id(target))
        if hit is not None and hit[0] is target:
            return hit[1]
        answer = self._predicate(target)
        if len(self._answers) < self._max_entries:
            self._answers[id(target)] = (target, answer)
        return answer


def _is_random_op(target: object) -> bool:
    if isinstance(target, OpOverload) and torch.Tag.nondeterministic_seeded in target.tags:
        return True
    if getattr(target, "_nondeterministic_seeded", False):
        return True
    name = op_name(target).lower()
    return any(part in name for part in _RANDOM_NAME_PARTS)


def op_namespace(target: object) -> str | None:
    """The operator namespace of an ``OpOverload``/``OpOverloadPacket`` (``aten``, ...), else
    None."""
    if isinstance(target, OpOverload):
        return target.namespace
    if isinstance(target, OpOverloadPacket):
        return target._qualified_op_name.split("::", 1)[0]
    return None


def _communicates(target: object) -> bool:
    if op_namespace(target) in COMMUNICATION_NAMESPACES:
        return True
    # The Python-level collectives (torch.distributed.*), should a pre-dispatch graph reach a pass.
    module = getattr(target, "__module__", None) or ""
    if not isinstance(target, OpOverload | OpOverloadPacket) and module.startswith(
        "torch.distributed"
    ):
        return True
    schema = getattr(target, "_schema", None)
    if schema is None:
        return False
    types = [str(a.type) for a in (*schema.arguments, *schema.returns)]
    return any(_SCRIPT_OBJECT_TYPE in t for t in types)


def _effectful_op(target: object) -> bool:
    if _communicates(target):
        return True
    if target is torch.ops.higher_order.with_effects:
        return True
    try:  # FX's side-effect set: wait_tensor, isend/irecv, asserts, profiler ranges, ...
        if target in fx.node._side_effectful_functions:
            return True
    except TypeError:  # an unhashable callable
        pass
    if isinstance(target, OpOverload | HigherOrderOperator):
        try:  # effects registered with torch (torch.library / _register_effectful_op)
            from torch._higher_order_ops.effects import _get_effect

            if _get_effect(target) is not None:
                return True
        except Exception:  # private API: without it, the checks above still hold
            pass
    if isinstance(target, OpOverload):
        name = op_name(target).lower()
        return any(part in name for part in _SIDE_EFFECT_NAME_PARTS)
    return False


def _mutating_op(target: object) -> bool:
    schema = getattr(target, "_schema", None)
    return bool(schema is not None and schema.is_mutable)


def _op_result_aliases_self(target: object) -> bool:
    schema = getattr(target, "_schema", None)
    return bool(schema is not None and schema.returns and schema.returns[0].alias_info is not None)


#: ``is_random`` and ``mutates`` of a ``call_function`` node, asked of its target (for passes that
#: decide per op rather than per node).
target_is_random = _PerOp(_is_random_op)
target_mutates = _PerOp(_mutating_op)
#: ``communicates`` and ``has_effects`` asked of a ``call_function`` node's target.
target_communicates = _PerOp(_communicates)
target_has_effects = _PerOp(_effectful_op)
_result_aliases_self = _PerOp(_op_result_aliases_self)


def communicates(node: fx.Node) -> bool:
    """True if ``node`` is a collective or point-to-point op (or waits on one)."""
    return node.op == "call_function" and target_communicates(node.target)


def has_effects(node: fx.Node) -> bool:
    """True if ``node`` has an effect outside the graph's data flow: communication (every
    ``_c10d_functional``/``c10d`` op, ``wait_tensor``), an op torch marks side-effectful or
    registers an effect for, ``with_effects``, asserts and prints.

    No pass may evaluate, fold, merge, remove, rewrite or reorder such a node, and no compiled
    region may span one that runs eagerly (``partition``). A collective folded at compile time
    keeps this process's unreduced value; one removed or reordered deadlocks or mismatches ranks.
    """
    return node.op == "call_function" and target_has_effects(node.target)


def without_effects(targets: Iterable[object]) -> list[object]:
    """``targets`` minus the ops with effects: the ops a rewriting pass may look for.

    Each pass finds its candidates by target (``graph_queries.nodes_calling``); filtering the
    targets first keeps an op that torch (or a library) marks effectful out of every rewrite,
    at no per-node cost.
    """
    return [t for t in targets if not target_has_effects(t)]


def is_random(node: fx.Node) -> bool:
    """True if ``node`` draws from (or saves/restores) an RNG state."""
    if node.op != "call_function":
        return False
    return target_is_random(node.target)


def mutates(node: fx.Node) -> bool:
    """True if ``node`` writes to one of its arguments (in-place, ``out=``, ``copy_``, ...)."""
    target = node.target
    if node.op == "call_method":
        return isinstance(target, str) and target.endswith("_")
    if node.op != "call_function":
        return False
    return target_mutates(target)


def mutated_args(node: fx.Node) -> list[fx.Node]:
    """The argument nodes ``node`` writes to (all tensor args when the schema cannot tell)."""
    if not mutates(node):
        return []
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return [a for a in node.all_input_nodes]
    written: list[fx.Node] = []
    for i, arg in enumerate(schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
        values = value if isinstance(value, (list, tuple)) else [value]
        written += [v for v in values if isinstance(v, fx.Node)]
    return written


def is_impure(node: fx.Node) -> bool:
    """True if deleting ``node`` could change behaviour even when nothing reads its result.

    Placeholders, the output, mutations, RNG ops, everything ``has_effects`` (collectives,
    ``wait_tensor``, ``with_effects``, asserts), every other higher-order op and module calls all
    count as impure.
    """
    if node.op in ("placeholder", "output", "call_module"):
        return True
    if node.op == "get_attr":
        return False
    if mutates(node) or is_random(node) or has_effects(node):
        return True
    if node.op == "call_method":
        return False
    target = node.target
    if target is operator.getitem:
        return False
    if isinstance(target, HigherOrderOperator) or not isinstance(target, OpOverload):
        # NOTE: Python callables other than getitem (symbolic-shape helpers, asserts,
        # user functions) and higher-order ops are kept unless we know they are pure.
        return not _is_pure_python(target)
    return node.is_impure()


_PURE_PYTHON = {
    operator.add,
    operator.sub,
    operator.mul,
    operator.truediv,
    operator.floordiv,
    operator.mod,
    operator.neg,
    operator.pow,
}


def _is_pure_python(target: object) -> bool:
    return target in _PURE_PYTHON


def alias_root(node: fx.Node) -> fx.Node:
    """Follow view/alias ops (schemas whose result aliases ``self``) and ``getitem`` back to the
    node that owns the storage."""
    seen = 0
    while node.op == "call_function" and node.args and isinstance(node.args[0], fx.Node):
        if node.target is operator.getitem:  # an element of a multi-output op's result
            node = node.args[0]
            continue
        if not _result_aliases_self(node.target):  # in-place results alias self too
            break
        node = node.args[0]
        seen += 1
        if seen > 10_000:  # pragma: no cover - defensive against malformed graphs
            break
    return node


def mutating_nodes(graph: fx.Graph) -> list[fx.Node]:
    """The nodes of ``graph`` for which ``mutates`` is True, in graph order."""
    # Asked per distinct op rather than per node: most graphs have a few dozen ops and no mutation.
    found = nodes_calling_any(graph, target_mutates)
    in_place_methods = [n for n in graph.find_nodes(op="call_method") if mutates(n)]
    return sorted(found + in_place_methods) if in_place_methods else found


def mutated_roots(graph: fx.Graph, mutations: list[fx.Node] | None = None) -> set[fx.Node]:
    """Base tensors that some node in ``graph`` writes to, directly or through a view
    (``mutations``: ``mutating_nodes(graph)`` when the caller has it already)."""
    roots: set[fx.Node] = set()
    for node in mutating_nodes(graph) if mutations is None else mutations:
        for arg in mutated_args(node):
            roots.add(alias_root(arg))
    return roots
