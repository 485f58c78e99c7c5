"""The cpu target's forms of convolutions: grouped ones (``groups > 1``) as kernel taps or one
library convolution per group instead of one grouped ``stablehlo.convolution``, ungrouped ones
whose windows do not overlap (1x1 kernels, patch embeddings, their transposed adjoints) as
matrix products (``windows.py``); every other convolution keeps the reference form, and its
backward computes a float32 grad_output that both gradients read once (``_shared_grad_output``)
before the reference forms read it.

XLA CPU runs a convolution as a library call only without groups. It rewrites a grouped one into
an ungrouped convolution with a block-diagonal kernel (``groups`` times the work: 40x eager for a
depthwise 3x3), and a grouped kernel gradient (``batch_group_count``) into something slower
still (200x eager for ``groups=8``; docs/benchmarks.md). These forms compute the same sums
from the ``K`` kernel taps (``K`` = kernel elements), each a strided slice of the padded input,
or split the groups apart:

* few groups of many channels (2-D, ``_library_per_group``): one ungrouped library convolution
  per group on its channels' slices, the results concatenated;
* few products per output (``C/G * K`` at most ``ELEMENTWISE_TERMS``, for a kernel gradient
  ``KERNEL_GRADIENT_TERMS``; depthwise always):
  ``sum_{c,k} slice_k(x)[c] * w[:, c, k]``, elementwise, one loop XLA fuses;
* other groups: the taps stacked into patches ``(N, G, C/G, K, *out)`` and one ``dot_general``
  batched over the groups (a GEMM per group, as eager's grouped kernels do);
* grad_input: the same forward on grad_output spread by the stride and padded, with the
  per-group transposed, spatially reversed kernel (``conv.swapped_kernel``);
* grad_weight: per input channel and tap, the input's slice times grad_output summed over batch
  and space, all in one variadic reduce that XLA fuses with the slices (a reduce per tap was
  offloaded to YNNPACK one at a time, each tap's slice materialized first: MobileNetV2's
  backward 120 -> 75 ms, ConvNeXt's 8.9 -> 5.8 ms), or, with many products, the input's
  patches contracted with grad_output in one ``dot_general``.

The rules are the reference's (``lower_convolution(_backward)``: batching, bias, masks, result
dtypes) with these three forms passed in, as the trn forms are. Operands compute in
``ctx.compute_dtype`` (float32 for bfloat16/float16) and round once, as the reference rule's
convolution does. Sums run in another order than eager's kernels; the
conformance suite checks them within the same tolerances. Transposed grouped convolutions and
integer ones keep the reference rule.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from itertools import product
from typing import Any

import torch
import torch.fx as fx

from ..lowering.context import LoweringContext
from ..lowering.emit import Value
from ..lowering.registry import lowering
from ..lowering.rules import all_of, arg, floats
from ..lowering.stablehlo.conv import (
    ConvForm,
    conv_forward,
    conv_transpose_lhs,
    conv_transpose_rhs,
    forward_padding,
    lower_convolution,
    lower_convolution_backward,
    swapped_kernel,
    transpose_lhs_padding,
    transpose_rhs_padding,
)
from . import CPU_KEY
from .kept_ops import KEPT_OPS
from .windows import (
    windows_do_not_overlap,
    windows_forward,
    windows_grad_input,
    windows_grad_weight,
)

aten = torch.ops.aten


def _cpu_form(
    groups: int, transposed: int, weight: int, stride: int, padding: int, dilation: int
) -> Callable[[fx.Node], str | None]:
    """Support predicate over the op's argument positions: a regular (not transposed)
    convolution with ``groups > 1``, or an ungrouped one, transposed or not, whose windows do not
    overlap (``windows.py``)."""

    def check(node: fx.Node) -> str | None:
        is_transposed = arg(node, transposed, "transposed", False)
        if int(arg(node, groups, "groups", 1)) > 1:
            return (
                "transposed grouped convolutions keep the reference form" if is_transposed else None
            )
        if windows_do_not_overlap(node, weight, stride, padding, dilation):
            return None
        return (
            "ungrouped convolutions whose windows overlap (kernel larger than the stride, "
            "padding or dilation) keep the reference form (a library call on XLA CPU)"
        )

    check.__name__ = "grouped_or_non_overlapping_convolution"
    return check


def _taps(
    ctx: LoweringContext,
    x: Value,
    kernel: Sequence[int],
    stride: Sequence[int],
    dilation: Sequence[int],
    out_spatial: Sequence[int],
) -> list[Value]:
    """Per kernel element (row-major), the strided slice of the padded ``x (N, C, *S)`` it
    multiplies: ``(N, C, *out_spatial)``."""
    n, c = x.shape[:2]
    slices = []
    for tap in product(*(range(k) for k in kernel)):
        start = [t * d for t, d in zip(tap, dilation, strict=True)]
        limit = [b + (o - 1) * s + 1 for b, o, s in zip(start, out_spatial, stride, strict=True)]
        slices.append(ctx.emit.slice(x, [0, 0, *start], [n, c, *limit], [1, 1, *stride]))
    return slices


def _channel_taps(ctx: LoweringContext, slices: Sequence[Value], groups: int) -> list[Value]:
    """Each tap slice ``(N, C, *out)`` split into its groups' input channels: ``C/G`` values
    ``(N, G, *out)`` per tap, tap-major (``k * C/G + c``)."""
    e = ctx.emit
    n, channels, *out = slices[0].shape
    per_group = channels // groups
    rank = 3 + len(out)
    result = []
    for s in slices:
        if per_group == 1:  # depthwise
            result.append(e.reshape(s, [n, groups, *out]))
            continue
        s = e.reshape(s, [n, groups, per_group, *out])
        for c in range(per_group):
            one = e.slice(s, [0, 0, c, *[0] * len(out)], [n, groups, c + 1, *out], [1] * rank)
            result.append(e.reshape(one, [n, groups, *out]))
    return result


def grouped_forward(
    ctx: LoweringContext,
    x: Value,
    w: Value,
    stride: Sequence[int],
    dilation: Sequence[int],
    out_spatial: Sequence[int],
    groups: int,
) -> Value:
    """``x (N, C, *S)``, already padded, convolved with ``w (O, C/G, *K)`` in ``groups`` groups:
    ``(N, O, *out_spatial)`` in ``x``'s dtype (the compute dtype)."""
    e = ctx.emit
    n = x.shape[0]
    out_ch, in_per_group, kernel = w.shape[0], w.shape[1], list(w.shape[2:])
    out_per_group, taps = out_ch // groups, math.prod(kernel)
    slices = _taps(ctx, x, kernel, stride, dilation, out_spatial)
    wide = [n, groups, out_per_group, *out_spatial]
    w_taps = e.reshape(w, [groups, out_per_group, in_per_group, taps])
    terms = in_per_group * taps
    if _elementwise(in_per_group, taps):  # one product per channel and tap
        space = list(range(3, 3 + len(out_spatial)))
        w_terms = e.reshape(e.transpose(w_taps, [0, 1, 3, 2]), [groups, out_per_group, terms])
        acc = None
        for i, xc in enumerate(_channel_taps(ctx, slices, groups)):
            wi = e.slice(w_terms, [0, 0, i], [groups, out_per_group, i + 1], [1, 1, 1])
            term = e.binary(
                "multiply",
                e.broadcast_in_dim(xc, wide, [0, 1, *space]),
                e.broadcast_in_dim(e.reshape(wi, [groups, out_per_group]), wide, [1, 2]),
            )
            acc = term if acc is None else e.binary("add", acc, term)
        if terms > RECOMPUTED_TERMS:
            acc = _computed_once(ctx, acc)
        return e.reshape(acc, [n, out_ch, *out_spatial])
    split = [n, groups, in_per_group, 1, *out_spatial]
    patches = e.concatenate([e.reshape(s, split) for s in slices], 3)  # (N, G, C/G, K, *out)
    spatial = list(range(4, 4 + len(out_spatial)))
    y = e.dot_general(patches, w_taps, ((2, 3), (2, 3)), ((1,), (0,)))  # (G, N, *out, O/G)
    y = e.transpose(y, [1, 0, len(out_spatial) + 2, *(d - 2 for d in spatial)])
    return e.reshape(y, [n, out_ch, *out_spatial])


#: Grouped convolutions with at most this many products per output (``C/G`` input channels times
#: ``K`` taps; depthwise ones always) compute as elementwise sums of products, with no patches:
#: ResNeXt's (``C/G`` = 2, 4, 8 over 3x3) had their patches materialized twice, once in the
#: concatenation and once transposed for the batched GEMM, and its train step ran at 2.8x eager.
ELEMENTWISE_TERMS = 81

#: The same bound for kernel gradients, whose elementwise form is one variadic reduce with a
#: result per channel and tap: XLA CPU runs that reduce at ~2.5 GMAC/s, so beyond 40 results the
#: patches and one batched GEMM win. ResNeXt's ``C/G`` = 8 (72 results): backward 26.3 -> 24.0 ms,
#: compile 1.83 -> 1.60 s; conv_net's: 2.18 -> 1.65 ms. ``C/G`` = 4 (36) stays elementwise:
#: patches there made ResNeXt's backward 8 % slower.
KERNEL_GRADIENT_TERMS = 40


def _elementwise(in_per_group: int, taps: int, bound: int = ELEMENTWISE_TERMS) -> bool:
    """Whether a grouped convolution (or, with ``KERNEL_GRADIENT_TERMS``, its kernel gradient)
    takes the elementwise form."""
    return in_per_group == 1 or in_per_group * taps <= bound


#: 2-D grouped convolutions with at most this many groups, each over at least
#: ``LIBRARY_CHANNELS`` input channels, compute as one library convolution per group
#: (``_per_group``), as eager's grouped kernels do: the patches form copies every tap into place
#: twice, and the elementwise form's one loop of ``C/G * K`` products per output runs well below
#: a library GEMM's rate once ``C/G`` is 8 or more. Forward + backward of a 3x3 convolution,
#: interleaved medians against the tap forms: conv_net's strided ``groups=2`` (8 channels per
#: group) 0.52x, ``groups=2`` over 32 channels 0.35x, ``groups=4`` over 16 0.32x; ``groups=8``
#: or 16 over 8 channels 0.97-1.00x; over 2 channels per group 1.2-6.7x slower, and 1-D or 3-D
#: convolutions (no faster library path on XLA CPU) 1.1-1.3x slower. conv_net's backward graph:
#: 2.66 -> 1.36 ms, its compile (both graphs) 0.74 -> 0.53 s.
LIBRARY_GROUPS = 4
LIBRARY_CHANNELS = 8


def _library_per_group(groups: int, in_per_group: int, spatial_rank: int) -> bool:
    return spatial_rank == 2 and groups <= LIBRARY_GROUPS and in_per_group >= LIBRARY_CHANNELS


def _per_group(
    ctx: LoweringContext,
    form: ConvForm,
    groups: int,
    a: tuple[Value, int],
    b: tuple[Value, int],
    out_dim: int,
    *geometry: Sequence[int],
) -> Value:
    """``form`` (a reference form: one library convolution) applied with ``groups=1`` to each
    of ``groups`` groups' slices of its two operands, ``(operand, dim holding the groups)``; the
    results concatenated along ``out_dim`` in group order. ``geometry`` is the form's arguments
    between the operands and ``groups``."""
    e = ctx.emit
    (x, x_dim), (y, y_dim) = a, b

    def part(v: Value, dim: int, i: int) -> Value:
        size = v.shape[dim] // groups
        start, limit = [0] * v.rank, list(v.shape)
        start[dim], limit[dim] = i * size, (i + 1) * size
        return e.slice(v, start, limit, [1] * v.rank)

    results = [form(ctx, part(x, x_dim, i), part(y, y_dim, i), *geometry, 1) for i in range(groups)]
    return e.concatenate(results, out_dim)


#: Elementwise sums of more products than this are computed once (``_computed_once``); smaller
#: ones XLA may recompute in each consumer, which costs less than another pass over memory
#: (MobileNetV2's 3x3 depthwise: forward compile +20 % with the divide, execution unchanged).
RECOMPUTED_TERMS = 16


def _computed_once(ctx: LoweringContext, acc: Value) -> Value:
    """``acc`` divided by a 1 XLA cannot prove is 1, so that XLA computes it once.

    XLA CPU fuses a cheap elementwise producer (adds and multiplies) into every consumer, so a
    depthwise sum of 49 taps that feeds a LayerNorm's two reductions, its normalization and the
    saved activation was computed in each of them: ConvNeXt's forward held 16 copies of it
    (1.1 MB of optimized HLO, 0.43 MB now). A float divide counts as expensive and is never
    duplicated. The divisor ``1 + (clz(bits(acc)) >> 6)`` (a count of leading zeros is at most
    32; 64 and ``>> 7`` for float64) is 1 for every value and is computed from ``acc`` itself:
    a divisor that is a constant or a broadcast scalar XLA turns into a multiply. ``x / 1`` is
    exactly ``x``; where XLA contracts the products and sums into fused multiply-adds depends on
    the fusion they land in, so the last bit may differ from the recomputed form's, as with any
    change of fusion. ConvNeXt forward: compile 725 -> 549 ms, execution 9.1 -> 3.1 ms.
    """
    e = ctx.emit
    width = acc.dtype.itemsize * 8
    bits = e.bitcast_convert(acc, {32: torch.int32, 64: torch.int64}[width])
    leading_zeros = e.unary("count_leading_zeros", bits)
    shift = e.full(width.bit_length(), acc.shape, bits.dtype)
    one = e.binary("add", e.binary("shift_right_logical", leading_zeros, shift),
                   e.full(1, acc.shape, bits.dtype))  # fmt: skip
    return e.binary("divide", acc, e.convert(one, acc.dtype))


def _padded(
    ctx: LoweringContext, x: Value, pads: Sequence[tuple[int, int]], spread: Sequence[int]
) -> Value:
    """``x`` with edge padding ``pads`` (negative: cropped) and ``spread - 1`` zeros between
    neighbours (what input dilation would place)."""
    zero = ctx.emit.scalar(0, x.dtype)
    return ctx.emit.pad(x, zero, [0, 0, *(lo for lo, _ in pads)], [0, 0, *(hi for _, hi in pads)],
                        [0, 0, *(s - 1 for s in spread)])  # fmt: skip


def _computing(ctx: LoweringContext, *values: Value) -> list[Value]:
    """Operands in the compute dtype (float32 for bfloat16/float16), as the reference's
    convolution accumulates them."""
    return [ctx.emit.convert(v, ctx.compute_dtype(v.dtype)) for v in values]


def cpu_conv_forward(
    ctx: LoweringContext,
    x: Value,
    w: Value,
    out_spatial: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    groups: int,
) -> Value:
    """``conv.conv_forward`` for the convolutions the cpu forms take: ``(N, O, *out_spatial)`` in
    the compute dtype."""
    x, w = _computing(ctx, x, w)
    if groups == 1:
        return windows_forward(ctx, x, w, out_spatial, stride)
    if _library_per_group(groups, w.shape[1], w.rank - 2):
        geometry = (out_spatial, stride, padding, dilation)
        return _per_group(ctx, conv_forward, groups, (x, 1), (w, 0), 1, *geometry)
    pads = forward_padding(x, w, out_spatial, stride, padding, dilation)
    unit = [1] * len(pads)
    return grouped_forward(ctx, _padded(ctx, x, pads, unit), w, stride, dilation, out_spatial,
                           groups)  # fmt: skip


@lowering(
    aten.convolution.default, key=CPU_KEY, supports=all_of(floats, _cpu_form(8, 6, 1, 3, 4, 5))
)
def lower_grouped_convolution(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Value:
    return lower_convolution(
        ctx, *args, **kwargs, forward=cpu_conv_forward, transpose_lhs=cpu_grad_input
    )


def cpu_grad_input(
    ctx: LoweringContext,
    g: Value,
    w: Value,
    in_spatial: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    groups: int,
) -> Value:
    """grad_input of a grouped convolution: ``g (N, O, *S')`` spread by the stride and padded,
    convolved with the per-group transposed, reversed kernel ``(C, O/G, *K)`` (ungrouped:
    ``windows.py``; also a transposed convolution's forward)."""
    g, w = _computing(ctx, g, w)
    if groups == 1:
        return windows_grad_input(ctx, g, w, in_spatial, stride)
    if _library_per_group(groups, w.shape[1], w.rank - 2):
        geometry = (in_spatial, stride, padding, dilation)
        return _per_group(ctx, conv_transpose_lhs, groups, (g, 1), (w, 0), 1, *geometry)
    n = w.rank - 2
    k = ctx.emit.transpose(swapped_kernel(ctx, w, groups), [1, 0, *range(2, n + 2)])
    pads = transpose_lhs_padding(g, w, in_spatial, stride, padding, dilation)
    spread = _padded(ctx, g, pads, stride)
    return grouped_forward(ctx, spread, k, [1] * n, dilation, in_spatial, groups)


def _sums(ctx: LoweringContext, products: Sequence[Value], space: Sequence[int]) -> list[Value]:
    """Each of ``products (N, G, O/G, *S')`` summed over batch and space, all in one variadic
    ``stablehlo.reduce``."""
    e = ctx.emit
    zeros = [e.scalar(0, p.dtype) for p in products]
    k = len(products)
    return e.reduce(
        products, zeros, [0, *space], lambda *a: [e.binary("add", a[i], a[k + i]) for i in range(k)]
    )


def cpu_grad_weight(
    ctx: LoweringContext,
    x: Value,
    g: Value,
    kernel: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    groups: int,
) -> Value:
    """grad_weight ``(O, C/G, *K)``: the input's tap patches contracted with ``g (N, O, *S')``
    over batch and output positions, per group (ungrouped: ``windows.py``)."""
    e = ctx.emit
    x, g = _computing(ctx, x, g)
    if groups == 1:
        return windows_grad_weight(ctx, x, g, kernel, stride)
    if _library_per_group(groups, x.shape[1] // groups, len(kernel)):
        geometry = (kernel, stride, padding, dilation)
        return _per_group(ctx, conv_transpose_rhs, groups, (x, 1), (g, 1), 0, *geometry)
    n, channels = x.shape[:2]
    out_spatial, out_ch = list(g.shape[2:]), g.shape[1]
    in_per_group, rank = channels // groups, len(kernel)
    pads = transpose_rhs_padding(x, g, kernel, stride, padding, dilation)
    slices = _taps(ctx, _padded(ctx, x, pads, [1] * rank), kernel, stride, dilation,
                   out_spatial)  # fmt: skip
    gg = e.reshape(g, [n, groups, out_ch // groups, *out_spatial])
    space = list(range(3, 3 + rank))
    if _elementwise(in_per_group, len(slices), KERNEL_GRADIENT_TERMS):
        # per channel and tap, a product reduced over batch and space, all in one reduce
        products = [
            e.binary("multiply", e.broadcast_in_dim(xc, gg.shape, [0, 1, *space]), gg)
            for xc in _channel_taps(ctx, slices, groups)
        ]
        sums = [e.reshape(t, [groups, out_ch // groups, 1]) for t in _sums(ctx, products, space)]
        gw = e.reshape(
            e.concatenate(sums, 2), [groups, out_ch // groups, len(slices), in_per_group]
        )
        return e.reshape(e.transpose(gw, [0, 1, 3, 2]), [out_ch, in_per_group, *kernel])
    split = [n, groups, in_per_group, 1, *out_spatial]
    patches = e.concatenate([e.reshape(s, split) for s in slices], 3)  # (N, G, C/G, K, *out)
    gw = e.dot_general(gg, patches, ((0, *space), (0, *(d + 1 for d in space))), ((1,), (1,)))
    return e.reshape(gw, [out_ch, in_per_group, *kernel])  # (G, O/G, C/G, K) in order


def _shared_grad_output(node: fx.Node) -> bool:
    """Whether ``node`` (an ungrouped, regular convolution_backward that keeps the reference
    forms) should compute its float32 grad_output once: both gradients read it, and it comes out
    of elementwise code XLA would otherwise fuse into each of them."""
    grad_out, mask = node.args[0], arg(node, 10, "output_mask", (True, True, True))
    val = grad_out.meta.get("val") if isinstance(grad_out, fx.Node) else None
    return (
        not arg(node, 7, "transposed", False)
        and bool(mask[0] and mask[1])
        and val is not None
        and val.dtype == torch.float32
        and grad_out.op == "call_function"
        and (
            # another op's result is already in memory, except the grad_input of a norm's
            # backward kept whole (kept_ops.py): elementwise code around its sums, which XLA
            # fuses into each reader as it did the decomposition
            grad_out.target is not operator.getitem
            or getattr(grad_out.args[0], "target", None) in KEPT_OPS
        )
    )


#: ``_cpu_form`` over convolution_backward's argument positions.
_cpu_backward_form = _cpu_form(9, 7, 2, 4, 5, 6)


def _backward_form(node: fx.Node) -> str | None:
    """Support predicate of the cpu backward rule: the forms above, or a shared grad_output."""
    reason = _cpu_backward_form(node)
    if reason is None or _shared_grad_output(node):
        return None
    return reason


@lowering(aten.convolution_backward.default, key=CPU_KEY, supports=all_of(floats, _backward_form))
def lower_grouped_convolution_backward(
    ctx: LoweringContext, grad_out: Value, *args: Any, **kwargs: Any
) -> tuple[Value | None, Value | None, Value | None]:
    if _cpu_backward_form(ctx.node) is not None:
        # The reference forms (library convolutions), which read grad_output in two layouts: XLA
        # CPU transposes it for the input gradient (NHWC) and for the kernel gradient (as the
        # kernel, HWNC), and fused the elementwise code that makes it (a BatchNorm's and a ReLU's
        # backward) into each transpose. Computed once, it is read twice instead: a ResNet-18
        # backward 31.2 -> 29.2 ms, a UNet's 13.4 -> 12.4 ms (docs/benchmarks.md).
        return lower_convolution_backward(ctx, _computed_once(ctx, grad_out), *args, **kwargs)
    return lower_convolution_backward(
        ctx,
        grad_out,
        *args,
        **kwargs,
        transpose_lhs=cpu_grad_input,
        transpose_rhs=cpu_grad_weight,
        forward=cpu_conv_forward,
    )
