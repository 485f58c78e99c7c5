"""Ops standing for neuronx-cc kernels: the custom call for neuronx-cc, the reference for XLA CPU.

See ``neuron_compile/ops/fused.py`` for the ops and the operand convention.
"""

from __future__ import annotations

from typing import Any

import torch

from ...ops.flash_attention import attention_backward_reference, attention_reference
from ...ops.fused import NEURON_CALLS, NeuronCall
from ..context import LoweringContext
from ..emit import Value
from ..reference import lower_reference
from ..registry import FLOATS, dtypes_in, lowering


def _bind(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    names = [a.name for a in op._schema.arguments]
    bound = dict(zip(names, args, strict=False))
    bound.update(kwargs)
    return bound


def _rule(op: Any, call: NeuronCall):
    def rule(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Value:
        if not ctx.emit.neuron_calls:
            return lower_reference(ctx, call.reference, *args, **kwargs)
        bound = _bind(op, args, kwargs)
        out = ctx.out_type()
        operands: list[Value] = []
        for name, value in bound.items():
            if isinstance(value, Value):
                operands.append(value)
            elif name == "weight" and value is None:  # RMSNorm without a scale: a ones weight
                operands.append(ctx.emit.full(1, out.shape[-1:], out.dtype))
        for name in call.scalars:
            if name == "dim":
                dim = bound.get("dim", -1)
                operands.append(ctx.emit.scalar(dim % out.rank, torch.int32))
            else:
                operands.append(ctx.emit.scalar(float(bound[name]), torch.float32))
        target = call.target(**{k: v for k, v in bound.items() if not isinstance(v, Value)})
        return ctx.emit.custom_call(target, operands, [out])[0]

    rule.__name__ = rule.__qualname__ = f"lower_{op.name().split('::')[-1]}"
    return rule


for _op, _call in NEURON_CALLS.items():
    lowering(_op, supports=dtypes_in(*FLOATS))(_rule(_op, _call))


# Flash attention: the reference wherever XLA CPU runs the graph. On a device the NKI flash
# kernels stand behind these ops (ops/flash_attention.py); without the nki toolchain the trn
# module carries the reference too.
def _flash_rule(reference):
    def rule(ctx: LoweringContext, *args: Any) -> Any:
        return lower_reference(ctx, reference, *args)

    return rule


lowering(torch.ops.neuron_compile.flash_attention.default, supports=dtypes_in(*FLOATS))(
    _flash_rule(attention_reference)
)
lowering(torch.ops.neuron_compile.flash_attention_backward.default, supports=dtypes_in(*FLOATS))(
    _flash_rule(attention_backward_reference)
)
