"""Linear algebra on top of existing factorizations: solves and inverses from a Cholesky factor
(``cholesky_solve``, ``cholesky_inverse``) and ``linalg_lu`` (P, L, U in one op).

All reuse ``linalg.py``'s building blocks (``stablehlo.triangular_solve``, the masked LU loop and
its unpacking), so they inherit its conventions: float32 only, batch dims broadcast first.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from ..context import LoweringContext, broadcast_shapes
from ..emit import Value
from ..registry import lowering
from ..rules import INDEX, float32_only
from .linalg import lu_factor, lu_unpack, triangular_solve

aten = torch.ops.aten


def _matrices_f32(node: fx.Node) -> str | None:
    why = float32_only(node)
    if why:
        return why
    if any(a.meta["val"].ndim < 2 for a in node.all_input_nodes):
        return "needs (..., m, n) matrices"
    return None


def _cholesky_solve(ctx: LoweringContext, b: Value, factor: Value, upper: bool) -> Value:
    """X with A X = B for A = L Lᵀ (``factor`` lower) or A = Uᵀ U (``upper``): two triangular
    solves, the first with the transposed factor when it is upper."""
    batch = broadcast_shapes(b.shape[:-2], factor.shape[:-2])
    b = ctx.broadcast_to(b, batch + b.shape[-2:])
    factor = ctx.broadcast_to(factor, batch + factor.shape[-2:])
    lower = not upper
    y = triangular_solve(
        ctx, factor, b, left=True, lower=lower, unit_diagonal=False, transpose=upper
    )
    return triangular_solve(
        ctx, factor, y, left=True, lower=lower, unit_diagonal=False, transpose=lower
    )


@lowering(aten.cholesky_solve.default, supports=_matrices_f32)
def _lower_cholesky_solve(
    ctx: LoweringContext, b: Value, factor: Value, upper: bool = False
) -> Value:
    return _cholesky_solve(ctx, b, factor, upper)


@lowering(aten.cholesky_inverse.default, supports=_matrices_f32)
def _lower_cholesky_inverse(ctx: LoweringContext, factor: Value, upper: bool = False) -> Value:
    """A⁻¹ for A = L Lᵀ / Uᵀ U: the Cholesky solve of the identity."""
    e = ctx.emit
    r = factor.rank
    eye = e.convert(
        e.compare(e.iota(factor.shape, r - 2, INDEX), e.iota(factor.shape, r - 1, INDEX), "EQ"),
        factor.dtype,
    )
    return _cholesky_solve(ctx, eye, factor, upper)


def _linalg_lu_support(node: fx.Node) -> str | None:
    why = _matrices_f32(node)
    if why:
        return why
    if not node.kwargs.get("pivot", node.args[1] if len(node.args) > 1 else True):
        return "LU without pivoting is not lowered"
    return None


@lowering(aten.linalg_lu.default, supports=_linalg_lu_support)
def _lower_linalg_lu(ctx: LoweringContext, a: Value, *, pivot: bool = True) -> tuple[Value, ...]:
    """(P, L, U) with A = P L U: the packed LU factorization, unpacked."""
    lu, piv, _, _ = lu_factor(ctx, a)
    return lu_unpack(ctx, lu, piv)
