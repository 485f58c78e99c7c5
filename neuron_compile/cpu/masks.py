"""The cpu target's product of a tensor with a 0/1 mask: ``x * mask`` and ``x * mask.float()``.

XLA CPU's algebraic simplifier rewrites ``multiply(x, convert(pred))`` into
``select(pred, x, 0)``. That is not IEEE multiplication: where the mask is 0, eager's product is
``x * 0``, NaN for an infinite or NaN ``x`` and -0.0 for a negative one, and the rewrite gives
+0.0 (``-inf * False``: eager NaN, XLA CPU 0.0). The artifact itself is right, so trn targets keep
it; the cpu target emits the product as ``select(mask != 0, x, x * 0)``, which XLA leaves alone and
which equals the product bit for bit: ``x * 1`` is ``x``, and ``x * 0`` is kept as computed.

The form is taken when an operand is a bool tensor (promoted by the multiplication), a Bernoulli
draw (``x * torch.bernoulli(p)``), or a dtype conversion of one, possibly behind view ops (``mask.float().unsqueeze(0)``), in the same graph. A
mask that reaches the graph as an input (a forward's mask saved for the backward) is not known
to be 0/1 and keeps the reference form.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from ..lowering.context import LoweringContext
from ..lowering.emit import Value
from ..lowering.registry import lowering
from ..lowering.rules import FLOATS
from ..saved_views import VIEW_OPS
from . import CPU_KEY

aten = torch.ops.aten
prims = torch.ops.prims

#: Ops that change only a tensor's dtype: a bool's conversion is still 0/1.
_CONVERSIONS = frozenset(
    {aten._to_copy.default, prims.convert_element_type.default, aten.clone.default}
)
#: Ops whose floating result is 0 or 1: their lowering converts a comparison too.
_ZERO_ONE_DRAWS = frozenset({aten.bernoulli.default, aten.bernoulli.p})


def _dtype(node: Any) -> torch.dtype | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return val.dtype if isinstance(val, torch.Tensor) else None


def is_zero_one(node: Any) -> bool:
    """Whether ``node`` is a bool tensor or a Bernoulli draw, or a conversion or view of one, in
    this graph."""
    while isinstance(node, fx.Node):
        if _dtype(node) == torch.bool or node.target in _ZERO_ONE_DRAWS:
            return True
        if node.op != "call_function" or node.target not in VIEW_OPS | _CONVERSIONS:
            return False
        node = node.args[0]
    return False


def _mask_position(node: fx.Node) -> int | None:
    """Which of the multiplication's two operands is the 0/1 mask (the second if both are)."""
    for i in (1, 0):
        if is_zero_one(node.args[i]):
            return i
    return None


def real_float_times_mask(node: fx.Node) -> str | None:
    """Support predicate: a real floating product with a 0/1 mask operand."""
    if _dtype(node) not in (*FLOATS, torch.float64):
        return "only real floating products with a mask need the select form"
    if _mask_position(node) is None:
        return "no operand is a bool tensor or a conversion of one"
    return None


@lowering(aten.mul.Tensor, key=CPU_KEY, supports=real_float_times_mask)
def lower_masked_product(ctx: LoweringContext, a: Value, b: Value) -> Value:
    e = ctx.emit
    mask_first = _mask_position(ctx.node) == 0
    x, mask = ctx.promote(b, a) if mask_first else ctx.promote(a, b)
    zero = ctx.full_like(0, x)
    product = e.select(e.compare(mask, zero, "NE"), x, e.binary("multiply", x, zero))
    return e.convert(product, ctx.out_dtype)
