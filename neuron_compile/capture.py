"""What AOTAutograd traces with: the decomposition table."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import torch

from .targets import is_neuron_target

aten = torch.ops.aten


#: ATen ops kept whole for trn targets: the trn pattern pass turns them into neuronx-cc's kernel
#: calls (``ops/fused.py``); where it does not, their rules lower PyTorch's own decomposition.
NEURON_KEPT = (
    aten.silu.default,
    aten.silu_backward.default,
    aten.gelu_backward.default,
    aten._softmax_backward_data.default,
)


@lru_cache(maxsize=4)
def decomposition_table(target: str = "cpu") -> dict[Any, Any]:
    """PyTorch's core ATen decompositions.

    Backward ops that core ATen keeps whole (``convolution_backward``,
    ``max_pool2d_with_indices_backward``) have their own lowering rules instead: their StableHLO
    forms (transposed convolution, ``select_and_scatter``) are what neuronx-cc pattern-matches.

    Added on top: ``batch_norm_backward`` (the backward of the newer ``_batch_norm_with_update``
    family), which core ATen leaves whole although PyTorch ships its decomposition into the
    elementwise ops and reductions everything else lowers through; and the fused inference ops
    of ``torch.nn``'s fast path (``decompositions.py``).

    For trn targets the ops in ``NEURON_KEPT`` stay whole.
    """
    from torch._decomp import core_aten_decompositions, get_decompositions

    from .decompositions import FAST_PATH_DECOMPOSITIONS

    table = dict(core_aten_decompositions())
    table.update(get_decompositions([aten.batch_norm_backward.default]))
    table.update(FAST_PATH_DECOMPOSITIONS)
    if is_neuron_target(target):
        for op in NEURON_KEPT:
            table.pop(op, None)
    return table
