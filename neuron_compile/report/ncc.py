"""Parse and triage neuronx-cc's ``NCC_XXXXNNN`` error codes.

Keyed by the table in the SDK's ``compiler/error-codes`` (summarized in
shared/reference/trainium-nki.md §6). User-facing errors match ``NCC_E[A-Z]{3}\\d{3}``; internal
ones (``NCC_I...``) are parsed too and triaged as ``internal``. The neuronx-cc driver
(``runtime/neuronx_cc.py``) hands its log or exception text to ``parse_ncc``; the report shows
each code with its group, CI triage bucket and typical action.
"""

from __future__ import annotations

import re

from .model import NccDiagnostic

NCC_RE = re.compile(r"\bNCC_([EI][A-Z]{3}\d{3})\b[:\s]*(?P<msg>.*)")

#: Triage buckets (trainium-nki.md §6 "CI triage grouping") -> typical action.
BUCKET_ACTIONS = {
    "user-fixable shape/dtype": "pad/bucket the shape, cast the dtype, or use the downcast flag",
    "unsupported op/pattern": "let the op fall back to the CPU, or decompose it",
    "lowering bug": "file a bug against neuron-compile's lowering, with the failure bundle",
    "NKI toolchain/cache": "re-trace the kernel, fix the artifact path, check versions in the key",
    "capacity": "split the graph, use a smaller bucket, or change LNC/sharding",
    "configuration": "fix the target / LNC flags",
    "internal": "a neuronx-cc internal error: report it to AWS with the log",
    "unknown": "look the code up in the Neuron SDK's compiler error-code docs",
}

# (code or prefix, group, bucket). Exact codes first; a trailing '*' matches a prefix.
_TABLE: list[tuple[str, str, str]] = [
    ("EARG001", "configuration", "configuration"),
    ("EMOD025", "model/frontend", "user-fixable shape/dtype"),
    ("EHCA005", "model/frontend", "lowering bug"),
    ("EUOC002", "model/frontend", "unsupported op/pattern"),
    ("EOOM*", "memory/size", "capacity"),
    ("EXSP001", "memory/size", "capacity"),
    ("EBVF030", "memory/size", "capacity"),
    ("EXTP004", "memory/size", "capacity"),
    ("EBIR023", "memory/size", "capacity"),
    ("ESPP*", "dtypes/constants", "user-fixable shape/dtype"),
    ("ESFH002", "dtypes/constants", "user-fixable shape/dtype"),
]
_EVRF_BUCKETS = {
    "user-fixable shape/dtype": (4, 5, 35, 51, 52, 60, 61, 62, 63),
    "unsupported op/pattern": (1, 6, 10, 11, 13, 16, 17, 18, 19, 22),
    "lowering bug": (15, 31, *range(36, 51), 53, 54, 55, 56, 57, 58, 64),
    "NKI toolchain/cache": (59, 65),
    "capacity": (7, 9),
}
_EVRF_GROUPS = {
    **dict.fromkeys((35, 60, 61, 62, 63), "EVRF integer datapath"),
    **dict.fromkeys((51, 52), "EVRF FP8"),
    **dict.fromkeys((*range(36, 43), 57, 58), "EVRF QuantizeMX"),
    **dict.fromkeys((*range(43, 51), 53, 54, 55), "EVRF ScaledMatmul"),
    **dict.fromkeys((59, 65), "EVRF NKI"),
}


def triage(code: str) -> tuple[str, str]:
    """``(group, bucket)`` of a code with or without the ``NCC_`` prefix."""
    code = code.removeprefix("NCC_")
    if code.startswith("I"):
        return "internal", "internal"
    if code.startswith("EVRF") and code[4:].isdigit():
        n = int(code[4:])
        group = _EVRF_GROUPS.get(n, "EVRF ops and dtypes")
        for bucket, numbers in _EVRF_BUCKETS.items():
            if n in numbers:
                return group, bucket
        return group, "unknown"
    for key, group, bucket in _TABLE:
        if key == code or (key.endswith("*") and code.startswith(key[:-1])):
            return group, bucket
    return "unknown", "unknown"


def parse_ncc(text: str) -> list[NccDiagnostic]:
    """Every ``NCC_`` code in ``text`` (a neuronx-cc log or exception message), first occurrence
    of each code kept, in order, triaged."""
    out: list[NccDiagnostic] = []
    seen: set[str] = set()
    for line in text.splitlines():
        for m in NCC_RE.finditer(line):
            code = f"NCC_{m.group(1)}"
            if code in seen:
                continue
            seen.add(code)
            group, bucket = triage(code)
            out.append(NccDiagnostic(code, m["msg"].strip(), group, bucket, BUCKET_ACTIONS[bucket]))
    return out
