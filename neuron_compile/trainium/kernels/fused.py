"""Ops that stand for neuronx-cc's built-in kernels (``AwsNeuron*`` custom calls).

Only the trn pattern pass (``trainium/passes.py``) puts these in a graph. Each op is
defined by its reference implementation, which is also its eager kernel: on a trn target the
lowering emits the custom call, and wherever XLA CPU runs the graph (every target without a
device) the same op lowers to the reference instead — so CPU numerics check the decomposition
that stands behind each call.

The custom calls' operand conventions are not documented by AWS (``docs/trainium-reference.md``
§R8: "Their operand and config formats are not documented"). Ours, in ``NEURON_CALLS``: tensor
operands in the op's order, then scalar attributes as rank-0 constant operands (how
torch-neuronx's ``xla_impl.ops.RmsNorm`` passes ``eps`` and ``dim``). Unverified on a device;
this table is the one place to fix it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

aten = torch.ops.aten


# ---- reference implementations (plain torch; what XLA CPU runs) ------------------------------
def rms_norm_reference(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if weight is None else y * weight


def softmax_reference(x: Tensor, dim: int) -> Tensor:
    return torch.softmax(x, dim)


def softmax_backward_reference(grad: Tensor, out: Tensor, dim: int) -> Tensor:
    return aten._softmax_backward_data(grad, out, dim, out.dtype)


def gelu_reference(x: Tensor, approximate: str) -> Tensor:
    return torch.nn.functional.gelu(x, approximate=approximate)


def gelu_backward_reference(grad: Tensor, x: Tensor, approximate: str) -> Tensor:
    return aten.gelu_backward(grad, x, approximate=approximate)


def silu_reference(x: Tensor) -> Tensor:
    return x * torch.sigmoid(x)


def silu_backward_reference(grad: Tensor, x: Tensor) -> Tensor:
    return aten.silu_backward(grad, x)


# ---- the ops ------------------------------------------------------------------------------
def _rms_norm_out(x: Tensor, weight: Tensor | None) -> Tensor:
    dtype = x.dtype if weight is None else torch.promote_types(x.dtype, weight.dtype)
    return x.new_empty(x.shape, dtype=dtype)


@torch.library.custom_op("neuron_compile::rms_norm", mutates_args=())
def rms_norm(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    """``x * rsqrt(mean(x², -1) + eps) [* weight]`` in ``x``'s dtype."""
    return rms_norm_reference(x, weight, eps)


@rms_norm.register_fake
def _(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    return _rms_norm_out(x, weight)


@torch.library.custom_op("neuron_compile::softmax", mutates_args=())
def softmax(x: Tensor, dim: int) -> Tensor:
    return softmax_reference(x, dim)


@torch.library.custom_op("neuron_compile::softmax_backward", mutates_args=())
def softmax_backward(grad: Tensor, out: Tensor, dim: int) -> Tensor:
    return softmax_backward_reference(grad, out, dim)


@torch.library.custom_op("neuron_compile::gelu", mutates_args=())
def gelu(x: Tensor, approximate: str) -> Tensor:
    return gelu_reference(x, approximate)


@torch.library.custom_op("neuron_compile::gelu_backward", mutates_args=())
def gelu_backward(grad: Tensor, x: Tensor, approximate: str) -> Tensor:
    return gelu_backward_reference(grad, x, approximate)


@torch.library.custom_op("neuron_compile::silu", mutates_args=())
def silu(x: Tensor) -> Tensor:
    return silu_reference(x)


@torch.library.custom_op("neuron_compile::silu_backward", mutates_args=())
def silu_backward(grad: Tensor, x: Tensor) -> Tensor:
    return silu_backward_reference(grad, x)


def _like_first(*args: object) -> Tensor:
    first = args[0]
    assert isinstance(first, Tensor)
    return torch.empty_like(first)


for _op in (softmax, softmax_backward, gelu, gelu_backward, silu, silu_backward):
    _op.register_fake(_like_first)


@dataclass(frozen=True)
class NeuronCall:
    """How one op becomes a neuronx-cc custom call."""

    reference: Callable[..., Tensor]
    #: custom-call target for the op's non-tensor arguments (e.g. GELU's ``approximate``)
    target: Callable[..., str]
    #: names of the scalar arguments passed as rank-0 constant operands, in order
    scalars: tuple[str, ...] = ()


NEURON_CALLS: dict[object, NeuronCall] = {
    torch.ops.neuron_compile.rms_norm.default: NeuronCall(
        rms_norm_reference, lambda **_: "AwsNeuronRmsNorm", ("eps", "dim")
    ),
    torch.ops.neuron_compile.softmax.default: NeuronCall(
        softmax_reference, lambda **_: "AwsNeuronSoftmax", ("dim",)
    ),
    torch.ops.neuron_compile.softmax_backward.default: NeuronCall(
        softmax_backward_reference, lambda **_: "AwsNeuronSoftmaxBackward", ("dim",)
    ),
    torch.ops.neuron_compile.gelu.default: NeuronCall(
        gelu_reference,
        lambda approximate, **_: (
            "AwsNeuronGelu" if approximate == "none" else "AwsNeuronGeluApprxTanh"
        ),
    ),
    torch.ops.neuron_compile.gelu_backward.default: NeuronCall(
        gelu_backward_reference, lambda **_: "AwsNeuronGeluBackward"
    ),
    torch.ops.neuron_compile.silu.default: NeuronCall(silu_reference, lambda **_: "AwsNeuronSilu"),
    torch.ops.neuron_compile.silu_backward.default: NeuronCall(
        silu_backward_reference, lambda **_: "AwsNeuronSiluBackward"
    ),
}
