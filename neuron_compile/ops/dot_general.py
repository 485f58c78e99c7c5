"""``neuron_compile::dot_general``: a matrix product with StableHLO's dimension numbers.

Passes rewrite ``mm(permute(a), b)`` into this op so the transpose becomes part of the contraction
(``stablehlo.dot_general`` reads either operand in any layout) instead of a separate
``stablehlo.transpose``. The result's dims are StableHLO's: the batch dims (in ``lhs_batch``
order), then lhs's free dims, then rhs's free dims, each in operand order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def _free(rank: int, contract: Sequence[int], batch: Sequence[int]) -> list[int]:
    return [d for d in range(rank) if d not in contract and d not in batch]


def result_shape(
    lhs_shape: Sequence[int],
    rhs_shape: Sequence[int],
    lhs_contract: Sequence[int],
    rhs_contract: Sequence[int],
    lhs_batch: Sequence[int],
    rhs_batch: Sequence[int],
) -> list[int]:
    """The shape ``dot_general`` returns for operands of these shapes."""
    lhs_free = _free(len(lhs_shape), lhs_contract, lhs_batch)
    rhs_free = _free(len(rhs_shape), rhs_contract, rhs_batch)
    return (
        [lhs_shape[d] for d in lhs_batch]
        + [lhs_shape[d] for d in lhs_free]
        + [rhs_shape[d] for d in rhs_free]
    )


def _check(
    lhs: torch.Tensor,
    rhs: torch.Tensor,
    lhs_contract: Sequence[int],
    rhs_contract: Sequence[int],
    lhs_batch: Sequence[int],
    rhs_batch: Sequence[int],
) -> None:
    torch._check(len(lhs_contract) == len(rhs_contract), lambda: "contract dims differ in count")
    torch._check(len(lhs_batch) == len(rhs_batch), lambda: "batch dims differ in count")
    torch._check(lhs.dtype == rhs.dtype, lambda: f"dtypes differ: {lhs.dtype} vs {rhs.dtype}")
    for a, b in zip((*lhs_contract, *lhs_batch), (*rhs_contract, *rhs_batch), strict=True):
        torch._check(lhs.shape[a] == rhs.shape[b], lambda: "paired dims differ in size")


@torch.library.custom_op("neuron_compile::dot_general", mutates_args=())
def dot_general(
    lhs: torch.Tensor,
    rhs: torch.Tensor,
    lhs_contract: list[int],
    rhs_contract: list[int],
    lhs_batch: list[int],
    rhs_batch: list[int],
) -> torch.Tensor:
    """Contract ``lhs_contract`` of ``lhs`` with ``rhs_contract`` of ``rhs`` over the paired
    batch dims. Eagerly: permute both into ``(batch, free, contract)`` / ``(batch, contract,
    free)`` matrices and run ``mm``/``bmm``, so low-precision inputs round like those ops do."""
    _check(lhs, rhs, lhs_contract, rhs_contract, lhs_batch, rhs_batch)
    lhs_free = _free(lhs.dim(), lhs_contract, lhs_batch)
    rhs_free = _free(rhs.dim(), rhs_contract, rhs_batch)
    batch = [lhs.shape[d] for d in lhs_batch]
    m = [lhs.shape[d] for d in lhs_free]
    n = [rhs.shape[d] for d in rhs_free]
    k = [lhs.shape[d] for d in lhs_contract]
    a = lhs.permute(*lhs_batch, *lhs_free, *lhs_contract).reshape(
        math.prod(batch), math.prod(m), math.prod(k)
    )
    b = rhs.permute(*rhs_batch, *rhs_contract, *rhs_free).reshape(
        math.prod(batch), math.prod(k), math.prod(n)
    )
    out = torch.mm(a[0], b[0]).unsqueeze(0) if not batch else torch.bmm(a, b)
    return out.reshape(*batch, *m, *n).contiguous()


@dot_general.register_fake
def _(
    lhs: torch.Tensor,
    rhs: torch.Tensor,
    lhs_contract: list[int],
    rhs_contract: list[int],
    lhs_batch: list[int],
    rhs_batch: list[int],
) -> torch.Tensor:
    _check(lhs, rhs, lhs_contract, rhs_contract, lhs_batch, rhs_batch)
    shape = result_shape(lhs.shape, rhs.shape, lhs_contract, rhs_contract, lhs_batch, rhs_batch)
    return lhs.new_empty(shape)
