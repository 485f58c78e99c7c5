"""The cpu target's forms of pointwise convolutions (a 1x1 kernel, no padding, no groups): matrix
products on the NCHW layout the graph already has.

XLA CPU runs every convolution in NHWC: it transposes the NCHW input to NHWC and the result
back, element by element, on either side of every convolution and of its gradients. A pointwise
convolution is ``w (O, C) @ x[n] (C, P)`` for each batch element (``P`` the output positions):

* forward: ``w (O, C)`` contracted with ``x (N, C, P)`` gives ``(O, N, P)``, then batch first,
  a transpose that moves whole rows of ``P`` elements;
* grad_input: ``w^T`` contracted with ``g (N, O, P)`` the same way, then spread back over the
  input positions by the stride;
* grad_weight: ``g`` contracted with ``x`` over batch and positions together, ``(O, C)``.

No operand grows with the batch (a kernel broadcast to ``(N, O, C)`` for one batched product
would, and XLA materializes it).

A stride takes every ``stride``-th input position first (what a 1x1 kernel reads). Operands
compute in ``ctx.compute_dtype`` (float32 for bfloat16/float16), as the reference rule's
convolution does. The sums run over the same ``C`` (forward, grad_input) or ``N*P``
(grad_weight) products as eager's, in another order; the conformance suite checks them within
the same tolerances.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch.fx as fx

from ..lowering.context import LoweringContext
from ..lowering.emit import Value
from ..lowering.rules import arg


def is_pointwise(node: fx.Node, weight_index: int, padding_index: int) -> bool:
    """Whether ``node`` convolves with a kernel of one element and no padding."""
    weight = node.args[weight_index] if len(node.args) > weight_index else None
    val = weight.meta.get("val") if isinstance(weight, fx.Node) else None
    if val is None or math.prod(val.shape[2:]) != 1:
        return False
    padding = arg(node, padding_index, "padding", [0])
    return all(int(p) == 0 for p in padding)


def _positions(ctx: LoweringContext, x: Value, stride: Sequence[int]) -> Value:
    """``x (N, C, *S)`` at the positions a 1x1 kernel reads with ``stride``: ``(N, C, P)``."""
    n, c, *spatial = x.shape
    if any(s != 1 for s in stride):
        limit = [n, c, *spatial]
        x = ctx.emit.slice(x, [0] * x.rank, limit, [1, 1, *stride])
    return ctx.emit.reshape(x, [n, c, math.prod(x.shape[2:])])


def _matrix(ctx: LoweringContext, w: Value) -> Value:
    """``w (O, C, 1, ...)`` as the matrix ``(O, C)``."""
    return ctx.emit.reshape(w, list(w.shape[:2]))


def _batch_first(ctx: LoweringContext, y: Value, spatial: Sequence[int]) -> Value:
    """A product ``(F, N, P)`` (features first, as ``dot_general`` orders them) as
    ``(N, F, *spatial)``: a transpose that moves whole rows of ``P`` positions."""
    t = ctx.emit.transpose(y, [1, 0, 2])
    return ctx.emit.reshape(t, [t.shape[0], t.shape[1], *spatial])


def pointwise_forward(
    ctx: LoweringContext, x: Value, w: Value, out_spatial: Sequence[int], stride: Sequence[int]
) -> Value:
    """``(N, O, *out_spatial)`` in ``x``'s dtype (the compute dtype)."""
    y = ctx.emit.dot_general(_matrix(ctx, w), _positions(ctx, x, stride), ((1,), (1,)), ((), ()))
    return _batch_first(ctx, y, out_spatial)


def pointwise_grad_input(
    ctx: LoweringContext, g: Value, w: Value, in_spatial: Sequence[int], stride: Sequence[int]
) -> Value:
    """``(N, C, *in_spatial)``: ``w^T @ g[n]`` at the positions the kernel read, zero elsewhere."""
    e = ctx.emit
    n, out_spatial = g.shape[0], list(g.shape[2:])
    flat = e.reshape(g, [n, g.shape[1], math.prod(out_spatial)])
    gx = _batch_first(ctx, e.dot_general(_matrix(ctx, w), flat, ((0,), (1,)), ((), ())),
                      out_spatial)  # fmt: skip
    if list(out_spatial) == list(in_spatial):
        return gx
    # Read positions i * stride; the input's trailing positions past the last one get zeros.
    high = [
        size - ((o - 1) * s + 1) for size, o, s in zip(in_spatial, out_spatial, stride, strict=True)
    ]
    zero = e.scalar(0, gx.dtype)
    return e.pad(gx, zero, [0] * gx.rank, [0, 0, *high], [0, 0, *(s - 1 for s in stride)])


def pointwise_grad_weight(ctx: LoweringContext, x: Value, g: Value, stride: Sequence[int]) -> Value:
    """``(O, C, 1, ...)``: ``g[n] @ x[n]^T`` summed over the batch, one product over batch and
    positions together."""
    e = ctx.emit
    n, out_ch = g.shape[:2]
    flat = e.reshape(g, [n, out_ch, math.prod(g.shape[2:])])
    gw = e.dot_general(flat, _positions(ctx, x, stride), ((0, 2), (0, 2)), ((), ()))  # (O, C)
    return e.reshape(gw, [out_ch, x.shape[1], *([1] * (x.rank - 2))])
