"""Legality checks for trn targets: catch what neuronx-cc would reject before paying for it.

Runs on every graph (or compiled region) bound for a trn target, after lowering, on both the FX
graph (dtypes, shapes, static index values, sizes: the node and the user's line are at hand) and
the emitted StableHLO (types and custom-call targets that reach the compiler). Each rule maps a
violation to the neuronx-cc error it pre-empts (``docs/trainium-reference.md`` §R6; codes: §R7)
and raises a coded ``LegalityError`` subclass (NC501-NC513) with ``ncc_code``, ``target``,
``rule``, the FX node and the user's source line.

Requires: ``gm`` lowered to ``lowered`` (every call_function node carries ``meta["val"]``).
Guarantees: returns only if no rule found a violation; otherwise raises the first violation in
graph order, with every violation's message in the error's ``violations`` field.
"""

from __future__ import annotations

import math
import re
import shlex
from typing import TYPE_CHECKING

import torch
import torch.fx as fx

from .. import errors
from ..lowering.lower_graph import LoweredGraph
from ..lowering.registry import INT32, int64_value_beyond_int32
from . import legality_collectives, legality_conv, legality_ops, legality_windows
from .cost_model import MATMUL_OPS, contraction_size, nbytes, tensors_in
from .legality_base import Context, Rule, Violation, info, legality_rule
from .legality_ops import check_integer_datapath, is_integer_tensor

if TYPE_CHECKING:  # target.py imports this module to check; no import cycle at run time
    from .target import TrainiumTarget

aten = torch.ops.aten


def _nodes(gm: fx.GraphModule, ops: tuple[str, ...] = ("placeholder", "call_function", "get_attr")):
    return (n for n in gm.graph.nodes if n.op in ops)


def _min_max(const: torch.Tensor) -> tuple[int, int]:
    """Min and max of a real constant; the compiler callback runs under FakeTensorMode, which
    must be left to compute on real data."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        return int(const.min()), int(const.max())


# -- rules ------------------------------------------------------------------------------------


@legality_rule(
    "static_shapes",
    errors.StaticShapeViolation,
    ("NCC_EMOD025",),
    "compile with dynamic=False and pad variable dims to a few buckets (neuron_compile.bucketing)",
    source="R6.1",
)
def check_static_shapes(gm: fx.GraphModule, lowered: LoweredGraph, ctx: Context):
    """Every dimension static (NCC_EMOD025)."""
    for node in _nodes(gm):
        val = node.meta.get("val")
        if isinstance(val, torch.SymInt) or any(
            not isinstance(d, int) for t in tensors_in(val) for d in t.shape
        ):
            yield Violation(
                "static_shapes",
                errors.StaticShapeViolation,
                "NCC_EMOD025",
                f"%{node.name} has a symbolic shape {_shape(val)}",
                node,
            )


def _shape(val: object) -> str:
    ts = tensors_in(val)
    return str(list(ts[0].shape)) if ts else repr(val)


_FNUZ = {
    getattr(torch, n)
    for n in ("float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e4m3b11fnuz")
    if hasattr(torch, n)
}
_SIXTY_FOUR = {torch.int64: "int32", torch.float64: "float32"}


def _dtype_violation(dtype: torch.dtype, ctx: Context) -> tuple[type, str, str] | None:
    name = str(dtype).removeprefix("torch.")
    if dtype in _SIXTY_FOUR or dtype == torch.uint64:
        return None  # narrowed by the 64-bit policy, or not: the int64 rule checks the HLO
    if dtype.is_complex:
        return errors.DtypeViolation, "NCC_EVRF004", f"complex dtype {name}"
    if dtype in _FNUZ:
        return errors.DtypeViolation, "NCC_EVRF005", f"FP8 variant {name} (FNUZ) is unsupported"
    if name == "float8_e4m3fn" and name not in ctx.target.dtypes:
        return (
            errors.DtypeViolation,
            "NCC_EVRF051",
            f"{name} is not supported on {ctx.target.name} (trn3 and later)",
        )
    if name not in ctx.target.dtypes:
        return errors.DtypeViolation, "NCC_ESPP004", f"dtype {name} is unsupported for codegen"
    return None


@legality_rule(
    "dtypes",
    errors.DtypeViolation,
    ("NCC_EVRF004", "NCC_EVRF005", "NCC_EVRF051", "NCC_ESPP004"),
    "cast to a supported dtype (float32/bfloat16/float16/float8_e5m2, int8..int32) "
    "before the compiled region",
    source="R6.2",
)
def check_dtypes(gm: fx.GraphModule, lowered: LoweredGraph, ctx: Context):
    """dtypes the target supports: complex (EVRF004), FP8 FNUZ (EVRF005), F8E4M3FN before trn3
    (EVRF051), float4 / e8m0 and anything else (ESPP004)."""
    seen: set[torch.dtype] = set()
    for node in _nodes(gm):
        for t in tensors_in(node.meta.get("val")):
            if t.dtype in seen:
                continue
            bad = _dtype_violation(t.dtype, ctx)
            if bad is not None:
                seen.add(t.dtype)
                cls, code, what = bad
                yield Violation("dtypes", cls, code, f"%{node.name} is {what}", node)


_ATTR_DICT = re.compile(r"\{[^{}]*\}")
_TYPE_64 = re.compile(r"tensor<(?:[0-9x?]*x)?(i64|ui64|f64)>")


@legality_rule(
    "int64",
    errors.Int64Violation,
    ("NCC_EVRF062", "NCC_ESFH002"),
    "keep integer values within int32, or pass NEURON_CC_FLAGS=--native-int64=enabled",
    source="R6.3",
)
def check_int64(gm: fx.GraphModule, lowered: LoweredGraph, ctx: Context):
    """64-bit rules: int64/float64 run narrowed (the 64-bit policy), so (a) no 64-bit element
    type may remain in the module unless ``--native-int64=enabled`` on a capable target
    (EVRF062), and (b) int64 constants must fit int32 after narrowing (ESFH002)."""
    native = ctx.target.native_int64_capable and ctx.flag_value("--native-int64") == "enabled"
    for lineno, line in enumerate(lowered.text.splitlines(), 1):
        m = _TYPE_64.search(_ATTR_DICT.sub("", line))  # attribute payloads are not values
        if m and not (native and m.group(1) != "f64"):
            yield Violation(
                "int64",
                errors.Int64Violation,
                "NCC_EVRF062",
                f"a {m.group(1)} value reaches neuronx-cc: {line.strip()[:120]}",
                lowered.node_at_line(lineno),
            )
            break
    if native:
        return
    for node in _nodes(gm, ("call_function", "get_attr")):
        ts = tensors_in(node.meta.get("val"))
        if not ts or ts[0].dtype not in (torch.int64, torch.uint64):
            continue
        values: list[int] = []
        if node.op == "get_attr":
            const = getattr(gm, str(node.target), None)
            if isinstance(const, torch.Tensor) and const.numel():
                values = list(_min_max(const))
        else:  # the same rule that sends such an op to the CPU (lowering/registry.py)
            big = int64_value_beyond_int32(node)
            values = [big] if big is not None else []
        bad = [v for v in values if not INT32[0] <= v <= INT32[1]]
        if bad:
            yield Violation(
                "int64",
                errors.Int64Violation,
                "NCC_ESFH002",
                f"int64 constant {bad[0]} of %{node.name} does not fit int32 (the 64-bit policy "
                "narrows int64 to int32)",
                node,
            )


_CUSTOM_CALL = re.compile(r'stablehlo\.custom_call\s*@([\w.$\-]+)|call_target_name\s*=\s*"([^"]+)"')


@legality_rule(
    "custom_calls",
    errors.CustomCallViolation,
    ("NCC_EHCA005",),
    "only neuronx-cc's built-in custom-call targets are accepted; this is a "
    "lowering bug unless you registered the custom call yourself",
    source="R6.5",
)
def check_custom_calls(gm: fx.GraphModule, lowered: LoweredGraph, ctx: Context):
    """Only neuronx-cc's built-in custom-call targets (EHCA005 / EVRF015)."""
    for lineno, line in enumerate(lowered.text.splitlines(), 1):
        m = _CUSTOM_CALL.search(line)
        if m:
            name = m.group(1) or m.group(2)
            if name not in ctx.target.custom_calls:
                yield Violation(
                    "custom_calls",
                    errors.CustomCallViolation,
                    "NCC_EHCA005",
                    f"custom-call target {name!r} is not accepted by neuronx-cc",
                    lowered.node_at_line(lineno),
                )


#: ops that keep every index value (layout / copies), followed to find a static index source.
_VALUE_PRESERVING = {
    aten.view.default,
    aten._unsafe_view.default,
    aten.reshape.default,
    aten.unsqueeze.default,
    aten.squeeze.dim,
    aten.squeeze.default,
    aten.expand.default,
    aten.clone.default,
    aten._to_copy.default,
    aten.permute.default,
    aten.t.default,
    aten.alias.default,
    aten.lift_fresh_copy.default,
}


def _static_range(node: object, gm: fx.GraphModule, depth: int = 0) -> tuple[int, int] | None:
    """(min, max) of an index tensor whose values are known at compile time, else None."""
    if not isinstance(node, fx.Node) or depth > 16:
        return None
    if node.op == "get_attr":
        const = getattr(gm, str(node.target), None)
        if isinstance(const, torch.Tensor) and const.numel() and is_integer_tensor(const):
            return _min_max(const)
        return None
    if node.op != "call_function":
        return None
    if node.target in _VALUE_PRESERVING:
        return _static_range(node.args[0], gm, depth + 1)
    if node.target in (aten.arange.default, aten.arange.start, aten.arange.start_step):
        nums = [a for a in node.args if isinstance(a, (int, float))]
        start, end, step = (0, nums[0], 1) if len(nums) == 1 else (*nums[:2], (nums + [1])[2])
        n = max(0, math.ceil((end - start) / step))
        if n == 0:
            return None
        last = start + (n - 1) * step
        return int(min(start, last)), int(max(start, last))
    return None


# op -> (operand holding the indexed dim, index argument position, dim position or fixed dim)
_GATHERS = {
    aten.embedding.default: (0, 1, 0),
    aten.index_select.default: (0, 2, "arg1"),
    aten.gather.default: (0, 2, "arg1"),
}
_SCATTERS = {
    aten.scatter.src: (0, 2, "arg1"),
    aten.scatter.value: (0, 2, "arg1"),
    aten.scatter_add.default: (0, 2, "arg1"),
    aten.index_copy.default: (0, 2, "arg1"),
    aten.index_add.default: (0, 2, "arg1"),
}


@legality_rule(
    "index_range",
    errors.IndexRangeViolation,
    ("NCC_EVRF056", "NCC_EVRF031"),
    "the index is out of range of the indexed dim (e.g. a sequence longer than "
    "the position-embedding table): shorten the input or grow the table",
    source="R6.6",
)
def check_index_range(gm: fx.GraphModule, lowered: LoweredGraph, ctx: Context):
    """Static gather/scatter indices (constants, ``arange``) within the indexed dim: EVRF056
    (gather; e.g. a sequence longer than the position-embedding table) and EVRF031 (scatter)."""
    for node in _nodes(gm, ("call_function",)):
        if node.target in _GATHERS:
            spec, code, kind = _GATHERS[node.target], "NCC_EVRF056", "gather"
        elif node.target in _SCATTERS:
            spec, code, kind = _SCATTERS[node.target], "NCC_EVRF031", "scatter"
        elif node.target in (aten.index.Tensor, aten.index_put.default):
            spec, code = None, "NCC_EVRF056" if node.target is aten.index.Tensor else "NCC_EVRF031"
            kind = "gather" if node.target is aten.index.Tensor else "scatter"
        else:
            continue
        src = node.args[0]
        src_val = src.meta.get("val") if isinstance(src, fx.Node) else None
        if not isinstance(src_val, torch.Tensor):
            continue
        checks: list[tuple[object, int]] = []
        if spec is None:
            checks = [(idx, d) for d, idx in enumerate(node.args[1]) if idx is not None]
        else:
            _, index_pos, dim = spec
            if len(node.args) <= index_pos:
                continue
            d = node.args[1] if dim == "arg1" else dim
            checks = [(node.args[index_pos], int(d))]
        for idx, d in checks:
            rng = _static_range(idx, gm)
            if rng is None or d >= src_val.dim():
                continue
            size = int(src_val.shape[d])
            if rng[1] >= size or rng[0] < -size:
                yield Violation(
                    "index_range",
                    errors.IndexRangeViolation,
                    code,
                    f"static {kind} index of %{node.name} reaches {rng[1] if rng[1] >= size else rng[0]}"
                    f" but dim {d} of %{src.name} has size {size}",
                    node,
                )


def estimate_hbm_bytes(gm: fx.GraphModule) -> tuple[int, fx.Node | None]:
    """Upper-bound estimate of HBM one graph needs: every input and constant, plus the peak of
    live intermediate tensors in graph order (no reuse beyond last use). Returns (bytes, the
    node at the peak)."""
    last_use: dict[fx.Node, fx.Node] = {}
    for node in gm.graph.nodes:
        for inp in node.all_input_nodes:
            last_use[inp] = node
    resident = 0
    live = 0
    peak, at = 0, None
    sizes: dict[fx.Node, int] = {}
    dying: dict[fx.Node, list[fx.Node]] = {}
    for n, user in last_use.items():
        dying.setdefault(user, []).append(n)
    for node in gm.graph.nodes:
        size = sum(nbytes(t) for t in tensors_in(node.meta.get("val")))
        if node.op in ("placeholder", "get_attr"):
            resident += size
            continue
        if node.op == "output":
            continue
        sizes[node] = size
        live += size
        if resident + live > peak:
            peak, at = resident + live, node
        for gone in dying.get(node, ()):
            live -= sizes.pop(gone, 0)
    return max(peak, resident), at


@legality_rule(
    "hbm",
    errors.HbmViolation,
    ("NCC_EOOM001",),
    "use a smaller bucket/batch, LNC=2, or shard the model",
    source="R6.7",
)
def check_hbm(gm: fx.GraphModule, lowered: LoweredGraph, ctx: Context):
    """Estimated HBM footprint within one logical core's HBM (EOOM001/002, EVRF009)."""
    need, at = estimate_hbm_bytes(gm)
    have = ctx.target.hbm_per_logical_core(ctx.lnc)
    if have and need > have:
        yield Violation(
            "hbm",
            errors.HbmViolation,
            "NCC_EOOM001",
            f"estimated HBM footprint {need / 2**30:.2f} GiB exceeds the "
            f"{have / 2**30:.0f} GiB of one {ctx.target.name} logical core (LNC={ctx.lnc})",
            at,
        )


def estimate_instructions(gm: fx.GraphModule, target: TrainiumTarget) -> int:
    """Graph-size proxy: one instruction per output tile of 128 partitions x 512 elements for
    elementwise/data-movement ops; matmuls (``cost_model.MATMUL_OPS``) by TensorE tiles
    (M/128 x N/512 x K/128, ``K = cost_model.contraction_size``)."""
    tiles = target.tiles
    per_tile = tiles.partition_max * tiles.gemm_moving_free_max
    total = 0
    for node in _nodes(gm, ("call_function",)):
        ts = tensors_in(node.meta.get("val"))
        if not ts:
            continue
        out = ts[0]
        if node.target in MATMUL_OPS and out.dim() >= 2:
            k = contraction_size(node)
            batch = out.numel() // max(1, int(out.shape[-1]) * int(out.shape[-2]))
            total += batch * (
                math.ceil(int(out.shape[-2]) / tiles.gemm_stationary_free_max)
                * math.ceil(int(out.shape[-1]) / tiles.gemm_moving_free_max)
                * math.ceil(k / tiles.partition_max)
            )
        else:
            total += max(1, math.ceil(out.numel() / per_tile))
    return total


@legality_rule(
    "graph_size",
    errors.GraphSizeViolation,
    ("NCC_EBVF030",),
    "split the graph (torch.compiler.disable a module boundary) or use smaller shapes",
    source="R6.8",
)
def check_graph_size(gm: fx.GraphModule, lowered: LoweredGraph, ctx: Context):
    """Graph-size proxy against the instruction limit (EBVF030 / EVRF007 / EXTP004)."""
    limit = ctx.target.max_instructions
    if not limit:
        return
    n = estimate_instructions(gm, ctx.target)
    if n > limit:
        yield Violation(
            "graph_size",
            errors.GraphSizeViolation,
            "NCC_EBVF030",
            f"estimated {n:,} instructions exceed the {limit:,} proxy limit of {ctx.target.name}",
            None,
        )


_RNG_BIT_GENERATOR = re.compile(r"rng_bit_generator\b")
_RNG_ALGORITHM = re.compile(r"algorithm\s*=\s*(?:#stablehlo<rng_algorithm\s*)?(\w+)")


@legality_rule(
    "rng_algorithm",
    errors.RngAlgorithmViolation,
    ("NCC_EVRF006",),
    "neuronx-cc accepts only RNG_DEFAULT; neuron-compile's random ops use "
    "in-module Threefry arithmetic instead (lowering/stablehlo/random.py), so this is a lowering "
    "bug unless the module was written by hand",
    rewrite="random ops compute Threefry-2x32 in ui32 arithmetic inside the module "
    "(lowering/stablehlo/random.py), never RngBitGenerator",
    source="R6.9",
)
def check_rng_algorithm(gm: fx.GraphModule, lowered: LoweredGraph, ctx: Context):
    """RngBitGenerator only with the default algorithm (EVRF006): THREE_FRY and PHILOX are
    rejected, in either the generic (``rng_algorithm = #stablehlo<rng_algorithm X>``) or the
    pretty (``algorithm = X``) form."""
    for lineno, line in enumerate(lowered.text.splitlines(), 1):
        if not _RNG_BIT_GENERATOR.search(line):
            continue
        m = _RNG_ALGORITHM.search(line)
        algorithm = m.group(1) if m else "<missing>"
        if algorithm != "DEFAULT":
            yield Violation(
                "rng_algorithm",
                errors.RngAlgorithmViolation,
                "NCC_EVRF006",
                f"RngBitGenerator with algorithm {algorithm} (neuronx-cc accepts only "
                f"RNG_DEFAULT): {line.strip()[:120]}",
                lowered.node_at_line(lineno),
            )


#: The rules, in the order their violations are reported. Cheap FX checks first.
RULES: tuple[Rule, ...] = (
    check_static_shapes,
    check_dtypes,
    check_int64,
    check_integer_datapath,
    check_custom_calls,
    check_rng_algorithm,
    *legality_conv.RULES,
    *legality_windows.RULES,
    *legality_ops.RULES,
    *legality_collectives.RULES,
    check_index_range,
    check_hbm,
    check_graph_size,
)


#: Rule name -> hint shown with its error.
HINTS = {info(rule).rule: info(rule).hint for rule in RULES}


def find_violations(
    gm: fx.GraphModule,
    lowered: LoweredGraph,
    target: TrainiumTarget,
    *,
    lnc: int | None = None,
    flags: str = "",
) -> list[Violation]:
    """Every violation of every rule (empty = legal for ``target``)."""
    ctx = Context(target, lnc or target.default_lnc, tuple(shlex.split(flags or "")))
    return [v for rule in RULES for v in rule(gm, lowered, ctx)]


def check_legality(
    gm: fx.GraphModule,
    lowered: LoweredGraph,
    target: TrainiumTarget,
    *,
    lnc: int | None = None,
    flags: str = "",
    graph_name: str = "",
) -> None:
    """Raise the first violation (NC501-NC513) of ``gm`` for ``target``; return if legal."""
    found = find_violations(gm, lowered, target, lnc=lnc, flags=flags)
    if not found:
        return
    first = found[0]
    where = f"graph {graph_name} " if graph_name else ""
    raise first.error(
        f"{where}is not legal for {target.name}: {first.message} (pre-empts {first.ncc_code})",
        node=first.node,
        reason=None
        if len(found) == 1
        else f"{len(found)} violations: "
        + "; ".join(f"{v.ncc_code} {v.message}" for v in found[:5]),
        hint=HINTS[first.rule],
        ncc_code=first.ncc_code,
        rule=first.rule,
        target=target.name,
        violations=[f"{v.ncc_code}: {v.message}" for v in found],
    )
