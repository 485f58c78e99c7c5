"""Per-op legality: integer dot and scatter without an integer datapath, dtypes single ops cannot
take (TopK, scatter-reduce, arithmetic shift right), NKI kernel artifacts, integer collectives.

Each rule reads the module through ``legality_base.hlo_ops`` (TopK by line: ``chlo`` is not a
dialect our MLIR context loads) and names the FX node that emitted the op
(``lowered.node_at_line``). Codes: ``docs/trainium-reference.md`` §R6.4, §R6.12 and §R6.13.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from collections.abc import Iterator

import torch
import torch.fx as fx

from .. import errors
from ..lowering.lower_graph import LoweredGraph
from ..lowering.rules import arg
from .cost_model import tensors_in
from .kernels.nki import NKI_CUSTOM_CALL
from .legality_base import Context, HloOp, Rule, Violation, legality_rule, ops_named

aten = torch.ops.aten
_INTEGER = re.compile(r"u?i\d+")  # i1 (bool) included: StableHLO's pred type


def _is_integer(element_type: str) -> bool:
    return bool(_INTEGER.fullmatch(element_type))


def _string_attr(op: HloOp, name: str) -> str | None:
    """A printed string attribute without its quotes (base64 and target names need no escape)."""
    text = op.attributes.get(name)
    if text is None or not (text.startswith('"') and text.endswith('"')):
        return None
    return text[1:-1]


# -- integer dot and scatter ---------------------------------------------------------------

_INT_DOT = {
    aten.mm.default,
    aten.bmm.default,
    aten.addmm.default,
    aten.baddbmm.default,
    aten.dot.default,
    aten.convolution.default,
}
_SCATTER_COMPUTE = {
    aten.scatter_add.default,
    aten.scatter_reduce.two,
    aten.scatter.reduce,
    aten.scatter.value_reduce,
    aten.index_add.default,
    aten.index_reduce.default,
}
#: scatters that accumulate when their ``accumulate`` argument (this position) is true
_ACCUMULATING = {aten.index_put.default: 3, aten._unsafe_index_put.default: 3, aten.put.default: 3}


def is_integer_tensor(t: torch.Tensor) -> bool:
    return not (t.dtype.is_floating_point or t.dtype.is_complex)


@legality_rule(
    "integer_datapath",
    errors.IntegerDatapathViolation,
    ("NCC_EVRF035", "NCC_EVRF060"),
    "cast the operands to float32 explicitly, or allow the lossy downcast with "
    "NEURON_CC_FLAGS=--implicit-integer-downcast=all",
    source="R6.4",
)
def check_integer_datapath(gm: fx.GraphModule, lowered: LoweredGraph, ctx: Context):
    """Integer dot/conv (EVRF035) and scatter-with-compute (EVRF060) have no integer datapath:
    neuronx-cc computes them in f32 (lossy above 2**24) or rejects them under
    ``--implicit-integer-downcast=none`` (the announced future default)."""
    reported: set[fx.Node | None] = set()
    for node in gm.graph.nodes:
        ts = tensors_in(node.meta.get("val")) if node.op == "call_function" else []
        if not ts or not is_integer_tensor(ts[0]):
            continue
        position = _ACCUMULATING.get(node.target)
        accumulate = position is not None and arg(node, position, "accumulate", False)
        scatter = node.target in _SCATTER_COMPUTE or accumulate
        if node.target in _INT_DOT and not ctx.downcast_allowed("dot"):
            code, what = "NCC_EVRF035", "integer matmul/convolution"
        # A bool scatter-reduce has no f32 emulation either: EVRF016 (below).
        elif scatter and ts[0].dtype != torch.bool and not ctx.downcast_allowed("scatter"):
            code, what = "NCC_EVRF060", "integer scatter with accumulation"
        else:
            continue
        reported.add(node)
        yield Violation(
            "integer_datapath",
            errors.IntegerDatapathViolation,
            code,
            f"%{node.name} is an {what} ({ts[0].dtype}), which has no integer datapath",
            node,
        )
    if ctx.downcast_allowed("scatter"):
        return
    # Integer scatters of ops not listed above (reached through decompositions), by their HLO.
    for op in ops_named(lowered, "scatter"):
        node = lowered.node_at_line(op.line)
        if node not in reported and integer_scatter(op) == "emulated":
            reported.add(node)
            where = f"%{node.name} is " if node is not None else ""
            yield Violation(
                "integer_datapath",
                errors.IntegerDatapathViolation,
                "NCC_EVRF060",
                f"{where}an integer scatter with accumulation ({op.result_types[0]}), which has "
                "no integer datapath",
                node,
            )


# -- TopK ------------------------------------------------------------------------------------------

_TOPK_TARGETS = ("TopK", "AwsNeuronTopK")
_TOPK_NAMES = "|".join(_TOPK_TARGETS)
_TOPK = re.compile(
    rf"\bchlo\.top_k\b|custom_call\s*@(?:{_TOPK_NAMES})\b"
    rf'|call_target_name\s*=\s*"(?:{_TOPK_NAMES})"'
)
_SIGNATURE = re.compile(r":\s*\(?\s*tensor<")
_ELEMENT = re.compile(r"tensor<(?:[0-9?]+x)*([^,>]+)>")


def _first_operand_type(line: str) -> str:
    """Element type of an op's first operand, from the function type that ends its line (the
    last ``: (tensor<...`` / ``: tensor<...`` before ``->``; attribute types come earlier)."""
    head = line.rsplit("->", 1)[0]
    starts = [m.start() for m in _SIGNATURE.finditer(head)]
    if not starts:
        return ""
    m = _ELEMENT.search(head, starts[-1])
    return m.group(1) if m else ""


@legality_rule(
    "topk_dtype",
    errors.OpDtypeViolation,
    ("NCC_EVRF013",),
    "TopK takes floating-point operands only: cast the values to float32 (exact for integers "
    "up to 2**24) or use torch.topk, which neuron-compile lowers as a sort",
    source="R6.12",
)
def check_topk_dtype(
    gm: fx.GraphModule, lowered: LoweredGraph, ctx: Context
) -> Iterator[Violation]:
    """TopK on floats only (EVRF013): ``chlo.top_k`` (which becomes HLO's TopK) and the
    ``TopK`` / ``AwsNeuronTopK`` custom calls with an integer or bool operand. Our own
    ``aten.topk`` lowering is a sort plus a slice (``lowering/stablehlo/sort.py``), legal for
    any dtype, so this guards hand-written and imported modules."""
    for lineno, line in enumerate(lowered.text.splitlines(), 1):
        if not _TOPK.search(line):
            continue
        element = _first_operand_type(line)
        if _is_integer(element):
            yield Violation(
                "topk_dtype",
                errors.OpDtypeViolation,
                "NCC_EVRF013",
                f"TopK on {element} operands (neuronx-cc's TopK takes floats only): "
                f"{line.strip()[:120]}",
                lowered.node_at_line(lineno),
            )


# -- scatter with a reduction ------------------------------------------------------------------

#: update computations neuronx-cc emulates in f32 for integers (NCC_EVRF060's list)
_F32_EMULATED = {"stablehlo.add", "stablehlo.multiply", "stablehlo.minimum", "stablehlo.maximum"}


def _integer_datapath_nodes(gm: fx.GraphModule, lowered: LoweredGraph, ctx: Context) -> set:
    return {v.node for v in check_integer_datapath(gm, lowered, ctx) if v.node is not None}


@legality_rule(
    "scatter_reduce_dtype",
    errors.OpDtypeViolation,
    ("NCC_EVRF016",),
    "scatter with a reduction has no integer or bool datapath: cast the destination and the "
    "updates to float32 (exact up to 2**24) and back, or use an overwriting scatter",
    source="R6.12",
)
def check_scatter_reduce_dtype(
    gm: fx.GraphModule, lowered: LoweredGraph, ctx: Context
) -> Iterator[Violation]:
    """Scatter whose update computation computes (anything besides returning the update) on
    integer or bool elements.

    Two neuronx-cc codes cover integer scatters, and each gets exactly one:

    - NCC_EVRF060 (``integer_datapath`` in legality.py, NC504, by ATen op): an integer (not bool)
      scatter combining with ``add`` / ``multiply`` / ``minimum`` / ``maximum``. neuronx-cc
      emulates these in f32 and rejects them only because that is lossy above 2**24, so
      ``--implicit-integer-downcast=scatter`` lets them through.
    - NCC_EVRF016 (here, NC512): what the f32 emulation cannot do at all, hence no flag allows
      it: a bool (``i1``) scatter-reduce, and an integer update computation using anything
      besides those four ops (``and``, ``or``, ``xor``, a multi-op body).

    The EVRF016 page predates EVRF060 and still shows an int32 ``scatter_reduce(sum)``; the
    EVRF060 page, written with the downcast flag, claims exactly that case, so the flag's
    documented effect decides: a case the flag can allow is EVRF060. Nodes the EVRF060 rule
    reports are skipped here.
    """
    reported = None
    for op in ops_named(lowered, "scatter"):
        if integer_scatter(op) != "unsupported":
            continue
        if reported is None:  # what the EVRF060 rule says of this graph: asked once
            reported = _integer_datapath_nodes(gm, lowered, ctx)
        node = lowered.node_at_line(op.line)
        if node in reported:  # one report per node (include_self=False emits two scatters)
            continue
        reported.add(node)
        body = sorted(set(op.region_ops) - {"stablehlo.return"})
        where = f"%{node.name} is " if node is not None else ""
        yield Violation(
            "scatter_reduce_dtype",
            errors.OpDtypeViolation,
            "NCC_EVRF016",
            f"{where}a scatter reducing {op.result_types[0]} elements with "
            f"{', '.join(n.removeprefix('stablehlo.') for n in body)}",
            node,
        )


def integer_scatter(op: HloOp) -> str | None:
    """How neuronx-cc takes a scatter on integer or bool elements whose update computation
    computes: ``"emulated"`` in f32 (integer add/multiply/minimum/maximum: EVRF060, allowed by
    ``--implicit-integer-downcast=scatter``), ``"unsupported"`` (bool, or any other body:
    EVRF016); None for float scatters and plain overwrites."""
    body = set(op.region_ops) - {"stablehlo.return"}
    elements = [t for t in op.result_types if _is_integer(t)]
    if not body or not elements:
        return None
    return "emulated" if "i1" not in elements and body <= _F32_EMULATED else "unsupported"


# -- shift right arithmetic --------------------------------------------------------------------

_SHIFT_TYPES = ("i32", "ui32", "f32")


@legality_rule(
    "shift_dtype",
    errors.OpDtypeViolation,
    ("NCC_EVRF022",),
    "shift-right-arithmetic takes 32-bit operands only: cast the shifted value to int32 first",
    rewrite="int8/int16 >> sign-extends to int32, shifts and narrows back",
    source="R6.12",
)
def check_shift_dtype(
    gm: fx.GraphModule, lowered: LoweredGraph, ctx: Context
) -> Iterator[Violation]:
    """shift-right-arithmetic on a first operand that is not 32-bit (EVRF022). Our trn form
    (``trainium/lowering_shifts.py``) shifts int8/int16 in int32, so only hand-written modules
    (or a 64-bit value under ``--native-int64``) reach it."""
    for op in ops_named(lowered, "shift_right_arithmetic"):
        element = op.operand_types[0] if op.operand_types else ""
        if element not in _SHIFT_TYPES:
            node = lowered.node_at_line(op.line)
            where = f"%{node.name} is " if node is not None else ""
            yield Violation(
                "shift_dtype",
                errors.OpDtypeViolation,
                "NCC_EVRF022",
                f"{where}a shift-right-arithmetic on {element} (neuronx-cc takes 32-bit only)",
                node,
            )


# -- NKI kernel artifacts ----------------------------------------------------------------------


def kernel_artifacts(backend_config_b64: str) -> list[str]:
    """The artifact paths an ``AwsNeuronCustomNativeKernel`` backend_config names
    (``klir_binary.binary``, docs/trainium-reference.md §R9); [] if it names none or is not
    base64 JSON."""
    try:
        config = json.loads(base64.b64decode(backend_config_b64, validate=True))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        return []
    binary = config.get("klir_binary") if isinstance(config, dict) else None
    path = binary.get("binary") if isinstance(binary, dict) else None
    return [path] if isinstance(path, str) and path else []


@legality_rule(
    "kernel_artifacts",
    errors.KernelArtifactViolation,
    ("NCC_EVRF059",),
    "the NKI kernel's artifact is gone: re-trace the kernel (clear neuron-compile's cache "
    "entry for it) and keep the cache directory until neuronx-cc has compiled the graph",
    source="R6.13",
)
def check_kernel_artifacts(
    gm: fx.GraphModule, lowered: LoweredGraph, ctx: Context
) -> Iterator[Violation]:
    """Every ``AwsNeuronCustomNativeKernel`` names an artifact that exists, by absolute path
    (EVRF059): neuronx-cc reads it when it compiles the graph. (It also tries
    ``<its cwd>/<last dir>/<file>``, but we do not know its cwd; our kernels are traced into the
    persistent cache, ``kernels/nki.py::_artifacts_dir``, by absolute path.) A config naming no
    artifact is not judged: which keys neuronx-cc requires is undocumented."""
    if NKI_CUSTOM_CALL not in lowered.text:
        return  # no parse for modules without kernels
    for op in ops_named(lowered, "custom_call"):
        if _string_attr(op, "call_target_name") != NKI_CUSTOM_CALL:
            continue
        for path in kernel_artifacts(_string_attr(op, "backend_config") or ""):
            if os.path.isabs(path) and os.path.exists(path):
                continue
            why = "does not exist" if os.path.isabs(path) else "is not an absolute path"
            node = lowered.node_at_line(op.line)
            where = f"%{node.name}: " if node is not None else ""
            yield Violation(
                "kernel_artifacts",
                errors.KernelArtifactViolation,
                "NCC_EVRF059",
                f"{where}the NKI kernel artifact {path!r} {why}",
                node,
            )


# -- integer collectives -----------------------------------------------------------------------

#: collective -> (NCC code, its name in --implicit-integer-downcast)
_COLLECTIVES = {
    "stablehlo.all_reduce": ("NCC_EVRF061", "all_reduce"),
    "stablehlo.reduce_scatter": ("NCC_EVRF063", "reduce_scatter"),
}
#: the widths the pages name: f32 holds every 8- and 16-bit integer exactly
_WIDE_INTEGERS = {"i32", "ui32", "i64", "ui64"}


@legality_rule(
    "integer_collectives",
    errors.IntegerDatapathViolation,
    ("NCC_EVRF061", "NCC_EVRF063"),
    "cast the operands to float32 (or bfloat16) before the collective, or allow the lossy f32 "
    "reduction with NEURON_CC_FLAGS=--implicit-integer-downcast=all_reduce,reduce_scatter",
    source="R6.4",
)
def check_integer_collectives(
    gm: fx.GraphModule, lowered: LoweredGraph, ctx: Context
) -> Iterator[Violation]:
    """all-reduce (EVRF061) and reduce-scatter (EVRF063) of 32- or 64-bit integers: the
    collective engine reduces in f32 (lossy above 2**24), so neuronx-cc rejects them unless
    ``--implicit-integer-downcast`` names the collective (or ``all``)."""
    for op in ops_named(lowered, "all_reduce", "reduce_scatter"):
        code, flag = _COLLECTIVES[op.name]
        wide = sorted({t for t in op.operand_types if t in _WIDE_INTEGERS})
        if not wide or ctx.downcast_allowed(flag):
            continue
        node = lowered.node_at_line(op.line)
        where = f"%{node.name} is " if node is not None else ""
        yield Violation(
            "integer_collectives",
            errors.IntegerDatapathViolation,
            code,
            f"{where}an integer {flag} ({', '.join(wide)}), which has no integer datapath",
            node,
        )


#: The rules of this module, in the order their violations are reported.
RULES: tuple[Rule, ...] = (
    check_topk_dtype,
    check_scatter_reduce_dtype,
    check_shift_dtype,
    check_kernel_artifacts,
    check_integer_collectives,
)
