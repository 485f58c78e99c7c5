"""OpCase and the input makers shared by the per-op numerics tables (``cases.py``,
``coverage_cases.py``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

_SHORT = {
    torch.float32: "f32",
    torch.bfloat16: "bf16",
    torch.float16: "f16",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.bool: "b",
    torch.float64: "f64",
    torch.uint8: "u8",
    torch.int8: "i8",
    torch.int16: "i16",
}

Maker = Callable[[tuple[int, ...], torch.dtype], torch.Tensor]


def randn(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(shape).to(dtype)


def positive(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return (torch.rand(shape) + 0.1).to(dtype)


def integers(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.randint(-5, 6, shape).to(dtype)


def distinct(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A permutation of small integers (exact in every dtype): no ties, so sort orders agree."""
    n = math.prod(shape)
    return (torch.randperm(n) - n // 2).reshape(shape).to(dtype)


def ties(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Only three distinct values: exercises tie-breaking (first / last index, stability)."""
    return torch.randint(0, 3, shape).to(dtype)


def with_nan(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """randn with NaNs in a few fixed places (two in row 1, one in row 2)."""
    x = torch.randn(shape)
    x.view(-1)[[9, 12, 17]] = float("nan")
    return x.to(dtype)


def unit(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Inside (-0.95, 0.95): the domain of asin/acos/atanh/erfinv."""
    return (torch.rand(shape) * 1.9 - 0.95).to(dtype)


_SPECIAL = [0.0, -0.0, 1.5, -2.5, float("inf"), float("-inf"), float("nan"), 3.0]


def special(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Signed zeros, infinities and NaN among ordinary numbers."""
    n = math.prod(shape)
    return torch.tensor(_SPECIAL * (n // len(_SPECIAL) + 1))[:n].reshape(shape).to(dtype)


def cast_source(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Values that exercise every cast out of ``dtype``: fractional and negative floats (which
    truncate, then wrap for 8/16-bit targets), and integers across their type's range."""
    if dtype.is_floating_point:
        return (torch.randn(shape) * 100).to(dtype)
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -(2**20)), min(info.max, 2**20) + 1, shape).to(dtype)


def nonzero(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Divisors of either sign, never zero: floats in +-[0.1, 3), integers in +-[1, 5]."""
    sign = torch.randint(0, 2, shape) * 2 - 1
    if dtype.is_floating_point:
        return (sign * (torch.rand(shape) * 2.9 + 0.1)).to(dtype)
    return (sign * torch.randint(1, 6, shape)).to(dtype)


def idx(high: int, low: int = 0) -> Maker:
    """int64 indices in [low, high) whatever the case dtype (they are indices, not data)."""
    return lambda shape, dtype: torch.randint(low, high, shape)


@dataclass
class OpCase:
    name: str
    fn: Callable[..., Any]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16)
    make: Maker | tuple[Maker, ...] = randn
    xfail: str | None = None
    #: per-dtype (rtol, atol) overriding TOLERANCE, for ops whose eager kernel uses another formula
    tol: dict[torch.dtype, tuple[float, float]] | None = None

    def inputs(self, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        makers = self.make if isinstance(self.make, tuple) else (self.make,) * len(self.shapes)
        return tuple(m(s, dtype) for m, s in zip(makers, self.shapes, strict=True))

    def ids(self) -> list[str]:
        return [f"{self.name}-{_SHORT[d]}" for d in self.dtypes]


F32 = (torch.float32,)
INT = (torch.int32, torch.int64)
F32_BF16_INT = (torch.float32, torch.bfloat16, torch.int32)
CAST_DTYPES = (
    torch.float32,
    torch.bfloat16,
    torch.float16,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.uint8,
    torch.bool,
)
M = (4, 8)
