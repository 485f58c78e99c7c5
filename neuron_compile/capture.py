"""What AOTAutograd traces with: the decomposition table."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import torch

aten = torch.ops.aten


@lru_cache(maxsize=1)
def decomposition_table() -> dict[Any, Any]:
    """PyTorch's core ATen decompositions.

    Backward ops that core ATen keeps whole (``convolution_backward``,
    ``max_pool2d_with_indices_backward``) have their own lowering rules instead: their StableHLO
    forms (transposed convolution, ``select_and_scatter``) are what neuronx-cc pattern-matches.

    Added on top: ``batch_norm_backward`` (the backward of the newer ``_batch_norm_with_update``
    family), which core ATen leaves whole although PyTorch ships its decomposition into the
    elementwise ops and reductions everything else lowers through.
    """
    from torch._decomp import core_aten_decompositions, get_decompositions

    table = dict(core_aten_decompositions())
    table.update(get_decompositions([aten.batch_norm_backward.default]))
    return table
