"""ATen ops kept whole for trn targets (``capture.NEURON_KEPT``), lowered through PyTorch's own
decomposition wherever the trn pattern pass did not turn them into a neuronx-cc kernel call."""

from __future__ import annotations

from typing import Any

from ...capture import NEURON_KEPT, decomposition_table
from ..context import LoweringContext
from ..reference import lower_reference
from ..registry import FLOATS, dtypes_in, lowering


def _rule(op: Any):
    def rule(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Any:
        return lower_reference(ctx, decomposition_table()[op], *args, **kwargs)

    rule.__name__ = rule.__qualname__ = f"lower_{op.name().split('::')[-1]}_decomposed"
    return rule


for _op in NEURON_KEPT:
    if _op.name() != "aten::silu":  # silu has a direct rule (activations.py)
        lowering(_op, supports=dtypes_in(*FLOATS))(_rule(_op))
