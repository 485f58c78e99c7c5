"""A roofline estimate of how long a graph takes on one logical NeuronCore.

Without a device, the effect of a pass is measured here, not timed. ``estimate_module`` costs the
StableHLO text we hand to the executor or neuronx-cc (what a pass changed is visible there after
lowering, e.g. a transpose folded into a ``dot_general``). Each op costs
``max(compute time, HBM time)``: compute is FLOPs over TensorE's peak for matmuls and
convolutions, elements over the Vector/Scalar engines' throughput for everything else; HBM time
is the bytes the op reads (each distinct operand once) and writes over the core's HBM bandwidth
share. Reshapes and constants cost nothing.
This is a first-order model (no fusion, no SBUF reuse, no DMA fixed costs); it ranks rewrites, it
does not predict wall time.

Collectives cost link time instead: the bytes one rank sends over its links divided by the
link bandwidth per chip (``TrainiumTarget.links``: NeuronLink within an instance, EFA across
instances, sources in ``trainium/target.py``). See ``collective_seconds``.

Constants (``docs/trainium-reference.md`` §R2, from the Neuron SDK architecture guides), per
physical NeuronCore; one LNC=2 logical core has twice the engines and bandwidth. TensorE peaks
and HBM bandwidth come from ``trainium/target.py`` (§R2 "TensorE BF16/FP16/TF32 / FP8 / FP32" and
"HBM bandwidth share": 0.36 TB/s on trn2, min(4.9 TB/s / 8, DMA cap 0.528) = 0.53 TB/s on trn3).

The per-node numbers of an ATen FX graph that legality's HBM and graph-size estimates use
(``tensors_in``, ``nbytes``, ``MATMUL_OPS``, ``contraction_size``) live here too.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx

from ..targets import get_target

if TYPE_CHECKING:  # target.py imports this module to estimate; no import cycle at run time
    from .target import TrainiumTarget

log = logging.getLogger(__name__)

aten = torch.ops.aten

#: Vector/Scalar engine element throughput per physical core, elements/s (§R2 "VectorE":
#: 512 elem/cycle x 0.96 GHz for 16-bit types on NC-v3, 256 for the rest; NC-v4 512/256 x
#: 1.2 GHz).
ELEMENTWISE_RATE: dict[str, dict[str, float]] = {
    "trn2": {"16bit": 512 * 0.96e9, "other": 256 * 0.96e9},
    "trn3": {"16bit": 512 * 1.2e9, "other": 256 * 1.2e9},
}

_DOT_GENERAL = torch.ops.neuron_compile.dot_general.default  # passes/sink_transposes.py
#: The FX matmul ops: TensorE work, one ``[..., M, N]`` output per batch, ``K`` from
#: ``contraction_size``. Legality's instruction count tiles these by TensorE tiles.
MATMUL_OPS: frozenset[Any] = frozenset(
    {
        aten.mm.default,
        aten.bmm.default,
        aten.addmm.default,
        aten.baddbmm.default,
        _DOT_GENERAL,
    }
)


# ---- per-node numbers of an ATen FX graph (used by legality.py's estimators) -----------------


def tensors_in(value: object) -> list[torch.Tensor]:
    """The tensors in a node's ``meta["val"]`` (a tensor, or nested lists/tuples of them)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_in(v)]
    return []


def nbytes(t: torch.Tensor) -> int:
    """Bytes of ``t``; a symbolic dim counts as 1 (legality checks see unspecialized graphs)."""
    numel = 1
    for d in t.shape:
        numel *= int(d) if isinstance(d, int) else 1
    return numel * t.element_size()


def contraction_size(node: fx.Node) -> int:
    """``K`` of a ``MATMUL_OPS`` node: the lhs's last dim for the mm family (the first matrix
    operand of ``addmm``/``baddbmm``), the product of the lhs contracting dims for
    ``dot_general``; 1 when the operand carries no tensor value."""
    if node.target is _DOT_GENERAL:  # (lhs, rhs, lhs_contract, ...)
        lhs, dims = node.args[0], node.args[2]
    else:
        lhs = node.args[1 if node.target in (aten.addmm.default, aten.baddbmm.default) else 0]
        dims = (-1,)
    val = lhs.meta.get("val") if isinstance(lhs, fx.Node) else None
    if not isinstance(val, torch.Tensor):
        return 1
    return math.prod(int(val.shape[d]) for d in dims)


# ---- StableHLO modules ------------------------------------------------------------------------

#: Free ops: no engine work and no HBM traffic of their own (a reshape or bitcast is a new view
#: of the same bytes; constants are baked into the NEFF; tuples only group values).
HLO_FREE: frozenset[str] = frozenset(
    {
        "stablehlo.reshape",
        "stablehlo.bitcast_convert",
        "stablehlo.constant",
        "stablehlo.tuple",
        "stablehlo.get_tuple_element",
        "stablehlo.optimization_barrier",
        "stablehlo.after_all",
    }
)
#: Data movement: DMA only (no engine arithmetic), so bytes only.
HLO_DATA_MOVEMENT: frozenset[str] = frozenset(
    {
        "stablehlo.iota",
        "stablehlo.broadcast_in_dim",
        "stablehlo.transpose",
        "stablehlo.slice",
        "stablehlo.concatenate",
        "stablehlo.pad",
        "stablehlo.gather",
        "stablehlo.scatter",
        "stablehlo.dynamic_slice",
        "stablehlo.dynamic_update_slice",
        "stablehlo.reverse",
    }
)
#: Terminators: not ops of their own (``stablehlo.return`` ends a nested region).
_TERMINATORS = frozenset({"func.return", "stablehlo.return"})
#: Control flow whose regions are real work (unlike a reduce's scalar combiner body).
_CONTROL_FLOW = frozenset({"stablehlo.while", "stablehlo.case", "stablehlo.if"})

#: Engine passes over the elements of one fused ``AwsNeuron*`` kernel (the built-in custom calls
#: of ``docs/trainium-reference.md`` §R8 that ``trainium/kernels/fused.py`` emits). This is our
#: first-order assumption, not a measured number: softmax = max, exp + sum, scale; rmsnorm = sum
#: of squares, scale; gelu/silu = one activation pass; each backward = recompute + multiply by the
#: incoming grad.
CUSTOM_CALL_PASSES: dict[str, int] = {
    "AwsNeuronSoftmax": 3,
    "AwsNeuronSoftmaxBackward": 2,
    "AwsNeuronGelu": 1,
    "AwsNeuronGeluApprxTanh": 1,
    "AwsNeuronGeluBackward": 2,
    "AwsNeuronSilu": 1,
    "AwsNeuronSiluBackward": 2,
    "AwsNeuronRmsNorm": 2,
}


@dataclass(frozen=True)
class OpCost:
    """Roofline cost of one StableHLO op (``op_name`` is the MLIR op name; for a custom call,
    ``stablehlo.custom_call@Target``)."""

    op_name: str
    flops: float
    bytes: float
    seconds: float
    bound: str  # "compute" | "memory" | "link" (a collective) | "free"


@dataclass(frozen=True)
class ModuleCost:
    """Estimated cost of a StableHLO module on one logical core of ``target``.

    ``ops`` lists every op the walk visits in program order: the ops of ``@main``, with each
    ``func.call`` replaced by its callee's ops and each while/case/if followed by the ops of its
    regions (see ``estimate_module``). ``op_count == len(ops)``: every op except terminators
    (``func.return``, ``stablehlo.return``) and ``func.call``; free ops (constants, reshapes)
    are counted. Ops inside a reduce-like op's combiner region are part of that op, not counted.
    """

    target: str
    lnc: int
    ops: tuple[OpCost, ...]
    seconds: float
    flops: float
    bytes: float
    op_count: int


def _elem_bytes(et: Any) -> int:
    from jaxlib.mlir import ir

    if isinstance(et, ir.ComplexType):
        return 2 * _elem_bytes(et.element_type)
    width = getattr(et, "width", None)
    return 8 if width is None else max(1, width // 8)  # index: 8 bytes; i1 is stored as a byte


def _peak_key(et: Any) -> str:
    """``TrainiumTarget.peak_flops`` key of an MLIR element type."""
    name = str(et)
    if name == "bf16":
        return "bfloat16"
    if name == "f16":
        return "float16"
    return "float8" if name.startswith("f8") else "float32"


def _tensor(value: Any) -> tuple[int, int, Any] | None:
    """(elements, bytes, element type) of a ranked tensor value, None for tokens and tuples."""
    from jaxlib.mlir import ir

    t = value.type
    if not isinstance(t, ir.RankedTensorType):
        return None
    elems = math.prod(max(d, 1) for d in t.shape)  # a dynamic dim (negative) counts as 1
    return elems, elems * _elem_bytes(t.element_type), t.element_type


# ---- collectives ------------------------------------------------------------------------------

#: Every StableHLO collective (``stablehlo.`` dropped), documented for Trainium or not.
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "collective_permute",
    "collective_broadcast",
    "send",
    "recv",
)
#: The collectives the cost model prices by link time (``collective_seconds``).
COLLECTIVE_OPS: frozenset[str] = frozenset(f"stablehlo.{name}" for name in COLLECTIVES)
_MODULE_INT_ATTR = r"{}\s*=\s*(\d+)"
_DENSE_SHAPE = re.compile(r"tensor<(\d+)x(\d+)xi64>")


def replica_groups(printed: str | None) -> tuple[tuple[int, ...], ...]:
    """The groups of a printed ``replica_groups`` (or ``source_target_pairs``) attribute,
    ``dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>``; ``-1`` entries pad shorter groups and are
    dropped; ``()`` when absent or empty (``dense<> : tensor<0x0xi64>``: one group of every
    replica)."""
    if not printed:
        return ()
    shape = _DENSE_SHAPE.search(printed)
    if shape is None:
        return ()
    rows, cols = int(shape.group(1)), int(shape.group(2))
    body = printed.split(" : ", 1)[0]
    values = [int(v) for v in re.findall(r"-?\d+", body)]
    if len(values) == 1 and rows * cols > 1:  # a splat: dense<0> : tensor<1x2xi64>
        values = values * rows * cols
    return tuple(tuple(v for v in values[r * cols : (r + 1) * cols] if v >= 0) for r in range(rows))


def module_world(text: str) -> int | None:
    """``mhlo.num_replicas`` of a module (times ``mhlo.num_partitions``, which is 1 in ours):
    the ranks its replica groups number; None when the module does not say."""
    head = text.split("func.func", 1)[0]  # the module's attributes come before its functions
    replicas = re.search(_MODULE_INT_ATTR.format(r"mhlo\.num_replicas"), head)
    if replicas is None:
        return None
    partitions = re.search(_MODULE_INT_ATTR.format(r"mhlo\.num_partitions"), head)
    return int(replicas.group(1)) * (int(partitions.group(1)) if partitions else 1)


def link_share(kind: str, group_size: int) -> float:
    """Share of a collective's buffer each rank sends, ``n = group_size`` (ring algorithms):
    all_reduce ``2(n-1)/n`` (a reduce-scatter then an all-gather); all_gather, reduce_scatter and
    all_to_all ``(n-1)/n``; collective_permute, collective_broadcast, send and recv the buffer
    once. The buffer is the full tensor: all_gather's result, every other op's operand. A group
    of one moves nothing."""
    kind = kind.removeprefix("stablehlo.")
    n = group_size
    if n <= 1:
        return 0.0
    if kind == "all_reduce":
        return 2 * (n - 1) / n
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def link_bandwidth(target: TrainiumTarget | str, group_size: int) -> float:
    """Bytes/s per chip for a group of ``group_size`` ranks (one rank per chip): NeuronLink when
    the group fits one instance (``links.chips_per_node``), else EFA."""
    links = _as_target(target).links
    return links.intra_node if group_size <= links.chips_per_node else links.inter_node


def collective_seconds(
    kind: str, buffer_bytes: float, group_size: int, target: TrainiumTarget | str = "trn2"
) -> float:
    """Estimated time of one collective: ``link_share(kind, n) * buffer_bytes`` over
    ``link_bandwidth(target, n)``. No latency term, no overlap with compute."""
    share = link_share(kind, group_size)
    return 0.0 if share == 0 else share * buffer_bytes / link_bandwidth(target, group_size)


class _Walker:
    """Costs the ops of one parsed module; ``funcs`` maps symbol names to ``func.func`` ops."""

    def __init__(
        self, target: TrainiumTarget, lnc: int, funcs: dict[str, Any], world: int = 1
    ) -> None:
        self.target, self.lnc, self.funcs = target, lnc, funcs
        self.hbm = target.hbm_bandwidth * lnc
        self.world = world  # ranks of an empty replica_groups (mhlo.num_replicas)

    def block(self, block: Any, depth: int = 0) -> Iterator[OpCost]:
        for view in block.operations:
            op = view.operation
            name = op.name
            if name in _TERMINATORS:
                continue
            if name == "func.call":
                callee = self.funcs.get(str(op.attributes["callee"]).lstrip("@"))
                if callee is not None and depth < 32:  # recursion guard; StableHLO has none
                    yield from self.block(callee.regions[0].blocks[0], depth + 1)
                continue
            yield self.op_cost(op)
            if name in _CONTROL_FLOW:
                yield from self.control_flow(op, depth)

    def control_flow(self, op: Any, depth: int) -> Iterator[OpCost]:
        """While: one trip of condition and body (the trip count is not known statically; this
        is a lower bound). Case/if: only one branch runs, so the most expensive one."""
        regions = [list(self.block(r.blocks[0], depth + 1)) for r in op.regions if r.blocks]
        if op.name == "stablehlo.while":
            for costs in regions:
                yield from costs
        elif regions:
            yield from max(regions, key=lambda cs: math.fsum(c.seconds for c in cs))

    def op_cost(self, op: Any) -> OpCost:
        from jaxlib.mlir import ir

        name = op.name
        if name in HLO_FREE or name in _CONTROL_FLOW:
            return OpCost(name, 0.0, 0.0, 0.0, "free")
        ins: list[Any] = []
        for v in op.operands:  # each distinct SSA value read once (`%x * %x` reads x once)
            if not any(v == seen for seen in ins):
                ins.append(v)
        operands = [t for v in ins if (t := _tensor(v)) is not None]
        results = [t for v in op.results if (t := _tensor(v)) is not None]
        tensors = operands + results
        if name in COLLECTIVE_OPS:
            return self._collective_cost(op, operands, results)
        moved = float(sum(t[1] for t in tensors))
        memory_s = moved / self.hbm
        flops, compute_s = 0.0, 0.0
        if name == "stablehlo.custom_call":
            target = ir.StringAttr(op.attributes["call_target_name"]).value
            name = f"{name}@{target}"
            passes = CUSTOM_CALL_PASSES.get(target, 0)  # user NKI kernels, unknown: bytes only
            if passes and tensors:
                elems = max(t[0] for t in tensors)
                flops = float(elems * passes)
                compute_s = flops / self._vector_rate(tensors)
        elif name in ("stablehlo.dot_general", "stablehlo.dot", "stablehlo.convolution"):
            flops = self._contraction_flops(op)
            # TensorE runs at the operands' precision and accumulates in fp32 PSUM, so a bf16
            # matmul with an f32 result (preferred_element_type) still runs at the bf16 peak.
            et = operands[0][2] if operands else (results[0][2] if results else None)
            peak = self.target.peak_flops_per_logical_core(_peak_key(et), self.lnc)
            compute_s = flops / peak
        elif name not in HLO_DATA_MOVEMENT and tensors:
            # Elementwise, compare, select, convert, reduce, ...: one engine pass over the
            # larger of inputs and outputs (a reduce's combiner body is this pass).
            flops = float(max(t[0] for t in tensors))
            compute_s = flops / self._vector_rate(tensors)
        seconds = max(compute_s, memory_s)
        bound = "free" if seconds == 0 else ("compute" if compute_s >= memory_s else "memory")
        return OpCost(name, flops, moved, seconds, bound)

    def _collective_cost(self, op: Any, operands: list, results: list) -> OpCost:
        """Link time of a collective (``collective_seconds``); ``bytes`` are the bytes one rank
        sends over its links, not HBM traffic."""
        name = op.name
        full = results if name in ("stablehlo.all_gather", "stablehlo.recv") else operands
        buffer = float(sum(t[1] for t in full))
        key = "source_target_pairs" if "source_target_pairs" in op.attributes else "replica_groups"
        groups = replica_groups(str(op.attributes[key]) if key in op.attributes else None)
        if name == "stablehlo.collective_permute":
            n = len({r for pair in groups for r in pair})
        else:
            n = max((len(g) for g in groups), default=self.world)
        if name in ("stablehlo.send", "stablehlo.recv"):
            n = max(n, 2)  # point to point: one peer
        moved = link_share(name, n) * buffer
        seconds = collective_seconds(name, buffer, n, self.target)
        return OpCost(name, 0.0, moved, seconds, "link" if seconds else "free")

    def _vector_rate(self, tensors: list[tuple[int, int, Any]]) -> float:
        """VectorE perf mode needs 16-bit data throughout: 16-bit rate only when no operand or
        result is wider than 2 bytes."""
        wide = max(_elem_bytes(t[2]) for t in tensors) > 2
        return ELEMENTWISE_RATE[self.target.name]["other" if wide else "16bit"] * self.lnc

    @staticmethod
    def _contraction_flops(op: Any) -> float:
        from jaxlib.mlir.dialects import stablehlo

        out_elems = math.prod(max(d, 1) for d in op.results[0].type.shape)
        lhs, rhs = op.operands[0].type.shape, op.operands[1].type.shape
        if op.name == "stablehlo.dot_general":
            dims = stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
            k = math.prod(lhs[d] for d in dims.lhs_contracting_dimensions)
        elif op.name == "stablehlo.dot":
            k = lhs[-1]
        else:
            # Per output element: kernel window x input channels of its group. The kernel's
            # input-feature dim already is in-channels / feature_group_count.
            dims = stablehlo.ConvDimensionNumbers(op.attributes["dimension_numbers"])
            window = math.prod(rhs[d] for d in dims.kernel_spatial_dimensions)
            k = window * rhs[dims.kernel_input_feature_dimension]
        return 2.0 * out_elems * k


def _as_target(target: TrainiumTarget | str) -> TrainiumTarget:
    t = get_target(target) if isinstance(target, str) else target
    if not callable(getattr(t, "peak_flops_per_logical_core", None)):  # a TrainiumTarget
        raise ValueError(f"no cost model for target {t.name!r}; use trn2 or trn3")
    return t


def estimate_module(text: str, target: TrainiumTarget | str = "trn2", lnc: int = 1) -> ModuleCost:
    """Roofline estimate of the StableHLO module ``text`` (generic or pretty form) on one
    logical core of ``target`` (``lnc`` physical cores: engines and bandwidth scale by it).

    Per op: ``seconds = max(compute, HBM bytes / bandwidth)``, HBM bytes = every distinct tensor
    operand plus every result. Compute: ``dot_general`` 2 x result elements x contracting size
    and ``convolution`` 2 x output elements x kernel window x in-channels per group, both on
    TensorE's peak for the operand dtype; custom calls in ``CUSTOM_CALL_PASSES`` elements x
    passes on the Vector/Scalar rate (``ELEMENTWISE_RATE``); other custom calls (user NKI kernels
    via ``AwsNeuronCustomNativeKernel``: their cost is theirs to know) and data movement
    (``HLO_DATA_MOVEMENT``) bytes only; ``HLO_FREE`` ops nothing; everything else one Vector
    pass over its largest operand or result. Walks ``@main`` (``func.call`` inlined), see
    ``ModuleCost`` for what ``op_count`` counts. Deterministic: program order, no identity.
    """
    from jaxlib.mlir import ir

    from ..artifact import _context

    t = _as_target(target)
    with _context(), ir.Location.unknown():
        module = ir.Module.parse(text)
        funcs = {
            ir.StringAttr(op.attributes["sym_name"]).value: op.operation
            for op in module.body.operations
            if op.operation.name == "func.func"
        }
        if "main" not in funcs:
            raise ValueError("the module has no @main function")
        world = module_world(text) or 1
        ops = tuple(_Walker(t, lnc, funcs, world).block(funcs["main"].regions[0].blocks[0]))
    return ModuleCost(
        target=t.name,
        lnc=lnc,
        ops=ops,
        seconds=math.fsum(c.seconds for c in ops),
        flops=math.fsum(c.flops for c in ops),
        bytes=math.fsum(c.bytes for c in ops),
        op_count=len(ops),
    )


def estimate_for_record(text: str, target_name: str, lnc: int | None = None) -> float | None:
    """Estimated device seconds of one compiled graph for ``GraphRecord.est_device_s``.

    ``lnc=None``: the target's logical-core config (``TrainiumTarget.resolve_lnc``), since a cpu
    compile has none of its own. Never raises: an estimate must not fail a compile, so a module
    the cost model cannot read logs at debug level and gives None.
    """
    try:
        target = _as_target(target_name)
        return estimate_module(text, target, target.resolve_lnc(lnc)).seconds
    except Exception as e:  # noqa: BLE001 - see the docstring
        log.debug("no device-time estimate (%s: %s)", type(e).__name__, e)
        return None
