"""``lerp`` as eager's kernel computes it (``ATen/native/Lerp.h``), not as PyTorch's reference.

Eager's kernel casts a tensor weight to the operands' dtype first (TensorIterator's common dtype:
a 0-d float32 weight with bfloat16 operands is rounded to bfloat16), then computes in float32
(opmath) and rounds once, from the end nearer the weight: ``weight * diff + start`` for
``|weight| < 0.5``, else ``(weight - 1) * diff + end`` (the vectorized kernel's ``fmadd`` form).
A Python weight is read unrounded in float32. The reference decomposition read a 0-d float32
weight unrounded: 1 ulp off for 12-67 % of bfloat16/float16 values.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

aten = torch.ops.aten


def _opmath(t: Tensor) -> Tensor:
    return t.float() if t.dtype in (torch.bfloat16, torch.float16) else t


def lerp(start: Tensor, end: Tensor, weight: Tensor | float) -> Tensor:
    dtype = start.dtype
    s, e = _opmath(start), _opmath(end.to(dtype))
    diff = e - s
    if isinstance(weight, Tensor):
        w = _opmath(weight.to(dtype))
        small = w.abs() < 0.5
        out = torch.where(small, w, w - 1) * diff + torch.where(small, s, e)
    elif abs(weight) < 0.5:
        out = weight * diff + s
    else:
        out = (weight - 1) * diff + e
    return out.to(dtype)


DECOMPOSITIONS: dict[Any, Any] = {aten.lerp.Scalar: lerp, aten.lerp.Tensor: lerp}
