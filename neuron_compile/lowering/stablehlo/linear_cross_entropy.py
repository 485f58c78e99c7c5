"""The chunked ``linear_cross_entropy`` custom ops (``torch_nn::_linear_cross_entropy_batch_chunked``
and ``..._no_reduction``), lowered through PyTorch's own implementation.

``F.linear_cross_entropy(..., options=LinearCrossEntropyOptions(batch_chunk_size=k))`` calls a
custom op whose implementation walks the batch in chunks of ``k`` rows: per chunk, logits, a
log-softmax, the loss and (for ``mean``/``sum``) the gradients of input, weight and bias, which
the op returns beside the loss so that its backward only scales them. The chunk loop is Python
over static sizes, so tracing the implementation unrolls it into the ops the lowering covers:
the compiled graph computes what eager computes, chunk by chunk and in the same accumulation
order. The implementation writes into accumulators in place; it is functionalized before
tracing. The backward graphs (a product with the stashed gradients; for ``reduction="none"``
the same chunk loop again) are ordinary ATen ops.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
import torch.nn.modules.linear_cross_entropy as lce
from torch.func import functionalize

from ..context import LoweringContext
from ..reference import lower_reference
from ..registry import lowering
from ..rules import FLOATS

_ops = torch.ops.torch_nn


def _float_input(node: fx.Node) -> str | None:
    """The input's dtype decides the computation (the target is class indices)."""
    val = node.args[0].meta.get("val")
    if isinstance(val, torch.Tensor) and val.dtype in FLOATS:
        return None
    return f"input dtype {getattr(val, 'dtype', None)} is not a floating-point dtype"


def _chunked(*args: Any) -> Any:
    (*head, _allow_retain_graph, grad_in, grad_w, grad_b) = args
    return lce._linear_cross_entropy_batch_chunked_accumulator(*head, grad_in, grad_w, grad_b)


def _chunked_no_reduction(*args: Any) -> Any:
    (*tensors, ignore_index, chunk, acc_policy, acc_dtype) = args
    return lce._linear_cross_entropy_batch_chunked_accumulator(
        *tensors, "none", ignore_index, 0.0, chunk, acc_policy, acc_dtype, False, False, False
    )[0]


@lowering(_ops._linear_cross_entropy_batch_chunked.default, supports=_float_input)
def _lower_chunked(ctx: LoweringContext, *args: Any) -> Any:
    return lower_reference(ctx, functionalize(_chunked, remove="mutations"), *args)


@lowering(_ops._linear_cross_entropy_batch_chunked_no_reduction.default, supports=_float_input)
def _lower_chunked_no_reduction(ctx: LoweringContext, *args: Any) -> Any:
    return lower_reference(ctx, functionalize(_chunked_no_reduction, remove="mutations"), *args)
