"""Ops whose PyTorch decompositions do not promote as eager's kernels: backward ops taking a
grad and an input, and pointwise ops (``addcmul``, ``addcdiv``, ``logaddexp``, ``xlogy``).

Eager runs each of these ops as one TensorIterator kernel over the grad and the input, which
promotes them to a common dtype. Their PyTorch decompositions compute in whatever dtypes arrive:
``threshold_backward(grad, x, t)`` is ``where(x <= t, 0, grad)``, so an int64 grad and a float32
input gave int64 where eager gives float32; ``gelu_backward(float32 grad, bfloat16 x)`` squared
``x`` in bfloat16 where eager computes in float32. The wrapper below converts the tensor
operands to the dtype the shared promotion helper (``lowering.context.promote_types``, PyTorch's
``elementwise_dtypes``) gives for them, runs PyTorch's decomposition and returns eager's result
dtype:

- ``common``: the promoted dtype (``TensorIterator::binary_op`` / ``build_borrowing_binary_op``);
- an argument name: that argument's dtype. The loss backwards and ``mish_backward`` write into
  a tensor like their input (``zeros_like(input)``, ``empty({0}, input.options())``), computing
  in the promoted dtype and rounding into the input's.

The pointwise ops' references promote straight to their float32 computation dtype, where eager's
kernel first casts every operand to the common dtype: an int32 ``tensor1`` of 257 beside a
bfloat16 ``self`` is 256 in eager.

Where every operand already has one dtype the wrapper does nothing, so the traced graph is the
decomposition's own. ``tests/conformance/promotion.py`` checks each against eager with mixed
dtypes (int with float, bf16 with f32, a 0-d grad).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

aten = torch.ops.aten

#: op -> (tensor operands that take part in promotion, whose dtype the result has)
GRAD_INPUT_BACKWARDS: dict[Any, tuple[tuple[str, ...], str]] = {
    aten.threshold_backward.default: (("grad_output", "self"), "common"),
    aten.gelu_backward.default: (("grad_output", "self"), "common"),
    aten.silu_backward.default: (("grad_output", "self"), "common"),
    aten.sigmoid_backward.default: (("grad_output", "output"), "common"),
    aten.tanh_backward.default: (("grad_output", "output"), "common"),
    aten.hardtanh_backward.default: (("grad_output", "self"), "common"),
    aten.leaky_relu_backward.default: (("grad_output", "self"), "common"),
    aten.softplus_backward.default: (("grad_output", "self"), "common"),
    aten.elu_backward.default: (("grad_output", "self_or_result"), "common"),
    aten.hardsigmoid_backward.default: (("grad_output", "self"), "common"),
    aten.hardswish_backward.default: (("grad_output", "self"), "common"),
    aten.logit_backward.default: (("grad_output", "self"), "common"),
    aten.mish_backward.default: (("grad_output", "self"), "self"),
    aten.mse_loss_backward.default: (("grad_output", "self", "target"), "self"),
    aten.smooth_l1_loss_backward.default: (("grad_output", "self", "target"), "self"),
    aten.soft_margin_loss_backward.default: (("grad_output", "self", "target"), "self"),
}

#: Pointwise ops whose references promote to float32 straight from integers, with the same
#: entries, wrapped only when the common dtype is bfloat16/float16 (eager casts an int32 2049
#: beside float16 to 2048 first).
POINTWISE: dict[Any, tuple[tuple[str, ...], str]] = {
    aten.addcmul.default: (("self", "tensor1", "tensor2"), "common"),
    aten.addcdiv.default: (("self", "tensor1", "tensor2"), "common"),
    aten.logaddexp.default: (("self", "other"), "common"),
    aten.logaddexp2.default: (("self", "other"), "common"),
    aten.xlogy.Tensor: (("self", "other"), "common"),
}
PROMOTED = {**GRAD_INPUT_BACKWARDS, **POINTWISE}


def _bind(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    names = [a.name for a in op._schema.arguments]
    bound = dict(zip(names, args, strict=False))
    bound.update(kwargs)
    return bound


def _call(op: Any, decomposition: Callable[..., Any], bound: dict[str, Any]) -> Any:
    """``decomposition`` with ``bound`` passed as ``op``'s schema passes it (a decomposition's
    parameter names need not be the schema's)."""
    args, kwargs, gap = [], {}, False
    for arg in op._schema.arguments:
        if arg.name not in bound:
            gap = True  # later arguments go by name
        elif arg.kwarg_only or gap:
            kwargs[arg.name] = bound[arg.name]
        else:
            args.append(bound[arg.name])
    return decomposition(*args, **kwargs)


def promoting(op: Any, decomposition: Callable[..., Any]) -> Callable[..., Any]:
    """``decomposition`` of ``op`` with its operands promoted and its result in eager's dtype."""
    from ..lowering.context import promote_types

    operands, result = PROMOTED[op]

    @functools.wraps(decomposition)
    def decompose(*args: Any, **kwargs: Any) -> Any:
        bound = _bind(op, args, kwargs)
        tensors = [bound[n] for n in operands if isinstance(bound.get(n), Tensor)]
        if isinstance(bound.get("value"), float) and not any(
            t.is_floating_point() or t.is_complex() for t in tensors
        ):
            # Eager's integer kernel casts value= to the integer (0.5 is 0, -2.7 is -2); the
            # reference rejects a float value for integers outright.
            bound["value"] = int(bound["value"])
        if len({t.dtype for t in tensors}) <= 1:
            return _call(op, decomposition, bound)
        common = promote_types(*tensors)[1]
        if op in POINTWISE and common not in (torch.bfloat16, torch.float16):
            # Only a half common dtype rounds what the reference reads exactly; its own
            # promotion is eager's otherwise (xlogy of two ints is float32, not their int).
            return _call(op, decomposition, bound)
        out_dtype = common if result == "common" else bound[result].dtype
        for name in operands:
            value = bound.get(name)
            if isinstance(value, Tensor) and value.dtype != common:
                bound[name] = value.to(common)
        out = _call(op, decomposition, bound)
        return out.to(out_dtype) if out.dtype != out_dtype else out

    return decompose


def promoting_decompositions(table: dict[Any, Any]) -> dict[Any, Any]:
    """The entries of ``table`` for ``PROMOTED``, each wrapped by ``promoting``."""
    return {op: promoting(op, table[op]) for op in PROMOTED if op in table}
