"""``linalg_matrix_exp`` by scaling and squaring a Taylor polynomial (float32; bf16/f16 round
once from it).

exp(A) = exp(A / 2^s)^(2^s) with s the smallest power that brings ||A||_1 to <= 3 (per matrix
of the batch), where the degree-18 Taylor polynomial's remainder (< 3^19 / 19! * 1.2 ~ 1e-8) is
below float32 resolution. Few squarings matter: each one doubles the rounding error (a degree-12
polynomial at norm 1/2 needs two more and was measurably worse than eager on OpInfo's inputs).
The squarings are one ``stablehlo.while`` up to the largest s in the batch, each matrix squared
only while it still needs to be. Eager uses a
degree-selected Taylor scheme (Bader, Blanes & Casas); both are accurate to float32 rounding
amplified by the squarings, so results agree to a few ulps times 2^s. The backward (exp of a 2n
block matrix, AOTAutograd's formula) goes through the same rule.
"""

from __future__ import annotations

import math

import torch
import torch.fx as fx

from ..context import LoweringContext
from ..emit import Value
from ..registry import lowering
from ..rules import INDEX, floats

aten = torch.ops.aten
_DEGREE = 18
_TARGET_NORM = 3.0


def _matmul(ctx: LoweringContext, a: Value, b: Value) -> Value:
    r = a.rank
    batch = list(range(r - 2))
    return ctx.emit.dot_general(a, b, ((r - 1,), (r - 2,)), (batch, batch))


def _square_float(node: fx.Node) -> str | None:
    """float32, or bf16/f16 computed in float32 and rounded once (eager's bf16 kernel runs the
    same scheme in bf16; float32 is at least as close to the exact exponential)."""
    why = floats(node)  # float64 runs as float32 (the 64-bit policy)
    if why:
        return why
    a = node.args[0].meta["val"]
    if a.ndim < 2 or a.shape[-1] != a.shape[-2]:
        return "only square (..., n, n) matrices are lowered"
    return None


@lowering(aten.linalg_matrix_exp.default, supports=_square_float)
def _lower_matrix_exp(ctx: LoweringContext, a: Value) -> Value:
    e = ctx.emit
    if 0 in a.shape:
        return a
    if a.dtype != torch.float32:
        return e.convert(_matrix_exp_f32(ctx, e.convert(a, torch.float32)), a.dtype)
    return _matrix_exp_f32(ctx, a)


def _matrix_exp_f32(ctx: LoweringContext, a: Value) -> Value:
    e = ctx.emit
    r = a.rank
    batch = a.shape[:-2]
    bdims = list(range(r - 2))
    # s = max(0, ceil(log2(||A||_1 / target))), the 1-norm being the largest column sum
    norm = e.reduce_simple(
        e.reduce_simple(e.unary("abs", a), 0.0, [r - 2], "add"), 0.0, [r - 2], "maximum"
    )
    ratio = e.binary("divide", norm, e.full(_TARGET_NORM, batch, a.dtype))
    s = e.unary(
        "ceil", e.binary("divide", e.unary("log", ratio), e.full(math.log(2), batch, a.dtype))
    )
    s = e.binary("maximum", s, e.full(0.0, batch, a.dtype))
    s = e.select(e.compare(norm, e.full(0.0, batch, a.dtype), "GT"), s, e.full(0.0, batch, a.dtype))
    s = e.binary("minimum", s, e.full(126.0, batch, a.dtype))  # inf / NaN norms: no endless loop
    scale = e.binary("power", e.full(0.5, batch, a.dtype), s)
    x = e.binary("multiply", a, e.broadcast_in_dim(scale, a.shape, bdims))
    # Horner: I + X (I + X/2 (I + X/3 (...)))
    row, col = e.iota(a.shape, r - 2, INDEX), e.iota(a.shape, r - 1, INDEX)
    eye = e.convert(e.compare(row, col, "EQ"), a.dtype)
    p = eye
    for k in range(_DEGREE, 0, -1):
        p = e.binary(
            "add", eye, e.binary("multiply", _matmul(ctx, x, p), ctx.full_like(1.0 / k, p))
        )
    steps = e.convert(s, INDEX)
    top = e.reduce_simple(steps, 0, list(range(len(batch))), "maximum")

    def cond(i: Value, m: Value) -> list[Value]:
        return [e.compare(i, top, "LT")]

    def body(i: Value, m: Value) -> list[Value]:
        live = e.compare(e.broadcast_in_dim(i, batch, []), steps, "LT")
        squared = _matmul(ctx, m, m)
        m = e.select(e.broadcast_in_dim(live, a.shape, bdims), squared, m)
        return [e.binary("add", i, e.scalar(1, INDEX)), m]

    return e.while_([e.scalar(0, INDEX), p], cond, body)[1]
