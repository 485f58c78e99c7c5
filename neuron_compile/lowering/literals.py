"""Spelling of StableHLO types and literals in MLIR text: element types, ``dense<...>``
attributes (with the bit patterns MLIR needs for non-finite floats), ``array<i64: ...>`` and
string literals. Used by the emitter (emit.py)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

_ELEMENT_TYPES: dict[torch.dtype, str] = {
    torch.float32: "f32",
    torch.bfloat16: "bf16",
    torch.float16: "f16",
    torch.float64: "f64",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int16: "i16",
    torch.int8: "i8",
    torch.uint8: "ui8",
    torch.bool: "i1",
    # Only inside graphs (RNG state and bits); never graph inputs or outputs.
    torch.uint32: "ui32",
    torch.uint64: "ui64",
}

# Bit patterns of non-finite values: MLIR float literals have no spelling for inf/nan.
_NONFINITE_HEX = {
    "f32": {"inf": "0x7F800000", "-inf": "0xFF800000", "nan": "0x7FC00000"},
    "bf16": {"inf": "0x7F80", "-inf": "0xFF80", "nan": "0x7FC0"},
    "f16": {"inf": "0x7C00", "-inf": "0xFC00", "nan": "0x7E00"},
    "f64": {"inf": "0x7FF0000000000000", "-inf": "0xFFF0000000000000", "nan": "0x7FF8000000000000"},
}


def has_element_type(dtype: torch.dtype) -> bool:
    """Whether a value of ``dtype`` can live in a lowered graph (complex, float8 and uint16 can
    not: ops on them run eagerly)."""
    return dtype in _ELEMENT_TYPES


def element_type(dtype: torch.dtype) -> str:
    try:
        return _ELEMENT_TYPES[dtype]
    except KeyError:
        raise TypeError(f"dtype {dtype} has no StableHLO element type here") from None


def is_float(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point


def is_unsigned(dtype: torch.dtype) -> bool:
    return dtype in (torch.uint8, torch.bool, torch.uint32, torch.uint64)


def i64_array(values: Sequence[int]) -> str:
    return "array<i64" + (": " + ", ".join(str(int(v)) for v in values) if values else "") + ">"


def i64_list(values: Sequence[int]) -> str:
    return "[" + ", ".join(str(int(v)) for v in values) + "]"


def wrap_integer(value: int, dtype: torch.dtype) -> int:
    """``value`` cast to the integer ``dtype`` as eager casts a Python scalar: modulo 2**bits
    (uint8 ``x + -1`` adds 255, ``x == 256`` compares with 0)."""
    bits = dtype.itemsize * 8
    value &= (1 << bits) - 1
    if not is_unsigned(dtype) and value >= 1 << (bits - 1):
        value -= 1 << bits
    return value


def format_scalar(value: float | int | bool, dtype: torch.dtype) -> str:
    """Spell one element of a ``dense<...>`` literal."""
    if dtype == torch.bool:
        return "true" if value else "false"
    if not is_float(dtype):
        return str(wrap_integer(int(value), dtype))
    value = float(value)
    if math.isnan(value):
        return _NONFINITE_HEX[element_type(dtype)]["nan"]
    if math.isinf(value):
        return _NONFINITE_HEX[element_type(dtype)]["inf" if value > 0 else "-inf"]
    return f"{value:.9e}"


def dense_literal(values: np.ndarray, dtype: torch.dtype) -> str:
    if values.ndim == 0:
        return f"dense<{format_scalar(values.item(), dtype)}>"

    def nest(a: np.ndarray) -> str:
        if a.ndim == 1:
            return "[" + ", ".join(format_scalar(v, dtype) for v in a.tolist()) + "]"
        return "[" + ", ".join(nest(s) for s in a) + "]"

    return f"dense<{nest(values)}>"


def escape_string(text: str) -> str:
    """``text`` as the body of an MLIR string literal."""
    return text.replace("\\", "\\\\").replace('"', '\\"')
