"""Reference rules for ATen ops a target keeps whole (``Target.kept_ops``): PyTorch's own
decomposition of the op, lowered, wherever the target's own form did not take the op."""

from __future__ import annotations

from typing import Any

from ...capture import decomposition_table
from ..context import LoweringContext
from ..reference import lower_reference
from ..registry import Support, lowering
from ..rules import floats


def _rule(op: Any):
    def rule(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Any:
        return lower_reference(ctx, decomposition_table()[op], *args, **kwargs)

    rule.__name__ = rule.__qualname__ = f"lower_{op.name().split('::')[-1]}_decomposed"
    return rule


def lower_decomposed(op: Any, supports: Support = floats) -> None:
    """Register the reference rule of ``op``: its decomposition in the cpu target's table."""
    lowering(op, supports=supports)(_rule(op))
