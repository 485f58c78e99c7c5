"""A custom op no backend can lower: the stand-in for "an op neuron-compile does not support"."""

from __future__ import annotations

import torch


@torch.library.custom_op("nctest::cpu_scan", mutates_args=())
def cpu_scan(x: torch.Tensor) -> torch.Tensor:
    """2 * cumsum(x, 0), computed by Python code outside any compiler's reach."""
    return torch.cumsum(x, 0) * 2


@cpu_scan.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def _backward(ctx, grad: torch.Tensor) -> torch.Tensor:
    return torch.ops.nctest.cpu_scan(grad.flip(0)).flip(0)


cpu_scan.register_autograd(_backward)

CPU_SCAN = "nctest.cpu_scan.default"
