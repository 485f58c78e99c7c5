"""``prims.fma``: Inductor's fused multiply-add prim, which Dynamo writes for ``addcmul_`` and
``addcdiv_`` with ``value=`` and for ``add_`` with a tensor ``alpha`` (the update of every
single-tensor optimizer: Adam, AdamW, RMSprop, Adagrad, ...). Without a decomposition each one
ran on the CPU, one fallback per parameter per step.

``fma(a, b, c)`` is ``a * b + c`` in the operands' computation dtype (float32 for bfloat16 and
float16) and rounded once to the result dtype, as Inductor computes it and as eager's
``addcmul``/``addcdiv`` kernels do; the prim's own eager kernel rounds after the product too, a
difference of at most one unit in the last place.

The prim exists once ``torch._inductor.inductor_prims`` is imported, which loads Dynamo (~1 s in
a process without it): ``decompositions()`` imports it when AOTAutograd asks for the table,
inside a compile, where Dynamo is loaded already.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes


def fma(a: Tensor, b: Tensor | float, c: Tensor) -> Tensor:
    compute, result = elementwise_dtypes(
        a, b, c, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT
    )
    b = b.to(compute) if isinstance(b, Tensor) else b
    return (a.to(compute) * b + c.to(compute)).to(result)


def decompositions() -> dict[Any, Any]:
    from torch._inductor import inductor_prims

    return {inductor_prims.fma: fma}  # make_prim returns the overload itself


__all__ = ["decompositions", "fma"]
