"""Indexing ops whose PyTorch decomposition goes through Python indexing.

``aten.take``'s decomposition is ``self.reshape(-1)[index]``: Python's ``__getitem__`` turns a
0-d integer index tensor into ``index.item()``, a data-dependent scalar, so tracing fails (put's
backward takes the grad at its 0-d index). ``aten.index`` with the index tensor keeps the index
a tensor of any rank, with the same semantics (negative indices wrap, the result has the index's
shape).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

aten = torch.ops.aten


def take(self: Tensor, index: Tensor) -> Tensor:
    return aten.index.Tensor(self.reshape(-1), [index])


DECOMPOSITIONS: dict[Any, Any] = {aten.take.default: take}
