"""The cpu target's ``cumsum`` and ``cumprod`` with a float32 result: accumulated in float64, as
eager's CPU kernels accumulate (their accumulator for float is double, ``at::acc_type<float,
false>``), rounded once per output.

In float32 a running product overflowed where eager's does not: ``cumprod([1e30, 1e30, 0, 2])``
is ``[1e30, inf, 0, 0]`` in eager (1e60 fits a double; cast to float it is inf, times 0 it is
0) and was ``[1e30, inf, nan, nan]`` here; a running sum rounded at every step where eager
rounds once per output. trn targets have no float64 and keep the float32 scan, so what
neuronx-cc receives does not change (and the CPU stand-in of a trn graph computes what the
device does).
"""

from __future__ import annotations

import torch
import torch.fx as fx

from ..lowering.context import LoweringContext, canonical_dtype
from ..lowering.emit import Value
from ..lowering.registry import lowering
from ..lowering.stablehlo.scan import accumulating_scan
from . import CPU_KEY

aten = torch.ops.aten


def float_result(node: fx.Node) -> str | None:
    """Support predicate: a float32 result (after the 64-bit policy: float64 runs as float32)."""
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor) and canonical_dtype(val.dtype) == torch.float32:
        return None
    return "only float32 results accumulate in float64 (eager's accumulator for float)"


@lowering(aten.cumsum.default, key=CPU_KEY, supports=float_result)
def lower_cumsum_in_float64(ctx: LoweringContext, x: Value, dim: int, **_: object) -> Value:
    return accumulating_scan(ctx, x, dim, "add", 0, torch.float64)


@lowering(aten.cumprod.default, key=CPU_KEY, supports=float_result)
def lower_cumprod_in_float64(ctx: LoweringContext, x: Value, dim: int, **_: object) -> Value:
    return accumulating_scan(ctx, x, dim, "multiply", 1, torch.float64)
