"""The cpu target's max-pool backward for windows that tile the input (kernel = stride, no padding
or dilation, every pooled size a multiple of the kernel: ``MaxPool2d(2)``, as conv nets and UNets
use it).

Windows that tile are a reshape: ``(N, C, H, W)`` is ``(N, C, H/k, k, W/k, k)``, and the gradient
is elementwise there: an input element gets its window's grad_output when the window's saved
index is the element's own position, else zero. The reference rule scatter-adds grad_output at
the indices, which XLA CPU runs as a loop of single-element updates: conv_net's backward 1.84 ->
1.74 ms, a UNet's 16.9 -> 16.2 ms (docs/benchmarks.md). The forward keeps the reference form
(a fused reduce over the same reshape measured no faster).

The form relies on the indices pointing inside their own windows, which holds for the indices of
the matching forward max pool and nothing else: it is taken only when the indices are that
pool's output in the same graph, or a saved input the partitioner recorded as such
(``saved.POOL_INDICES``). Each input element receives at most one gradient, as in eager's
scatter-add onto zeros (where the gradient is -0.0, eager's ``0 + g`` is +0.0, and so is ours).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx

from ..lowering.context import LoweringContext
from ..lowering.emit import Value
from ..lowering.registry import lowering
from ..lowering.rules import all_of, arg
from ..lowering.stablehlo.pooling import float_first_arg, pool_dims
from ..saved import POOL_INDICES, PoolCall, max_pool_of_indices, plain_ints, pool_call
from . import CPU_KEY

aten = torch.ops.aten

_SPATIAL = {
    aten.max_pool2d_with_indices_backward.default: 2,
    aten.max_pool3d_with_indices_backward.default: 3,
}
_FORWARD_OF = {
    aten.max_pool2d_with_indices_backward.default: aten.max_pool2d_with_indices.default,
    aten.max_pool3d_with_indices_backward.default: aten.max_pool3d_with_indices.default,
}


def _window(call: PoolCall, n: int) -> tuple[Any, ...]:
    """``call`` with torch's defaults and one-value-for-all-dims expansion applied."""
    op, shape, kernel_size, stride, padding, dilation, ceil_mode = call
    kernel = pool_dims(kernel_size, (), n)
    return (op, shape, kernel, pool_dims(stride, kernel, n), pool_dims(padding, [0] * n, n),
            pool_dims(dilation, [1] * n, n), ceil_mode)  # fmt: skip


def _tiling_kernel(call: PoolCall, n: int) -> list[int] | None:
    """The kernel of a max pool whose windows tile its input, else None."""
    _, shape, kernel, stride, padding, dilation, _ = _window(call, n)
    tiles = all(s % k == 0 for s, k in zip(shape[-n:], kernel, strict=True))
    return (
        kernel
        if tiles and stride == kernel and padding == [0] * n and dilation == [1] * n
        else None
    )


_NOT_TILING = "windows that overlap, skip, pad or leave a partial window keep the reference form"


def _backward_call(node: fx.Node) -> PoolCall:
    """The ``PoolCall`` of the forward max pool a ``*_backward`` node inverts."""
    x = node.args[1].meta["val"]
    args = [plain_ints(arg(node, i, name)) for i, name in enumerate(_BACKWARD_ARGS, start=2)]
    return (str(_FORWARD_OF[node.target]), tuple(int(d) for d in x.shape), *args[:4], bool(args[4]))


_BACKWARD_ARGS = ("kernel_size", "stride", "padding", "dilation", "ceil_mode")


def _indices_call(node: fx.Node) -> PoolCall | None:
    """The ``PoolCall`` of the max pool whose indices the backward ``node`` receives, if known."""
    indices = arg(node, 7, "indices")
    pool = max_pool_of_indices(indices)
    if pool is not None:
        return pool_call(pool)
    if isinstance(indices, fx.Node) and indices.op == "placeholder":
        module = node.graph.owning_module
        saved = module.meta.get(POOL_INDICES) if module is not None else None
        return (saved or {}).get(indices.name)
    return None


def indices_of_this_pool_and_windows_tile(node: fx.Node) -> str | None:
    """Support predicate of the backward form."""
    n, call = _SPATIAL[node.target], _backward_call(node)
    if _tiling_kernel(call, n) is None:
        return _NOT_TILING
    known = _indices_call(node)
    if known is None or _window(known, n) != _window(call, n):
        return "indices not known to come from this max pool keep the reference form (scatter-add)"
    return None


def _tiles(x: Value, kernel: Sequence[int]) -> tuple[list[int], list[int]]:
    """``x``'s shape with every pooled dim ``S`` split into ``(S/k, k)``, and the ``k`` dims."""
    n = len(kernel)
    lead = list(x.shape[: x.rank - n])
    split, within = list(lead), []
    for size, k in zip(x.shape[-n:], kernel, strict=True):
        split += [size // k, k]
        within.append(len(split) - 1)
    return split, within


def _flat_positions(ctx: LoweringContext, x: Value, kernel: Sequence[int]) -> Value:
    """Over ``_tiles``'s split shape: each element's row-major index within its pooled plane,
    ``(oh * k + i) * W + ow * k + j`` in 2-D (int32, as the reference rule's index)."""
    e = ctx.emit
    split, within = _tiles(x, kernel)
    flat = None
    for size, k, d in zip(x.shape[-len(kernel) :], kernel, within, strict=True):
        window = e.binary(
            "multiply", e.iota(split, d - 1, torch.int32), e.full(k, split, torch.int32)
        )
        position = e.binary("add", window, e.iota(split, d, torch.int32))
        flat = position if flat is None else e.binary(
            "add", e.binary("multiply", flat, e.full(size, split, torch.int32)), position
        )  # fmt: skip
    return flat


@lowering(
    aten.max_pool2d_with_indices_backward.default,
    aten.max_pool3d_with_indices_backward.default,
    key=CPU_KEY,
    supports=all_of(float_first_arg, indices_of_this_pool_and_windows_tile),
)
def lower_tiled_max_pool_backward(
    ctx: LoweringContext, grad_out: Value, x: Value, kernel_size: Any, *args: Any
) -> Value:
    e = ctx.emit
    kernel = pool_dims(kernel_size, (), _SPATIAL[ctx.node.target])
    split, within = _tiles(x, kernel)
    outer = [d for d in range(len(split)) if d not in within]
    g = e.broadcast_in_dim(grad_out, split, outer)
    index = e.broadcast_in_dim(e.convert(args[-1], torch.int32), split, outer)
    zero = e.full(0, split, grad_out.dtype)
    # a zero gradient lands as +0.0, as eager's 0 + g does for g = -0.0
    lands = e.binary("and", e.compare(index, _flat_positions(ctx, x, kernel), "EQ"),
                     e.compare(g, zero, "NE"))  # fmt: skip
    grad = e.reshape(e.select(lands, g, zero), x.shape)
    return e.convert(grad, ctx.out_dtype)
