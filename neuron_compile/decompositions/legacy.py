"""Legacy entry points that are aliases of ops we already cover.

PyTorch keeps old spellings alive for TorchScript models and C++ callers; each one computes what a
covered op computes, so decomposing it onto that op gives the lowering and, through AOTAutograd,
the backward for free:

- ``aten._convolution`` (and its ``.deprecated`` overload, without ``allow_tf32``): the dispatcher
  stage behind ``aten.convolution``; the cuDNN/benchmark/determinism/TF32 flags only choose
  among eager's CPU/GPU kernels, never change the math, so the decomposition drops them.
- ``aten.conv_tbc``: fairseq's time-batch-channel 1-D convolution. Eager computes
  ``out[t] = bias + sum_k in[t + k - pad] @ weight[k]`` for input ``(T, B, Cin)``, weight
  ``(K, Cin, Cout)`` and bias ``(Cout,)``, which is ``conv1d`` of the ``(B, Cin, T)`` input with the
  ``(Cout, Cin, K)`` weight and zero padding ``pad``, permuted back to ``(T', B, Cout)``.
  Decomposing the forward means AOTAutograd never emits ``conv_tbc_backward``; called directly,
  it is ``convolution_backward`` in the same layouts. Eager's kernel
  accumulates per tap with ``addmm``; the convolution sums in another order, so float results
  agree to rounding, not bit for bit (as any two convolution kernels).
- ``aten.detach_``: what ``torch.tensor(...)`` inside a PyTorch decomposition traces to after
  ``lift_fresh_copy`` (``affine_grid`` with a spatial size of 1 builds its one grid step so),
  an in-place op left in a graph AOTAutograd requires functional; on that fresh tensor it is the
  tensor itself, as Inductor's table also has it.
- ``aten._index_put_impl`` (the functional form of ``index_put_``'s implementation): ``index_put``
  with the same ``accumulate``; ``unsafe`` only skips eager's bounds check (out-of-range indices
  are undefined behaviour there, and dropped by XLA's scatter here), so it is ignored.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

aten = torch.ops.aten


def _convolution(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    transposed: bool,
    output_padding: Sequence[int],
    groups: int,
    *_backend_flags: bool,
) -> torch.Tensor:
    """``aten._convolution``: ``aten.convolution`` without eager's kernel-selection flags."""
    return aten.convolution.default(
        input, weight, bias, stride, padding, dilation, transposed, output_padding, groups
    )


def _conv_tbc(
    input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, pad: int = 0
) -> torch.Tensor:
    """``conv_tbc`` as a batch-first ``conv1d`` (see the module docstring for the layouts)."""
    out = aten.convolution.default(
        input.permute(1, 2, 0),
        weight.permute(2, 1, 0),
        bias,
        [1],
        [pad],
        [1],
        False,
        [0],
        1,
    )
    # Eager returns a contiguous (T', B, Cout) tensor; .contiguous() keeps the strides equal.
    return out.permute(2, 0, 1).contiguous()


def _conv_tbc_backward(
    grad: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, pad: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``conv_tbc_backward`` called directly: ``convolution_backward`` in the batch-first
    layouts of ``_conv_tbc``, each gradient permuted back to its argument's layout."""
    grad_input, grad_weight, grad_bias = aten.convolution_backward.default(
        grad.permute(1, 2, 0),
        input.permute(1, 2, 0),
        weight.permute(2, 1, 0),
        [bias.shape[0]],
        [1],
        [pad],
        [1],
        False,
        [0],
        1,
        [True, True, True],
    )
    return (
        grad_input.permute(2, 0, 1).contiguous(),
        grad_weight.permute(2, 1, 0).contiguous(),
        grad_bias,
    )


def _detach_(self: torch.Tensor) -> torch.Tensor:
    """``detach_`` of a tensor the trace just made: nothing tracks its gradient anyway."""
    return self


def _index_put_impl(
    self: torch.Tensor,
    indices: Sequence[torch.Tensor | None],
    values: torch.Tensor,
    accumulate: bool = False,
    unsafe: bool = False,
) -> torch.Tensor:
    """``_index_put_impl`` is ``index_put``; ``unsafe`` only skips eager's bounds check."""
    return aten.index_put.default(self, indices, values, accumulate)


DECOMPOSITIONS: dict[Any, Any] = {
    aten._convolution.default: _convolution,
    aten._convolution.deprecated: _convolution,
    aten.conv_tbc.default: _conv_tbc,
    aten.conv_tbc_backward.default: _conv_tbc_backward,
    aten._index_put_impl.default: _index_put_impl,
    aten.detach_.default: _detach_,
}
