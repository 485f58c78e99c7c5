"""``native_dropout`` of an empty tensor, as eager returns it.

Eager's CPU kernel returns early for an empty input with ``(input, empty_like(input))``: the mask
has the input's float dtype, where every non-empty call (and PyTorch's meta function) gives a
bool mask. Decomposing the empty case makes the traced mask the one eager returns; every other
call stays ``native_dropout`` (lowered in ``lowering/stablehlo/random.py``). Code inside the
compiled frame that reads ``mask.dtype`` still sees the meta function's bool (Dynamo's tracing
decides that before the backend runs).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

aten = torch.ops.aten


def native_dropout(input: Tensor, p: float, train: bool | None) -> Any:
    if input.numel() != 0:
        return NotImplemented  # the op itself
    return input.clone(), torch.empty_like(input)


DECOMPOSITIONS: dict[Any, Any] = {aten.native_dropout.default: native_dropout}
