"""``neuron_compile::dot_general`` (introduced by the sink_transposes pass): one
``stablehlo.dot_general`` with the op's dimension numbers, so no transpose is emitted."""

from __future__ import annotations

import torch

from ...ops import dot_general as _dot_general_op  # noqa: F401  (registers the op)
from ..context import LoweringContext
from ..emit import Value
from ..registry import lowering
from ..rules import floats
from .matmul import dot


@lowering(torch.ops.neuron_compile.dot_general.default, supports=floats)
def _lower_dot_general(
    ctx: LoweringContext,
    lhs: Value,
    rhs: Value,
    lhs_contract: list[int],
    rhs_contract: list[int],
    lhs_batch: list[int],
    rhs_batch: list[int],
) -> Value:
    product = dot(ctx, lhs, rhs, (lhs_contract, rhs_contract), (lhs_batch, rhs_batch))
    return ctx.emit.convert(product, ctx.out_dtype)
