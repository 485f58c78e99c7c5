"""Split a graph into compiled regions and explicit CPU fallbacks.

Nodes whose lowering lookup fails run as eager ATen ops between compiled regions; each carries a
``SplitReason`` (op, why, the user's line). Compiled regions with a single compute op are not
worth a device round trip and merge back into the eager part (``CapabilityBasedPartitioner``'s
single-node filter).

Eager ops with effects (collectives, ``wait_tensor``, asserts: ``passes.effects.has_effects``) are
barriers: no compiled region holds nodes from both sides of one. The partitioner places a region
where its last node was and then sorts the graph topologically, so a region spanning a collective
would drag the collective (and every eager node after it) behind the region's later work, and two
collectives could swap. With the barriers every eager effect keeps its place relative to the others
and to all compiled work, and the fallback runs the graph's nodes in order.
"""

from __future__ import annotations

import operator
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass

import torch
import torch.fx as fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner, Partition
from torch.fx.passes.operator_support import OperatorSupportBase

from .errors import user_frame, user_source_line
from .lowering import registry
from .passes.effects import has_effects


@dataclass(frozen=True)
class SplitReason:
    """Why ``node`` runs on the CPU instead of in a compiled region."""

    op: str
    node: str
    reason: str
    where: str
    source: str | None = None

    def as_dict(self) -> dict[str, str | None]:
        return asdict(self)


def _symbolic(value: object) -> bool:
    if isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
        return True
    if isinstance(value, torch.Tensor):
        return any(isinstance(d, torch.SymInt) for d in value.shape)
    if isinstance(value, (tuple, list)):
        return any(_symbolic(v) for v in value)
    return False


def _symbolic_only(node: fx.Node) -> bool:
    return _symbolic(node.meta.get("val")) or any(
        _symbolic(arg.meta.get("val")) for arg in node.all_input_nodes
    )


def why_unsupported(node: fx.Node) -> str | None:
    """None if ``node`` can join a compiled region, else the reason it runs on the CPU."""
    # Data-dependent sizes (nonzero, masked_select, .item()) have no static shape to compile;
    # their producers and consumers stay eager.
    if _symbolic(node.meta.get("val")) or any(
        _symbolic(arg.meta.get("val")) for arg in node.all_input_nodes
    ):
        return "data-dependent (symbolic) shape or value; compiled regions need static shapes"
    why = registry.lookup(node)
    return why if isinstance(why, str) else None


def _is_supported(node: fx.Node) -> bool:
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        src = node.args[0]
        return isinstance(src, fx.Node) and _is_supported(src)
    return why_unsupported(node) is None


class _NeuronSupport(OperatorSupportBase):
    def is_node_supported(self, submodules, node: fx.Node) -> bool:
        return _is_supported(node)


def _is_bookkeeping(node: fx.Node) -> bool:
    """Symbolic-size plumbing (sym_size, Python comparisons on sizes, runtime asserts): it runs
    eagerly with its data-dependent producer but is not an op worth reporting."""
    if isinstance(node.target, torch._ops.HigherOrderOperator):
        return False  # e.g. run_with_rng_state: real work, whatever its inputs
    if not isinstance(node.target, torch._ops.OpOverload):
        return True
    name = node.target._schema.name
    return name.startswith(("aten::sym_", "aten::_assert"))


def split_reasons(gm: fx.GraphModule) -> list[SplitReason]:
    """One ``SplitReason`` per call_function node that has no usable lowering."""
    reasons = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        if _is_bookkeeping(node) and why_unsupported(node) is not None and _symbolic_only(node):
            continue
        why = why_unsupported(node)
        if why is not None:
            reasons.append(
                SplitReason(
                    str(node.target), node.name, why, user_frame(node), user_source_line(node)
                )
            )
    return reasons


def summarize(reasons: list[SplitReason]) -> str:
    """``aten.cumsum.default x2 (model.py:20 in forward)`` lines, most frequent op first."""
    counts = Counter(r.op for r in reasons)
    first_where = {}
    for r in reasons:
        first_where.setdefault(r.op, r.where)
    return "; ".join(f"{op} x{n} ({first_where[op]})" for op, n in counts.most_common())


def partition(gm: fx.GraphModule) -> tuple[fx.GraphModule, list[str]]:
    """Fuse supported regions of ``gm`` into ``call_module`` submodules (in place).

    Returns the graph and the names of the submodules to compile. Every placeholder of a
    submodule gets the ``meta["val"]`` of the value that feeds it, as lowering needs.
    """
    partitioner = CapabilityBasedPartitioner(
        gm, _NeuronSupport(), allows_single_node_partition=False
    )
    proposed = _split_at_effects(gm.graph, partitioner.propose_partitions())
    fused = partitioner.fuse_partitions(proposed)
    names = []
    for node in fused.graph.nodes:
        if node.op != "call_module":
            continue
        names.append(node.target)
        sub = fused.get_submodule(node.target)
        placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
        for ph, arg in zip(placeholders, node.args, strict=True):
            if "val" not in ph.meta and isinstance(arg, fx.Node):
                ph.meta["val"] = arg.meta.get("val")
        node.meta["val"] = _output_val(sub)
    return fused, names


def _split_at_effects(graph: fx.Graph, partitions: list[Partition]) -> list[Partition]:
    """``partitions`` cut wherever an eager op with effects lies between their nodes (see the
    module docstring); pieces left with a single compute node run eagerly, as the partitioner's
    own filter would have decided."""
    # The span between two eager effects: every node gets the number of such effects before it
    # (an effect node itself counts as after its own barrier; it is never in a partition).
    span: dict[fx.Node, int] = {}
    barriers = 0
    for node in graph.nodes:
        if node.op == "call_function" and has_effects(node) and not _is_supported(node):
            barriers += 1
        span[node] = barriers
    if not barriers:
        return partitions
    pieces: list[Partition] = []
    for partition in partitions:
        by_span: dict[int, list[fx.Node]] = defaultdict(list)
        for node in partition.nodes:
            by_span[span[node]].append(node)
        for nodes in by_span.values():
            # A subset of an acyclic partition within one span is acyclic: every path between
            # two of its nodes runs forward in graph order, so it stays inside the span.
            if sum(n.target is not operator.getitem for n in nodes) > 1:
                pieces.append(Partition(id=len(pieces), nodes=nodes))
    return pieces


def _output_val(sub: fx.GraphModule):
    out = next(n for n in sub.graph.nodes if n.op == "output")
    (vals,) = out.args
    if isinstance(vals, (tuple, list)):
        return tuple(v.meta.get("val") if isinstance(v, fx.Node) else v for v in vals)
    return vals.meta.get("val") if isinstance(vals, fx.Node) else vals


def is_fully_supported(gm: fx.GraphModule) -> bool:
    return all(_is_supported(n) for n in gm.graph.nodes if n.op == "call_function")


__all__ = ["SplitReason", "is_fully_supported", "partition", "split_reasons", "summarize"]
