"""trn forms of convolution: no input dilation next to kernel dilation or a window stride.

neuronx-cc rejects a ``stablehlo.convolution`` with input (lhs) and kernel (rhs) dilation
together (NCC_EVRF010) and one with a window stride > 1 together with input dilation
(NCC_EVRF011); ``legality_conv.py`` checks both. Of the reference forms
(``lowering/stablehlo/conv.py``) only ``conv_transpose_lhs`` dilates its input: by the forward
stride, at unit window strides, with the forward dilation as kernel dilation. It computes
grad_input of a convolution and the forward of a transposed one, and breaks EVRF010 when stride
and dilation are both > 1 (never EVRF011). ``conv_forward`` (a forward, and grad_input of a
transposed convolution) and ``conv_transpose_rhs`` (grad_weight of either) never dilate their
input.

In that one case the trn form spreads the input by the stride itself (``stablehlo.pad`` with
``stride - 1`` interior zeros, exactly the elements lhs_dilation would place) and convolves it
with unit input dilation, the same padding and the same kernel dilation. Every other convolution
is emitted by the reference rule unchanged, so modules of ordinary convolutions do not change.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..lowering.context import LoweringContext
from ..lowering.emit import Value
from ..lowering.registry import lowering
from ..lowering.rules import floats, floats_and_ints
from ..lowering.stablehlo.conv import (
    conv_transpose_lhs,
    lower_convolution,
    lower_convolution_backward,
)
from . import TRN_KEY

aten = torch.ops.aten


def dilates_input_and_kernel(stride: Sequence[int], dilation: Sequence[int]) -> bool:
    """Whether ``conv_transpose_lhs`` with these forward parameters would emit input dilation
    (the stride) together with kernel dilation (NCC_EVRF010)."""
    return any(s > 1 for s in stride) and any(d > 1 for d in dilation)


def conv_transpose_lhs_undilated(
    ctx: LoweringContext,
    g: Value,
    w: Value,
    in_spatial: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    groups: int,
) -> Value:
    """``conv_transpose_lhs`` without input dilation next to kernel dilation: ``g`` spread by
    the stride with interior padding is what lhs_dilation would convolve, and a spread ``g`` of
    ``(o - 1) * s + 1`` elements at unit stride keeps ``conv_transpose_lhs``'s padding."""
    if not dilates_input_and_kernel(stride, dilation):
        return conv_transpose_lhs(ctx, g, w, in_spatial, stride, padding, dilation, groups)
    e = ctx.emit
    edges = [0] * g.rank
    spread = e.pad(g, e.scalar(0, g.dtype), edges, edges, [0, 0, *(s - 1 for s in stride)])
    unit = [1] * len(stride)
    return conv_transpose_lhs(ctx, spread, w, in_spatial, unit, padding, dilation, groups)


@lowering(aten.convolution.default, key=TRN_KEY, supports=floats_and_ints)
def lower_convolution_trn(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Value:
    return lower_convolution(ctx, *args, **kwargs, transpose_lhs=conv_transpose_lhs_undilated)


@lowering(aten.convolution_backward.default, key=TRN_KEY, supports=floats)
def lower_convolution_backward_trn(
    ctx: LoweringContext, *args: Any, **kwargs: Any
) -> tuple[Value | None, Value | None, Value | None]:
    return lower_convolution_backward(
        ctx, *args, **kwargs, transpose_lhs=conv_transpose_lhs_undilated
    )
