"""Indexing ops whose PyTorch decomposition goes through Python indexing, or lays its result out
otherwise than eager.

``aten.take``'s decomposition is ``self.reshape(-1)[index]``: Python's ``__getitem__`` turns a
0-d integer index tensor into ``index.item()``, a data-dependent scalar, so tracing fails (put's
backward takes the grad at its 0-d index). ``aten.index`` with the index tensor keeps the index
a tensor of any rank, with the same semantics (negative indices wrap, the result has the index's
shape).

``aten.roll``'s decomposition selects along each rolled dim (``index_select``), which returns a
contiguous tensor; eager's kernel writes the result in ``self``'s suggested memory format, so a
channels_last input came back contiguous. The result is written into that format when the two
differ (a roll of the flattened tensor, without ``dims``, is contiguous in eager too).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch._decomp import decomposition_table
from torch._prims_common import suggest_memory_format

aten = torch.ops.aten


def take(self: Tensor, index: Tensor) -> Tensor:
    return aten.index.Tensor(self.reshape(-1), [index])


def roll(self: Tensor, shifts: Any, dims: Any = ()) -> Tensor:
    rolled = decomposition_table[aten.roll.default](self, shifts, dims)
    if not dims:  # eager rolls the flattened tensor: a contiguous result, as the decomposition's
        return rolled
    like = torch.empty_like(self, memory_format=suggest_memory_format(self))
    return rolled if rolled.stride() == like.stride() else aten.copy.default(like, rolled)


DECOMPOSITIONS: dict[Any, Any] = {aten.take.default: take, aten.roll.default: roll}
