"""The trn form of ``>>``: neuronx-cc shifts right arithmetically only on 32-bit operands.

The reference rule (``lowering/stablehlo/elementwise.py``) emits ``shift_right_arithmetic`` in the
operand's own dtype, which for int8 / int16 is NCC_EVRF022 ("cast the first argument to S32, U32
or F32"). This form does exactly that: sign-extend both operands to int32, shift, and convert
back. It is bit-exact with the narrow shift for every count, because

- a count in ``[0, bits)`` shifts the sign-extended value by the same amount, and the result
  fits the narrow type again (an arithmetic right shift never grows the magnitude);
- a count in ``[bits, 32)`` shifts out every value bit of the sign-extended value, leaving its
  sign fill, which is what the narrow shift (and eager) gives for a count ``>= bits``;
- a negative count stays negative when sign-extended, so StableHLO (which reads the count as
  unsigned) sees a count ``>= 32`` and fills with the sign: eager's answer for negative counts.

int32 (and int64, narrowed to int32 by the 64-bit policy) and the logical shift of uint8 are
legal as they are: the reference rule runs unchanged.
"""

from __future__ import annotations

import torch

from ..lowering.context import LoweringContext
from ..lowering.emit import Value, is_unsigned
from ..lowering.registry import lowering
from ..lowering.rules import INTS, dtypes_in
from ..lowering.stablehlo.elementwise import right_shift
from . import TRN_KEY

aten = torch.ops.aten

#: the dtype neuronx-cc's arithmetic shift computes in (NCC_EVRF022)
SHIFT_DTYPE = torch.int32


@lowering(
    aten.__rshift__.Scalar,
    aten.__rshift__.Tensor,
    aten.bitwise_right_shift.Tensor,
    aten.bitwise_right_shift.Tensor_Scalar,
    aten.bitwise_right_shift.Scalar_Tensor,
    key=TRN_KEY,
    supports=dtypes_in(*INTS),
)
def _lower_right_shift_trn(ctx: LoweringContext, a, b) -> Value:
    a, b = ctx.promote(a, b, dtype=ctx.out_dtype)
    if is_unsigned(a.dtype) or a.dtype.itemsize * 8 >= 32:
        return right_shift(ctx, a, b)
    e = ctx.emit
    wide = right_shift(ctx, e.convert(a, SHIFT_DTYPE), e.convert(b, SHIFT_DTYPE))
    return e.convert(wide, a.dtype)
