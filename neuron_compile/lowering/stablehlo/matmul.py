"""Matrix products (mm, bmm, addmm, baddbmm, addmv, addbmm, _trilinear, _int_mm).

Low-precision float inputs accumulate in float32 (dot_general's result type), as eager PyTorch
does on CPU, and round once. Integer inputs accumulate in the result's own integer type, as eager's
CPU gemm does (its opmath type of an integer is the integer itself): sums, products and the
integer ``alpha``/``beta`` scalings are ring operations, so two's-complement wrap-around gives the
same bits in any order. ``_int_mm`` is int8 x int8 accumulated into int32.

trn targets still reject an integer dot or convolution in legality (NCC_EVRF035); these rules are
what XLA CPU runs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..context import LoweringContext
from ..emit import Value
from ..registry import lowering
from ..rules import floats_and_ints

aten = torch.ops.aten

#: Floats, and integers (accumulated in their own type with wrap-around, as eager does).


def dot(
    ctx: LoweringContext,
    a: Value,
    b: Value,
    contract: tuple[Sequence[int], Sequence[int]],
    batch: tuple[Sequence[int], Sequence[int]] = ((), ()),
) -> Value:
    """``stablehlo.dot_general`` accumulated in the compute dtype (not yet rounded back)."""
    return ctx.emit.dot_general(a, b, contract, batch, out_dtype=ctx.compute_dtype(a.dtype))


def matmul(ctx: LoweringContext, a: Value, b: Value, batched: bool = False) -> Value:
    """``a @ b`` for 2-D (or batched 3-D) operands, accumulated in the compute dtype."""
    if batched:
        return dot(ctx, a, b, ((2,), (1,)), ((0,), (0,)))
    return dot(ctx, a, b, ((1,), (0,)))


def _scaled(ctx: LoweringContext, x: Value, factor: float) -> Value:
    if factor == 1:
        return x
    if not x.dtype.is_floating_point:
        # Eager casts the scalar to the integer type, wrapping (alpha=-2 on uint8 is 254).
        factor = torch.tensor(int(factor), dtype=torch.int64).to(x.dtype).item()
    return ctx.emit.binary("multiply", x, ctx.full_like(factor, x))


def _int8(node: torch.fx.Node) -> str | None:
    bad = sorted(
        {str(a.meta["val"].dtype) for a in node.args[:2] if a.meta["val"].dtype != torch.int8}
    )
    return f"dtype {', '.join(bad)} not supported (int8 operands expected)" if bad else None


@lowering(aten._int_mm.default, supports=_int8)
def _lower_int_mm(ctx: LoweringContext, a: Value, b: Value) -> Value:
    """int8 x int8 accumulated in int32 (dot_general's result type), as eager's ``_int_mm``."""
    return ctx.emit.dot_general(a, b, ((1,), (0,)), out_dtype=ctx.out_dtype)


@lowering(aten.mm.default, supports=floats_and_ints)
def _lower_mm(ctx: LoweringContext, a: Value, b: Value) -> Value:
    return ctx.emit.convert(matmul(ctx, a, b), ctx.out_dtype)


@lowering(aten.bmm.default, supports=floats_and_ints)
def _lower_bmm(ctx: LoweringContext, a: Value, b: Value) -> Value:
    return ctx.emit.convert(matmul(ctx, a, b, batched=True), ctx.out_dtype)


def _skips_product(ctx: LoweringContext, product: Value, alpha: float, dtype: torch.dtype) -> Value:
    """``product``, or zeros where eager's GEMM skips it: float32/float64 ``addmm``, ``addmv``
    and ``addbmm`` with ``alpha == 0`` never read the matrices, so NaN or inf in them does not
    reach the result (``baddbmm`` and half-precision products do propagate it, as here)."""
    if alpha == 0 and dtype in (torch.float32, torch.float64):
        return ctx.full_like(0, product)
    return product


@lowering(aten.addmm.default, aten.baddbmm.default, supports=floats_and_ints)
def _lower_addmm(
    ctx: LoweringContext, bias: Value, a: Value, b: Value, beta: float = 1, alpha: float = 1
) -> Value:
    product = _scaled(ctx, matmul(ctx, a, b, batched=a.rank == 3), alpha)
    if a.rank == 2:  # addmm
        product = _skips_product(ctx, product, alpha, ctx.out_val.dtype)
    return _add_bias(ctx, product, bias, beta)


@lowering(aten.addmv.default, supports=floats_and_ints)
def _lower_addmv(
    ctx: LoweringContext, bias: Value, mat: Value, vec: Value, *, beta: float = 1, alpha: float = 1
) -> Value:
    """``beta * bias + alpha * (mat @ vec)``, accumulated in the compute dtype."""
    acc = ctx.compute_dtype(mat.dtype)
    product = _scaled(ctx, ctx.emit.dot_general(mat, vec, ((1,), (0,)), out_dtype=acc), alpha)
    return _add_bias(ctx, _skips_product(ctx, product, alpha, ctx.out_val.dtype), bias, beta)


@lowering(aten.addbmm.default, supports=floats_and_ints)
def _lower_addbmm(
    ctx: LoweringContext, bias: Value, b1: Value, b2: Value, *, beta: float = 1, alpha: float = 1
) -> Value:
    """``beta * bias + alpha * sum_b(b1[b] @ b2[b])``: one dot_general contracting the batch dim
    together with the inner dim."""
    acc = ctx.compute_dtype(b1.dtype)
    product = _scaled(ctx, ctx.emit.dot_general(b1, b2, ((0, 2), (0, 1)), out_dtype=acc), alpha)
    return _add_bias(ctx, _skips_product(ctx, product, alpha, ctx.out_val.dtype), bias, beta)


def _add_bias(ctx: LoweringContext, product: Value, bias: Value, beta: float) -> Value:
    if beta == 0:  # torch ignores bias (even NaN/inf) when beta == 0
        return ctx.emit.convert(product, ctx.out_dtype)
    (bias,) = ctx.promote(bias, dtype=product.dtype)
    total = ctx.emit.binary(
        "add", product, ctx.broadcast_to(_scaled(ctx, bias, beta), product.shape)
    )
    return ctx.emit.convert(total, ctx.out_dtype)


@lowering(aten._trilinear.default, supports=floats_and_ints)
def _lower_trilinear(
    ctx: LoweringContext,
    i1: Value,
    i2: Value,
    i3: Value,
    expand1: list[int],
    expand2: list[int],
    expand3: list[int],
    sumdim: list[int],
    unroll_dim: int = 1,
) -> Value:
    """``(i1 * i2 * i3).sum(sumdim)`` after unsqueezing each input at its ``expand`` dims (what
    ``F.bilinear`` lowers to). ``unroll_dim`` only picks eager's loop order, not the result."""
    e = ctx.emit
    acc = ctx.compute_dtype(ctx.out_dtype)
    total = i1.rank + len(expand1)
    parts = []
    for x, expand in ((i1, expand1), (i2, expand2), (i3, expand3)):
        shape, it = [], iter(x.shape)
        for d in range(total):
            shape.append(1 if d in expand else next(it))
        parts.append(e.reshape(e.convert(x, acc), shape))
    a, b, c = ctx.promote(*parts, dtype=acc)
    prod = e.binary("multiply", e.binary("multiply", a, b), c)
    summed = e.reduce_simple(prod, 0, sorted(set(sumdim)), "add")
    return e.convert(summed, ctx.out_dtype)
