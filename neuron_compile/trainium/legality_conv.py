"""trn legality of convolution forms (``docs/trainium-reference.md`` R6.10).

neuronx-cc rejects a ``stablehlo.convolution`` that dilates its input (``lhs_dilation``) and its
kernel (``rhs_dilation``) at once (NCC_EVRF010), or that dilates its input and strides its window
(``window_strides``) at once (NCC_EVRF011). The error pages name no per-dim exception, so the
rule reads them per op: any dim > 1 of each attribute counts. Our trn lowering
(``lowering_conv.py``) never emits either form: the rule fires for modules written by hand, or
for a lowering that bypasses the trn forms.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch.fx as fx

from .. import errors
from ..lowering.lower_graph import LoweredGraph
from .legality_base import Context, HloOp, Rule, Violation, legality_rule, ops_named

#: What neuronx-cc rejects > 1 together with input dilation in one convolution: (attribute,
#: code, what it is)
_NOT_WITH_INPUT_DILATION = (
    ("rhs_dilation", "NCC_EVRF010", "input and kernel dilation together"),
    ("window_strides", "NCC_EVRF011", "a window stride with input dilation"),
)


def _above_one(op: HloOp, attribute: str) -> tuple[int, ...] | None:
    """The attribute's values if any exceeds 1 (absent means all 1), else None."""
    values = op.ints(attribute)
    return values if values and any(v > 1 for v in values) else None


@legality_rule(
    "convolution_form",
    errors.ConvolutionFormViolation,
    ("NCC_EVRF010", "NCC_EVRF011"),
    "neuronx-cc cannot dilate a convolution's input together with its kernel or with a window "
    "stride. torch convolutions lower legally for trn (a stride and a dilation both > 1 in a "
    "transposed convolution or a convolution's input gradient are rewritten), so this is a "
    "lowering bug unless the module was written by hand: there, spread the input with "
    "stablehlo.pad interior padding (stride - 1 zeros) and convolve with lhs_dilation 1",
    rewrite="input spread by stablehlo.pad interior padding, then convolved with lhs_dilation 1",
    source="R6.10",
)
def check_convolution_dilation(
    gm: fx.GraphModule, lowered: LoweredGraph, ctx: Context
) -> Iterator[Violation]:
    """Input dilation with kernel dilation (EVRF010) or with a window stride > 1 (EVRF011)."""
    for op in ops_named(lowered, "convolution"):
        lhs = _above_one(op, "lhs_dilation")
        if lhs is None:
            continue
        node = lowered.node_at_line(op.line)
        origin = f" of %{node.name}" if node is not None else ""
        for other, code, what in _NOT_WITH_INPUT_DILATION:
            values = _above_one(op, other)
            if values is not None:
                yield Violation(
                    "convolution_form",
                    errors.ConvolutionFormViolation,
                    code,
                    f"the convolution{origin} has {what} (lhs_dilation {list(lhs)}, {other} "
                    f"{list(values)})",
                    node,
                )


#: The rules of this module, in the order their violations are reported.
RULES: tuple[Rule, ...] = (check_convolution_dilation,)
