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
from ..lowering.stablehlo.pooling import float_first_arg, plane_index, pool_dims, pooled_dims
from ..saved import POOL_INDICES, PoolWindow, forward_pool_window, max_pool_of_indices, pool_window
from . import CPU_KEY

aten = torch.ops.aten

_FORWARD_OF = {
    aten.max_pool2d_with_indices_backward.default: aten.max_pool2d_with_indices.default,
    aten.max_pool3d_with_indices_backward.default: aten.max_pool3d_with_indices.default,
}
_BACKWARD_ARGS = ("kernel_size", "stride", "padding", "dilation", "ceil_mode")
_NOT_TILING = "windows that overlap, skip, pad or leave a partial window keep the reference form"


def _tiling_kernel(window: PoolWindow) -> tuple[int, ...] | None:
    """The kernel of a max pool whose windows tile its input, else None."""
    _, shape, kernel, stride, padding, dilation, _ = window
    n = len(kernel)
    tiles = all(s % k == 0 for s, k in zip(shape[-n:], kernel, strict=True))
    unit = tiles and stride == kernel and padding == (0,) * n and dilation == (1,) * n
    return kernel if unit else None


def _backward_window(node: fx.Node) -> PoolWindow:
    """The ``PoolWindow`` of the forward max pool a ``*_backward`` node inverts."""
    args = (arg(node, i, name) for i, name in enumerate(_BACKWARD_ARGS, start=2))
    x_shape = node.args[1].meta["val"].shape
    return pool_window(_FORWARD_OF[node.target], x_shape, pooled_dims(node), *args)


def _indices_window(node: fx.Node) -> PoolWindow | None:
    """The ``PoolWindow`` of the max pool whose indices the backward ``node`` receives, if known."""
    indices = arg(node, 7, "indices")
    pool = max_pool_of_indices(indices)
    if pool is not None:
        return forward_pool_window(pool)
    if isinstance(indices, fx.Node) and indices.op == "placeholder":
        module = node.graph.owning_module
        saved = module.meta.get(POOL_INDICES) if module is not None else None
        return (saved or {}).get(indices.name)
    return None


def indices_of_this_pool_and_windows_tile(node: fx.Node) -> str | None:
    """Support predicate of the backward form."""
    window = _backward_window(node)
    if _tiling_kernel(window) is None:
        return _NOT_TILING
    if _indices_window(node) != window:
        return "indices not known to come from this max pool keep the reference form (scatter-add)"
    return None


def _tiles(x: Value, kernel: Sequence[int]) -> tuple[list[int], list[int]]:
    """``x``'s shape with every pooled dim ``S`` split into ``(S/k, k)``, and the ``k`` dims."""
    n = len(kernel)
    split, within = list(x.shape[: x.rank - n]), []
    for size, k in zip(x.shape[-n:], kernel, strict=True):
        split += [size // k, k]
        within.append(len(split) - 1)
    return split, within


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
    kernel = pool_dims(kernel_size, (), pooled_dims(ctx.node))
    split, within = _tiles(x, kernel)
    outer = [d for d in range(len(split)) if d not in within]
    g = e.broadcast_in_dim(grad_out, split, outer)
    index = e.broadcast_in_dim(e.convert(args[-1], torch.int32), split, outer)
    zero = e.full(0, split, grad_out.dtype)
    position = e.reshape(plane_index(ctx, x, len(kernel)), split)  # h * W + w, split like x
    # a zero gradient lands as +0.0, as eager's 0 + g does for g = -0.0
    lands = e.binary("and", e.compare(index, position, "EQ"),
                     e.compare(g, zero, "NE"))  # fmt: skip
    grad = e.reshape(e.select(lands, g, zero), x.shape)
    return e.convert(grad, ctx.out_dtype)
