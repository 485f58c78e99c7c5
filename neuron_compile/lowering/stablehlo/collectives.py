"""torch's functional collectives as StableHLO collectives, inside the compiled module.

``_c10d_functional`` ops (what DTensor, funcol and compiled autograd's DDP reducer trace to) and
their autograd twins become ``stablehlo.all_reduce`` / ``all_gather`` / ``reduce_scatter`` /
``all_to_all``; ``wait_tensor`` is the identity (a StableHLO collective is synchronous). The group
name becomes the full ``replica_groups`` partition (``neuron_compile.collectives``), identical on
every rank, so all ranks compile one module. Each op gets its own channel handle, numbered in
graph order; ``ModuleContext.collectives`` records them (the key, the executor and the target's
legality read it).

Collectives are never folded, reordered or dropped: the passes treat them as effects
(``passes.effects``), and these rules emit each one exactly where the graph has it.
"""

from __future__ import annotations

import operator

import torch
import torch.distributed._functional_collectives  # noqa: F401  (registers _wrap_tensor_autograd)
import torch.fx as fx

from ... import collectives
from ..context import CollectiveInfo, LoweringContext
from ..emit import TensorType, Value
from ..registry import Lowering, Support, lookup, lowering

c10d = torch.ops._c10d_functional
c10d_autograd = torch.ops._c10d_functional_autograd

#: c10d reduce-op names -> the StableHLO op combining two partial values.
_COMBINE = {"sum": "add", "avg": "add", "product": "multiply", "max": "maximum", "min": "minimum"}
_BITWISE = {"band": "and", "bor": "or", "bxor": "xor"}


def _groups_reason(group_name: object) -> str | None:
    try:
        collectives.replica_groups(str(group_name))
    except collectives.GroupPartitionError as e:
        return str(e)
    return None


def _reduce_reason(reduce_op: object, dtype: torch.dtype) -> str | None:
    op = str(reduce_op).lower()
    if op in _BITWISE and not (dtype.is_floating_point or dtype.is_complex):
        return None
    if op == "avg" and not dtype.is_floating_point:
        return f"an 'avg' reduction of {dtype} (c10d divides integers in its own way)"
    if op not in _COMBINE:
        return f"reduce op {reduce_op!r} (lowered: {', '.join(sorted(_COMBINE))}, bitwise on ints)"
    if dtype.is_complex:
        return f"a collective on {dtype}"
    return None


def _input_dtypes(node: fx.Node) -> list[torch.dtype]:
    """The dtypes of the collective's input (a list of them for the ``_coalesced`` forms)."""
    inputs = node.args[0] if isinstance(node.args[0], (list, tuple)) else [node.args[0]]
    return [x.meta["val"].dtype for x in inputs]


def _supports_group_at(index: int):
    def supports(node: fx.Node) -> str | None:
        return _groups_reason(node.args[index])

    return supports


def _supports_reduction(op_index: int, group_index: int):
    def supports(node: fx.Node) -> str | None:
        for dtype in _input_dtypes(node):
            reason = _reduce_reason(node.args[op_index], dtype)
            if reason is not None:
                return reason
        return _groups_reason(node.args[group_index])

    return supports


def _with_rows(supports: Support) -> Support:
    """``supports``, and every input has rows: StableHLO rejects an ``all_gather`` or a
    ``reduce_scatter`` over a zero-size dimension, where c10d exchanges the empty tensors."""

    def check(node: fx.Node) -> str | None:
        inputs = node.args[0] if isinstance(node.args[0], (list, tuple)) else [node.args[0]]
        for x in inputs:
            shape = x.meta["val"].shape
            if len(shape) and shape[0] == 0:
                return f"{node.target} of a tensor of shape {tuple(shape)} (no rows)"
        return supports(node)

    return check


def _supports_all_to_all(node: fx.Node) -> str | None:
    x = node.args[0].meta["val"]
    out_sizes, in_sizes, group_name = node.args[1], node.args[2], node.args[3]
    reason = _groups_reason(group_name)
    if reason is not None:
        return reason
    size = len(collectives.replica_groups(str(group_name))[0])
    if x.dim() == 0 or x.shape[0] % size:
        return f"all_to_all_single of a tensor of shape {tuple(x.shape)} over {size} ranks"
    even = [x.shape[0] // size] * size
    for sizes in (out_sizes, in_sizes):
        if sizes and [int(s) for s in sizes] != even:
            return f"all_to_all_single with uneven splits {list(sizes)} (StableHLO splits evenly)"
    return None


def _attrs(ctx: LoweringContext, kind: str, group_name: object) -> tuple[str, int]:
    """The ``replica_groups`` and ``channel_handle`` attributes of one collective; records it.

    ``all_to_all`` gets no channel handle: XLA reads one there as cross-partition, where its
    groups would name partitions (one per module here), not replicas (ranks)."""
    groups = collectives.replica_groups(str(group_name))
    module = ctx.module
    channel = len(module.collectives) + 1
    module.collectives.append(CollectiveInfo(kind, str(group_name), groups, channel))
    rows = ", ".join("[" + ", ".join(map(str, g)) + "]" for g in groups)
    attrs = f"replica_groups = dense<[{rows}]> : tensor<{len(groups)}x{len(groups[0])}xi64>"
    if kind != "all_to_all":
        attrs = f"channel_handle = #stablehlo.channel_handle<handle = {channel}, type = 1>, {attrs}"
    return attrs, len(groups[0])


def _combiner(ctx: LoweringContext, reduce_op: str, dtype: torch.dtype) -> list[str]:
    op = str(reduce_op).lower()
    name = _BITWISE.get(op) or _COMBINE[op]
    scalar = TensorType((), dtype)
    return ctx.emit.region([scalar, scalar], lambda a, b: [ctx.emit.binary(name, a, b)])


def _in_order(ctx: LoweringContext, x: Value) -> Value:
    """``x`` behind an ``optimization_barrier``, tied to the module's previous collective.

    Two things the compiler must not do, because torch's graphs differ between ranks (a shard
    padded on one rank only, each rank's own embedding offset, ``dist.get_rank()`` baked in as
    a constant), while XLA assumes every replica runs the same module:

    - fold a collective whose operand it sees as a constant: XLA's algebraic simplifier turns
      ``all_reduce(sum)`` of a constant into the constant times the group size, which is wrong
      when the constant is this rank's own;
    - order independent collectives differently on different ranks: two all-gathers would pair
      up crosswise, a crash when their sizes differ and silently swapped data when they do not.

    The barrier's outputs are opaque to the simplifier, and taking the previous collective's
    result as an operand puts this collective after it in graph order (XLA CPU keeps the
    barriers to the scheduler: ``runtime/distributed.py``)."""
    previous = ctx.module.last_collective
    operands = [x] if previous is None else [x, previous]
    return ctx.emit.op("optimization_barrier", operands, [v.type for v in operands])[0]


def _done(ctx: LoweringContext, out: Value) -> Value:
    ctx.module.last_collective = out
    return out


def _all_reduce(ctx: LoweringContext, x: Value, reduce_op: str, group_name: object) -> Value:
    attrs, size = _attrs(ctx, "all_reduce", group_name)
    regions = [_combiner(ctx, reduce_op, x.dtype)]
    x = _in_order(ctx, x)
    out = _done(ctx, ctx.emit.op("all_reduce", [x], [x.type], attrs, regions=regions)[0])
    if str(reduce_op).lower() == "avg":  # c10d's avg: the sum divided by the group size
        out = ctx.emit.binary("divide", out, ctx.emit.full(size, x.shape, x.dtype))
    return out


def _all_gather(ctx: LoweringContext, x: Value, group_size: int, group_name: object) -> Value:
    attrs, size = _attrs(ctx, "all_gather", group_name)
    if x.rank == 0:  # c10d gathers a 0-d tensor into a vector of group_size
        x = ctx.emit.reshape(x, (1,))
    out = x.type.with_shape((x.shape[0] * size, *x.shape[1:]))
    x = _in_order(ctx, x)
    return _done(ctx, ctx.emit.op1("all_gather", [x], out, f"all_gather_dim = 0 : i64, {attrs}"))


def _reduce_scatter(
    ctx: LoweringContext, x: Value, reduce_op: str, group_size: int, group_name: object
) -> Value:
    attrs, size = _attrs(ctx, "reduce_scatter", group_name)
    out = x.type.with_shape((x.shape[0] // size, *x.shape[1:]))
    regions = [_combiner(ctx, reduce_op, x.dtype)]
    x = _in_order(ctx, x)
    result = ctx.emit.op(
        "reduce_scatter", [x], [out], f"scatter_dimension = 0 : i64, {attrs}", regions=regions
    )[0]
    result = _done(ctx, result)
    if str(reduce_op).lower() == "avg":
        result = ctx.emit.binary("divide", result, ctx.emit.full(size, out.shape, x.dtype))
    return result


def _all_to_all(
    ctx: LoweringContext, x: Value, out_sizes: list, in_sizes: list, group_name: object
) -> Value:
    attrs, size = _attrs(ctx, "all_to_all", group_name)
    dims = f"split_dimension = 0 : i64, concat_dimension = 0 : i64, split_count = {size} : i64"
    x = _in_order(ctx, x)
    return _done(ctx, ctx.emit.op1("all_to_all", [x], x.type, f"{dims}, {attrs}"))


@lowering(c10d.all_reduce.default, supports=_supports_reduction(1, 2))
def _lower_all_reduce(ctx: LoweringContext, x: Value, reduce_op: str, group_name: object) -> Value:
    return _all_reduce(ctx, x, reduce_op, group_name)


@lowering(c10d.all_reduce_coalesced.default, supports=_supports_reduction(1, 2))
def _lower_all_reduce_coalesced(
    ctx: LoweringContext, xs: list[Value], reduce_op: str, group_name: object
) -> list[Value]:
    return [_all_reduce(ctx, x, reduce_op, group_name) for x in xs]


@lowering(
    c10d.all_gather_into_tensor.default,
    c10d_autograd.all_gather_into_tensor.default,
    supports=_with_rows(_supports_group_at(2)),
)
def _lower_all_gather(ctx: LoweringContext, x: Value, group_size: int, group_name: object) -> Value:
    return _all_gather(ctx, x, group_size, group_name)


@lowering(c10d.all_gather_into_tensor_coalesced.default, supports=_with_rows(_supports_group_at(2)))
def _lower_all_gather_coalesced(
    ctx: LoweringContext, xs: list[Value], group_size: int, group_name: object
) -> list[Value]:
    return [_all_gather(ctx, x, group_size, group_name) for x in xs]


@lowering(
    c10d.reduce_scatter_tensor.default,
    c10d_autograd.reduce_scatter_tensor.default,
    supports=_with_rows(_supports_reduction(1, 3)),
)
def _lower_reduce_scatter(
    ctx: LoweringContext, x: Value, reduce_op: str, group_size: int, group_name: object
) -> Value:
    return _reduce_scatter(ctx, x, reduce_op, group_size, group_name)


@lowering(
    c10d.reduce_scatter_tensor_coalesced.default, supports=_with_rows(_supports_reduction(1, 3))
)
def _lower_reduce_scatter_coalesced(
    ctx: LoweringContext, xs: list[Value], reduce_op: str, group_size: int, group_name: object
) -> list[Value]:
    return [_reduce_scatter(ctx, x, reduce_op, group_size, group_name) for x in xs]


@lowering(
    c10d.all_to_all_single.default,
    c10d_autograd.all_to_all_single.default,
    supports=_supports_all_to_all,
)
def _lower_all_to_all(
    ctx: LoweringContext, x: Value, out_sizes: list, in_sizes: list, group_name: object
) -> Value:
    return _all_to_all(ctx, x, out_sizes, in_sizes, group_name)


def _supports_broadcast(node: fx.Node) -> str | None:
    reason = _groups_reason(node.args[2])
    if reason is not None:
        return reason
    size = len(collectives.replica_groups(str(node.args[2]))[0])
    src = node.args[1]
    return None if 0 <= src < size else f"broadcast from group rank {src} of a {size}-rank group"


@lowering(c10d.broadcast.default, supports=_supports_broadcast)
def _lower_broadcast(ctx: LoweringContext, x: Value, src: int, group_name: object) -> Value:
    """StableHLO has no broadcast collective: gather every rank's tensor and keep ``src``'s, an
    exact copy (an all-reduce of zeros elsewhere would turn ``-0.0`` into ``0.0``). ``src`` is
    the rank within the group, as c10d's ``BroadcastOptions.rootRank`` takes it."""
    flat = ctx.emit.reshape(x, (1, *x.shape))
    gathered = _all_gather(ctx, flat, 0, group_name)
    start = [src] + [0] * x.rank
    picked = ctx.emit.slice(gathered, start, [src + 1, *x.shape], [1] * (x.rank + 1))
    return ctx.emit.reshape(picked, x.shape)


def _supports_wait(node: fx.Node) -> str | None:
    """A wait on a collective lowered with it: the collective's result (or an element of a
    coalesced one's) from a node that has a rule. A collective that runs eagerly (or before this
    graph) is still in flight in c10d, which must do the waiting."""
    src = node.args[0]
    if isinstance(src, fx.Node) and src.target is operator.getitem:
        src = src.args[0]
    if isinstance(src, fx.Node) and src.op == "call_function" and isinstance(lookup(src), Lowering):
        return None
    return "waits on a collective that runs eagerly or outside this graph"


@lowering(c10d.wait_tensor.default, c10d._wrap_tensor_autograd.default, supports=_supports_wait)
def _lower_wait(ctx: LoweringContext, x: Value) -> Value:
    """StableHLO collectives complete before their results are read: waiting is the identity."""
    return x
