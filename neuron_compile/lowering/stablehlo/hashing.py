"""``hash_tensor``: a reduction of the elements' bits, returned as uint64.

Eager (``aten/src/ATen/native/ReduceOps.cpp``, mode 0, the only mode it implements) XORs 64-bit
words over ``dim`` (every dimension when empty): a floating element contributes the bits of its
value converted to float64, an integer or bool element its value converted to uint64 (two's
complement sign extension for negative values).

The float64 bits are built from the float32 bits with integer arithmetic (exponent rebias, the
significand shifted into place, subnormals normalized with a leading-zero count, NaN quieted as
the C++ float-to-double conversion does), not with a float64 convert: XLA's CPU client may treat
float32 subnormals as zero in float operations, and eager does not. bf16/f16 inputs widen to
float32 first (exact). int64 inputs arrive as int32 under the 64-bit policy and are sign-extended,
which gives eager's bits for every value that fits int32; float64 inputs arrive as float32, so
their hash is eager's only for values float32 holds exactly (the policy's usual caveat, which a
hash makes all-or-nothing).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.fx as fx

from ..context import LoweringContext, canonical_dtype
from ..emit import Value
from ..registry import lowering
from ..rules import ALL_DTYPES, normalize_dim

aten = torch.ops.aten
_U64 = torch.uint64


def _support(node: fx.Node) -> str | None:
    mode = node.kwargs.get("mode", 0)
    if mode != 0:
        return f"hash_tensor mode {mode} (eager implements mode 0 only)"
    x = node.args[0].meta.get("val")
    if not isinstance(x, torch.Tensor) or canonical_dtype(x.dtype) not in ALL_DTYPES:
        return f"hash_tensor of {getattr(x, 'dtype', x)} is not supported"
    return None


def _u(ctx: LoweringContext, value: int, like: Value) -> Value:
    return ctx.emit.full(value, like.shape, _U64)


def _float64_bits(ctx: LoweringContext, x: Value) -> Value:
    """The bits of float32 ``x`` converted to float64, as uint64."""
    e = ctx.emit
    b32 = e.bitcast_convert(x, torch.uint32)
    b = e.convert(b32, _U64)  # zero-extends the unsigned bits
    shr = lambda v, n: e.binary("shift_right_logical", v, _u(ctx, n, v))  # noqa: E731
    shl = lambda v, n: e.binary("shift_left", v, _u(ctx, n, v))  # noqa: E731
    band = lambda v, m: e.binary("and", v, _u(ctx, m, v))  # noqa: E731
    bor = lambda v, w: e.binary("or", v, w)  # noqa: E731
    sign = shl(shr(b, 31), 63)
    exp = band(shr(b, 23), 0xFF)
    man = band(b, 0x7FFFFF)
    zero = _u(ctx, 0, b)
    # normal numbers: rebias the exponent by 1023 - 127, widen the significand by 29 bits
    normal = bor(shl(e.binary("add", exp, _u(ctx, 1023 - 127, b)), 52), shl(man, 29))
    # inf/NaN: all-ones exponent; the conversion sets the quiet bit of a NaN
    special = bor(
        bor(_u(ctx, 0x7FF << 52, b), shl(man, 29)),
        e.select(e.compare(man, zero, "NE"), _u(ctx, 1 << 51, b), zero),
    )
    # subnormals are normal in float64: value = man * 2^-149 with the top set bit at p
    p = e.binary("subtract", _u(ctx, 63, b), e.unary("count_leading_zeros", man))
    sub_exp = e.binary("subtract", e.binary("add", p, _u(ctx, 1023, b)), _u(ctx, 149, b))
    sub_man = band(
        e.binary("shift_left", man, e.binary("subtract", _u(ctx, 52, b), p)), (1 << 52) - 1
    )
    subnormal = bor(shl(sub_exp, 52), sub_man)
    is_zero_exp = e.compare(exp, zero, "EQ")
    mag = e.select(
        e.compare(exp, _u(ctx, 0xFF, b), "EQ"),
        special,
        e.select(
            is_zero_exp,
            e.select(e.compare(man, zero, "EQ"), zero, subnormal),
            normal,
        ),
    )
    return bor(sign, mag)


def _bits(ctx: LoweringContext, x: Value) -> Value:
    """Each element's 64-bit word, as eager's hash_tensor takes it."""
    e = ctx.emit
    if x.dtype.is_floating_point:
        return _float64_bits(ctx, e.convert(x, torch.float32))
    if x.dtype in (torch.bool, torch.uint8):
        return e.convert(x, _U64)
    # signed integers: sign-extend to int64, then reinterpret as uint64
    return e.bitcast_convert(e.convert(x, torch.int64), _U64)


@lowering(aten.hash_tensor.default, supports=_support)
def _lower_hash_tensor(
    ctx: LoweringContext, x: Value, dim: Sequence[int] = (), *, keepdim: bool = False, mode: int = 0
) -> Value:
    e = ctx.emit
    words = _bits(ctx, x)
    # no dims means all of them; a 0-d tensor's dim 0 (or -1) is the tensor itself
    dims = sorted({normalize_dim(d, x.rank) for d in dim}) if dim else list(range(x.rank))
    dims = dims if x.rank else []
    out = e.reduce_simple(words, 0, dims, "xor")
    return e.reshape(out, ctx.out_shape) if keepdim else out
