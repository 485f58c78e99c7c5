"""Parse and triage neuronx-cc's ``NCC_XXXXNNN`` error codes: the one triage table.

Keyed by the SDK's ``compiler/error-codes`` table (``docs/trainium-reference.md`` §R7).
User-facing errors match ``NCC_E[A-Z]{3}\\d{3}``; internal ones (``NCC_I...``) are parsed too and
triaged as ``compiler-internal``. Each code has a triage class (``user-shape-dtype``,
``unsupported-op``, ``lowering-bug``, ``nki-toolchain``, ``capacity``, ``configuration``,
``compiler-internal``, ``unknown``), the class's report bucket and typical action, and a group
(the kind of error). The neuronx-cc driver (``trainium/neuronx_cc.py``) puts the class and action
of a failure's first code into ``NeuronxCcError``; reports hand a log or exception text to
``parse_ncc``, which shows each code with its group, bucket and action.

Pure stdlib at import time: the driver runs in precompile workers.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..report.model import NccDiagnostic

NCC_RE = re.compile(r"\bNCC_([EI][A-Z]{3}\d{3})\b[:\s]*(?P<msg>.*)")

#: Triage class -> (report bucket, typical action) (§R7 "grouped for CI triage").
CLASSES: dict[str, tuple[str, str]] = {
    "user-shape-dtype": (
        "user-fixable shape/dtype",
        "pad/bucket the shapes, cast the dtype, or pass a downcast flag in NEURON_CC_FLAGS",
    ),
    "unsupported-op": (
        "unsupported op/pattern",
        "run the op on the CPU (fallback) or rewrite it; report it so a decomposition is added",
    ),
    "lowering-bug": (
        "lowering bug",
        "a neuron-compile lowering bug: report it with NEURON_COMPILE_DUMP_DIR's dump",
    ),
    "nki-toolchain": (
        "NKI toolchain/cache",
        "re-trace the NKI kernel; check the artifact path and the nki/neuronx-cc versions",
    ),
    "capacity": ("capacity", "split the graph, use a smaller bucket/batch, LNC=2 or sharding"),
    "configuration": ("configuration", "fix --target / --lnc (NEURON_COMPILE_TARGET / _LNC)"),
    "compiler-internal": (
        "internal",
        "a neuronx-cc internal error: report it to AWS with the log",
    ),
    "unknown": ("unknown", "look the code up in the Neuron SDK's compiler/error-codes"),
}
#: What ``NeuronxCcError`` says when neuronx-cc printed no code at all.
NO_CODE_ACTION = "read the neuronx-cc log tail in the error"

# (code or prefix, group, class). Exact codes; a trailing '*' matches a prefix.
_TABLE: list[tuple[str, str, str]] = [
    ("EARG001", "configuration", "configuration"),
    ("EMOD025", "model/frontend", "user-shape-dtype"),
    ("EHCA005", "model/frontend", "lowering-bug"),
    ("EUOC002", "model/frontend", "unsupported-op"),
    ("EOOM*", "memory/size", "capacity"),
    ("EXSP001", "memory/size", "capacity"),
    ("EBVF030", "memory/size", "capacity"),
    ("EXTP004", "memory/size", "capacity"),
    ("EBIR023", "memory/size", "capacity"),
    ("ESPP*", "dtypes/constants", "user-shape-dtype"),
    ("ESFH002", "dtypes/constants", "user-shape-dtype"),
]
_EVRF_CLASSES = {
    "user-shape-dtype": (4, 5, 35, 51, 52, 60, 61, 62, 63),
    "unsupported-op": (1, 6, 10, 11, 13, 16, 17, 18, 19, 22),
    "lowering-bug": (15, 31, *range(36, 51), 53, 54, 55, 56, 57, 58, 64),
    "nki-toolchain": (59, 65),
    "capacity": (7, 9),
}
_EVRF_GROUPS = {
    **dict.fromkeys((35, 60, 61, 62, 63), "EVRF integer datapath"),
    **dict.fromkeys((51, 52), "EVRF FP8"),
    **dict.fromkeys((*range(36, 43), 57, 58), "EVRF QuantizeMX"),
    **dict.fromkeys((*range(43, 51), 53, 54, 55), "EVRF ScaledMatmul"),
    **dict.fromkeys((59, 65), "EVRF NKI"),
}


def classify(code: str) -> tuple[str, str]:
    """``(group, triage class)`` of a code with or without the ``NCC_`` prefix."""
    code = code.removeprefix("NCC_")
    if code.startswith("I"):
        return "internal", "compiler-internal"
    if code.startswith("EVRF") and code[4:].isdigit():
        n = int(code[4:])
        group = _EVRF_GROUPS.get(n, "EVRF ops and dtypes")
        for klass, numbers in _EVRF_CLASSES.items():
            if n in numbers:
                return group, klass
        return group, "unknown"
    for key, group, klass in _TABLE:
        if key == code or (key.endswith("*") and code.startswith(key[:-1])):
            return group, klass
    return "unknown", "unknown"


def triage(code: str) -> tuple[str, str]:
    """``(group, report bucket)`` of a code with or without the ``NCC_`` prefix."""
    group, klass = classify(code)
    return group, CLASSES[klass][0]


def triage_class(ncc_code: str | None) -> tuple[str, str]:
    """``(triage class, action)`` of an ``NCC_*`` code (``NeuronxCcError``'s ``triage`` and
    hint); ``unknown`` for codes outside the table and for no code."""
    if not ncc_code:
        return "unknown", NO_CODE_ACTION
    klass = classify(ncc_code)[1]
    return klass, CLASSES[klass][1]


def parse_ncc(text: str) -> list[NccDiagnostic]:
    """Every ``NCC_`` code in ``text`` (a neuronx-cc log or exception message), first occurrence
    of each code kept, in order, triaged."""
    from ..report.model import NccDiagnostic

    out: list[NccDiagnostic] = []
    seen: set[str] = set()
    for line in text.splitlines():
        for m in NCC_RE.finditer(line):
            code = f"NCC_{m.group(1)}"
            if code in seen:
                continue
            seen.add(code)
            group, klass = classify(code)
            bucket, action = CLASSES[klass]
            out.append(NccDiagnostic(code, m["msg"].strip(), group, bucket, action))
    return out
