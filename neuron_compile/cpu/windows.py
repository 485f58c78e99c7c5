"""The cpu target's forms of convolutions whose windows do not overlap (no groups, no padding, no
dilation, every kernel extent at most its stride): matrix products on the NCHW layout the graph
already has. Pointwise convolutions (1x1 kernels), patch embeddings (ViT, ConvNeXt's stem and
downsampling: kernel = stride) and transposed convolutions with kernel = stride (UNet
up-sampling, the adjoint of a patch embedding) are all of this kind.

XLA CPU runs every convolution in NHWC: it transposes the NCHW input to NHWC and the result
back, element by element, on either side of every convolution and of its gradients; and it
runs a transposed convolution as a convolution of the input spread with zeros. When windows do
not overlap, each input position is read at most once, so the input rearranges into its windows
``X (N, C*K, P)`` (``K`` kernel elements, ``P`` output positions; for a 1x1 kernel a reshape) and
the convolution of ``x`` by ``w (O, C, *K)`` is ``W (O, C*K)`` times ``X``:

* forward: ``W`` contracted with ``X`` gives ``(O, N, P)``, then batch first, a transpose that
  moves whole rows of ``P`` elements;
* grad_input (and a transposed convolution's forward): ``W^T`` contracted with ``g (N, O, P)``,
  put back from windows to positions, zeros where no window reads;
* grad_weight: ``g`` contracted with ``X`` over batch and positions together, ``(O, C*K)``.

No operand grows with the batch (a kernel broadcast to ``(N, O, C*K)`` for one batched product
would, and XLA materializes it). Operands compute in ``ctx.compute_dtype`` (float32 for
bfloat16/float16), as the reference rule's convolution does; the sums run over the same
products as eager's, in another order, and the conformance suite checks them within the same
tolerances.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch.fx as fx

from ..lowering.context import LoweringContext
from ..lowering.emit import Value
from ..lowering.rules import arg
from ..lowering.stablehlo.conv import per_dim


def windows_do_not_overlap(
    node: fx.Node, weight_index: int, stride_index: int, padding_index: int, dilation_index: int
) -> bool:
    """Whether ``node`` convolves with no padding, no dilation and every kernel extent at most
    its stride (so no input position is read twice)."""
    weight = node.args[weight_index] if len(node.args) > weight_index else None
    val = weight.meta.get("val") if isinstance(weight, fx.Node) else None
    if val is None:
        return False
    kernel = [int(k) for k in val.shape[2:]]
    rank = len(kernel)
    stride = per_dim(arg(node, stride_index, "stride", [1]), rank)
    padding = per_dim(arg(node, padding_index, "padding", [0]), rank)
    dilation = per_dim(arg(node, dilation_index, "dilation", [1]), rank)
    return (
        all(p == 0 for p in padding)
        and (all(d == 1 for d in dilation) or math.prod(kernel) == 1)
        and all(k <= s for k, s in zip(kernel, stride, strict=True))
    )


def _resized(ctx: LoweringContext, x: Value, sizes: Sequence[int]) -> Value:
    """``x (N, C, *S)`` cut or zero-padded at the high end of each spatial dim to ``sizes``."""
    e = ctx.emit
    if list(x.shape[2:]) == list(sizes):
        return x
    cut = [min(a, b) for a, b in zip(x.shape[2:], sizes, strict=True)]
    if cut != list(x.shape[2:]):
        x = e.slice(x, [0] * x.rank, [*x.shape[:2], *cut], [1] * x.rank)
    high = [b - a for a, b in zip(x.shape[2:], sizes, strict=True)]
    if any(high):
        x = e.pad(x, e.scalar(0, x.dtype), [0] * x.rank, [0, 0, *high], [0] * x.rank)
    return x


def _windows(ctx: LoweringContext, x: Value, kernel: Sequence[int], stride: Sequence[int],
             out: Sequence[int]) -> Value:  # fmt: skip
    """``x (N, C, *S)`` as its windows ``(N, C*K, P)``, kernel elements after channels."""
    e = ctx.emit
    n, c, r = x.shape[0], x.shape[1], len(kernel)
    blocks = _resized(ctx, x, [o * s for o, s in zip(out, stride, strict=True)])
    blocks = e.reshape(
        blocks, [n, c, *(d for o, s in zip(out, stride, strict=True) for d in (o, s))]
    )
    if list(kernel) != list(stride):
        limit = [n, c, *(d for o, k in zip(out, kernel, strict=True) for d in (o, k))]
        blocks = e.slice(blocks, [0] * blocks.rank, limit, [1] * blocks.rank)
    order = [0, 1, *(3 + 2 * i for i in range(r)), *(2 + 2 * i for i in range(r))]
    return e.reshape(e.transpose(blocks, order), [n, c * math.prod(kernel), math.prod(out)])


def _positions(ctx: LoweringContext, y: Value, channels: int, kernel: Sequence[int],
               stride: Sequence[int], out: Sequence[int], spatial: Sequence[int]) -> Value:  # fmt: skip
    """The adjoint of ``_windows``: ``y (N, C*K, P)`` back at its input positions
    ``(N, C, *spatial)``, zeros where no window reads."""
    e = ctx.emit
    n, r = y.shape[0], len(kernel)
    y = e.reshape(y, [n, channels, *kernel, *out])
    order = [0, 1, *(d for i in range(r) for d in (2 + r + i, 2 + i))]
    y = e.transpose(y, order)  # (N, C, o1, k1, o2, k2, ...)
    if list(kernel) != list(stride):
        high = [0, 0, *(d for k, s in zip(kernel, stride, strict=True) for d in (0, s - k))]
        y = e.pad(y, e.scalar(0, y.dtype), [0] * y.rank, high, [0] * y.rank)
    y = e.reshape(y, [n, channels, *(o * s for o, s in zip(out, stride, strict=True))])
    return _resized(ctx, y, spatial)


def _matrix(ctx: LoweringContext, w: Value) -> Value:
    """``w (O, C, *K)`` as the matrix ``(O, C*K)``."""
    return ctx.emit.reshape(w, [w.shape[0], math.prod(w.shape[1:])])


def _batch_first(ctx: LoweringContext, y: Value) -> Value:
    """A product ``(F, N, P)`` (features first, as ``dot_general`` orders them) as ``(N, F, P)``:
    a transpose that moves whole rows of ``P`` elements."""
    return ctx.emit.transpose(y, [1, 0, 2])


def windows_forward(ctx: LoweringContext, x: Value, w: Value, out_spatial: Sequence[int],
                    stride: Sequence[int]) -> Value:  # fmt: skip
    """``(N, O, *out_spatial)`` in ``x``'s dtype (the compute dtype)."""
    kernel = list(w.shape[2:])
    xw = _windows(ctx, x, kernel, stride, out_spatial)
    y = _batch_first(ctx, ctx.emit.dot_general(_matrix(ctx, w), xw, ((1,), (1,)), ((), ())))
    return ctx.emit.reshape(y, [x.shape[0], w.shape[0], *out_spatial])


def windows_grad_input(ctx: LoweringContext, g: Value, w: Value, in_spatial: Sequence[int],
                       stride: Sequence[int]) -> Value:  # fmt: skip
    """``(N, C, *in_spatial)``: ``w^T @ g`` at the positions the windows read, zero elsewhere.
    Also a transposed convolution's forward (``w`` then is its ``(in, out, *K)`` weight)."""
    e = ctx.emit
    n, out_spatial = g.shape[0], list(g.shape[2:])
    flat = e.reshape(g, [n, g.shape[1], math.prod(out_spatial)])
    y = _batch_first(ctx, e.dot_general(_matrix(ctx, w), flat, ((0,), (1,)), ((), ())))
    return _positions(ctx, y, w.shape[1], list(w.shape[2:]), stride, out_spatial, in_spatial)


def windows_grad_weight(ctx: LoweringContext, x: Value, g: Value, kernel: Sequence[int],
                        stride: Sequence[int]) -> Value:  # fmt: skip
    """``(O, C, *kernel)``: ``g`` contracted with ``x``'s windows over batch and positions."""
    e = ctx.emit
    n, out_ch, out_spatial = g.shape[0], g.shape[1], list(g.shape[2:])
    flat = e.reshape(g, [n, out_ch, math.prod(out_spatial)])
    xw = _windows(ctx, x, kernel, stride, out_spatial)
    gw = e.dot_general(flat, xw, ((0, 2), (0, 2)), ((), ()))  # (O, C*K)
    return e.reshape(gw, [out_ch, x.shape[1], *kernel])
