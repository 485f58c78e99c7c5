"""trn legality of ``stablehlo.reduce_window`` (R6.11): neuronx-cc accepts one input with one
init value, and neither base (input) dilation nor window dilation.

Our trn lowering emits only legal reduce-windows: max pooling with indices and cummax/cummin,
whose reference forms are variadic (and dilated, for a dilated max pool), have trn forms in
``lowering_windows.py``. The rule still checks every module, so a hand-written or future form is
reported here with its FX node instead of by neuronx-cc.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch.fx as fx

from .. import errors
from ..lowering.lower_graph import LoweredGraph
from .legality_base import Context, Rule, Violation, legality_rule, ops_named


def _not_ones(values: tuple[int, ...] | None) -> bool:
    return values is not None and any(v != 1 for v in values)


@legality_rule(
    "reduce_window",
    errors.ReduceWindowViolation,
    ("NCC_EVRF017", "NCC_EVRF018", "NCC_EVRF019"),
    "neuronx-cc takes a reduce-window over one tensor with no base or window dilation; our trn "
    "lowering never emits another, so this is a lowering bug unless the module was written by "
    "hand: split a multi-operand reduce-window into single-operand ones, and gather dilated taps "
    "with strided slices",
    rewrite="max pooling with indices: strided-slice window taps (dilation as tap offsets) "
    "stacked and reduced by a variadic reduce; cummax/cummin: a log-step shift-and-combine scan",
    source="R6.11",
)
def check_reduce_window(
    gm: fx.GraphModule, lowered: LoweredGraph, ctx: Context
) -> Iterator[Violation]:
    """Base dilation (EVRF017), window dilation (EVRF018), more than one input (EVRF019: a
    variadic reduce-window has 2N operands, N inputs then N init values)."""
    for op in ops_named(lowered, "reduce_window"):
        node = lowered.node_at_line(op.line)
        of = f" of %{node.name}" if node is not None else ""
        base, window = op.ints("base_dilations"), op.ints("window_dilations")
        inputs = len(op.operand_types) // 2
        found = []
        if _not_ones(base):
            found.append(("NCC_EVRF017", f"base (input) dilation {list(base)}"))
        if _not_ones(window):
            found.append(("NCC_EVRF018", f"window dilation {list(window)}"))
        if inputs != 1:
            found.append(("NCC_EVRF019", f"{inputs} inputs (a variadic reduce_window; 1 allowed)"))
        for code, what in found:
            yield Violation(
                "reduce_window",
                errors.ReduceWindowViolation,
                code,
                f"the reduce_window{of} (module line {op.line}) has {what}",
                node,
            )


#: The rules of this module, in the order their violations are reported.
RULES: tuple[Rule, ...] = (check_reduce_window,)
