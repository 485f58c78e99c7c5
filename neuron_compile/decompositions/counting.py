"""Counting with a scatter-add in float32: exact below 2**24, and a form neuronx-cc takes.

neuronx-cc has no integer datapath for a scatter with accumulation: it computes an integer
scatter-add in f32 and rejects it as lossy above 2**24 (NCC_EVRF060,
``trainium/legality.py``). The decompositions that count (bag and segment ids, ties, zeros and
NaNs per segment) add at most ``index.numel()`` ones into any count, which float32 holds exactly
below 2**24: they count in float32 on every target and convert, giving the same integers.
"""

from __future__ import annotations

import torch

#: float32 holds every integer up to this exactly
EXACT_IN_FLOAT32 = 2**24


def scatter_count(
    shape: tuple[int, ...] | list[int], dim: int, index: torch.Tensor, hits: torch.Tensor | None
) -> torch.Tensor:
    """int64 counts of ``shape``: at each position, how many ``hits`` (all of ``index`` if None)
    ``index`` sends there along ``dim`` (``zeros(shape).scatter_add(dim, index, hits)``)."""
    dtype = torch.float32 if index.numel() < EXACT_IN_FLOAT32 else torch.int64
    ones = torch.ones(index.shape, dtype=dtype, device=index.device)
    src = ones if hits is None else hits.to(dtype)
    counts = torch.zeros(shape, dtype=dtype, device=index.device).scatter_add(dim, index, src)
    return counts.to(torch.int64)


def scatter_min_position(
    shape: tuple[int, ...] | list[int],
    dim: int,
    index: torch.Tensor,
    positions: torch.Tensor,
    n: int,
) -> torch.Tensor:
    """int64 ``full(shape, n).scatter_reduce(dim, index, positions, "amin")``: the first of the
    ``positions`` (each in ``[0, n]``) ``index`` sends to each place, ``n`` where none goes. An
    integer amin has no integer datapath on Trainium either; positions below 2**24 are exact in
    float32."""
    dtype = torch.float32 if n < EXACT_IN_FLOAT32 else torch.int64
    first = torch.full(shape, n, dtype=dtype, device=index.device)
    return first.scatter_reduce(dim, index, positions.to(dtype), "amin").to(torch.int64)
