"""Pairwise distances: ``_cdist_forward`` / ``_pdist_forward`` and their backward ops.

Distances are computed directly from the broadcast differences ``x1[i] - x2[j]`` (eager's
"direct" kernel), in float32 for low-precision inputs. For p = 2 with more than 25 rows eager
switches to the matmul identity ``|a|^2 + |b|^2 - 2ab``, which rounds differently; the direct
form is the more accurate of the two. The backward rules follow eager's per-p formulas
(aten/src/ATen/native/cpu/DistanceOpsKernel.cpp), including their zero-distance conventions.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.fx as fx

from ..context import LoweringContext
from ..emit import TensorType, Value
from ..registry import lowering
from ..rules import floats

aten = torch.ops.aten


def _same_batch(node: fx.Node) -> str | None:
    why = floats(node)
    if why is not None:
        return why
    first = 0 if node.target is aten._cdist_forward.default else 1  # backward: (grad, x1, x2)
    a, b = node.args[first].meta["val"], node.args[first + 1].meta["val"]
    if a.shape[:-2] != b.shape[:-2]:
        return "cdist with broadcast batch dims is not supported"
    return None


def _differences(ctx: LoweringContext, x1: Value, x2: Value) -> Value:
    """``x1[..., i, None, :] - x2[..., None, j, :]``: shape (..., P, R, M)."""
    e = ctx.emit
    *batch, p, m = x1.shape
    r = x2.shape[-2]
    shape = [*batch, p, r, m]
    lead = list(range(len(batch)))
    a = e.broadcast_in_dim(x1, shape, [*lead, len(batch), len(batch) + 2])
    b = e.broadcast_in_dim(x2, shape, [*lead, len(batch) + 1, len(batch) + 2])
    return e.binary("subtract", a, b)


def _distance(ctx: LoweringContext, diff: Value, p: float) -> Value:
    """p-norm of ``diff`` over its last dim."""
    e = ctx.emit
    last = diff.rank - 1
    a = e.unary("abs", diff)
    if p == 0:
        nonzero = e.convert(e.compare(a, ctx.full_like(0, a), "NE"), a.dtype)
        return e.reduce_simple(nonzero, 0, [last], "add")
    if p == 1:
        return e.reduce_simple(a, 0, [last], "add")
    if p == 2:
        return e.unary("sqrt", e.reduce_simple(e.binary("multiply", a, a), 0, [last], "add"))
    if math.isinf(p):
        return e.reduce_simple(a, 0.0, [last], "maximum")
    total = e.reduce_simple(e.binary("power", a, ctx.full_like(p, a)), 0, [last], "add")
    return e.binary("power", total, ctx.full_like(1.0 / p, total))


def _distance_grad(ctx: LoweringContext, diff: Value, dist: Value, p: float) -> Value:
    """d dist / d x1 per (i, j) pair, shape of ``diff``; 0 wherever eager's kernel uses 0."""
    e = ctx.emit
    d = ctx.broadcast_to(e.reshape(dist, [*dist.shape, 1]), diff.shape)
    zero = ctx.full_like(0, diff)
    at_zero = e.compare(d, zero, "EQ")
    sign = e.unary("sign", diff)
    if p == 0:
        return zero
    if p == 1:
        return sign
    if math.isinf(p):
        return e.select(e.compare(e.unary("abs", diff), d, "EQ"), sign, zero)
    if p == 2:
        return e.select(at_zero, zero, e.binary("divide", diff, d))
    a = e.unary("abs", diff)
    exponent = ctx.full_like(p - 1, diff)
    g = e.binary(
        "divide",
        e.binary("multiply", sign, e.binary("power", a, exponent)),
        e.binary("power", d, exponent),
    )
    undefined = at_zero
    if p < 1:  # |diff|^(p - 1) is infinite at diff == 0: eager uses 0
        undefined = e.binary("or", undefined, e.compare(diff, zero, "EQ"))
    return e.select(undefined, zero, g)


def _in_compute(ctx: LoweringContext, *xs: Value) -> list[Value]:
    return [ctx.emit.convert(x, ctx.compute_dtype(x.dtype)) for x in xs]


@lowering(aten._cdist_forward.default, supports=_same_batch)
def _lower_cdist_forward(
    ctx: LoweringContext, x1: Value, x2: Value, p: float, compute_mode: int | None = None
) -> Value:
    a, b = _in_compute(ctx, x1, x2)
    return ctx.emit.convert(_distance(ctx, _differences(ctx, a, b), p), ctx.out_dtype)


def _cdist_grad(
    ctx: LoweringContext, grad: Value, x1: Value, x2: Value, p: float, dist: Value
) -> Value:
    """Gradient w.r.t. ``x1``: sum over j of grad[i, j] * d dist[i, j] / d x1[i]."""
    e = ctx.emit
    diff = _differences(ctx, x1, x2)
    local = _distance_grad(ctx, diff, dist, p)
    weighted = e.binary(
        "multiply", local, ctx.broadcast_to(e.reshape(grad, [*grad.shape, 1]), diff.shape)
    )
    return e.reduce_simple(weighted, 0, [diff.rank - 2], "add")


@lowering(aten._cdist_backward.default, supports=_same_batch)
def _lower_cdist_backward(
    ctx: LoweringContext, grad: Value, x1: Value, x2: Value, p: float, dist: Value
) -> Value:
    g, a, b, d = _in_compute(ctx, grad, x1, x2, dist)
    return ctx.emit.convert(_cdist_grad(ctx, g, a, b, p, d), ctx.out_dtype)


def _upper_pairs(n: int) -> np.ndarray:
    """Flat positions ``i * n + j`` of the pairs i < j, in pdist's (row-major) order."""
    i, j = np.triu_indices(n, 1)
    return (i * n + j).astype(np.int32)


@lowering(aten._pdist_forward.default, supports=floats)
def _lower_pdist_forward(ctx: LoweringContext, x: Value, p: float = 2.0) -> Value:
    """All-pairs distances, then the i < j entries gathered by a constant index table."""
    e = ctx.emit
    (a,) = _in_compute(ctx, x)
    n = a.shape[0]
    if n < 2:  # no pairs
        return e.full(0, ctx.out_shape, ctx.out_dtype)
    full = e.reshape(_distance(ctx, _differences(ctx, a, a), p), [n * n])
    pairs = _upper_pairs(n)
    idx = e.constant(pairs.reshape(-1, 1), TensorType((len(pairs), 1), torch.int32))
    picked = e.gather(
        full, idx, offset_dims=[], collapsed_slice_dims=[0], start_index_map=[0],
        index_vector_dim=1, slice_sizes=[1], out_shape=[len(pairs)],
    )  # fmt: skip
    return e.convert(picked, ctx.out_dtype)


@lowering(aten._pdist_backward.default, supports=floats)
def _lower_pdist_backward(
    ctx: LoweringContext, grad: Value, x: Value, p: float, pdist: Value
) -> Value:
    """Scatter the condensed grad and distances into symmetric (n, n) matrices; then it is
    cdist's backward of ``x`` against itself (each pair contributes to both of its rows)."""
    e = ctx.emit
    g, a, d = _in_compute(ctx, grad, x, pdist)
    n = a.shape[0]
    if n < 2:
        return e.full(0, ctx.out_shape, ctx.out_dtype)
    pairs = _upper_pairs(n)
    i, j = np.divmod(pairs, n)
    both = np.concatenate([pairs, (j * n + i).astype(np.int32)]).reshape(-1, 1)
    idx = e.constant(both, TensorType((len(both), 1), torch.int32))

    def symmetric(v: Value) -> Value:
        updates = e.concatenate([v, v], 0)
        full = e.scatter(
            e.full(0, [n * n], v.dtype), idx, updates, update_window_dims=[],
            inserted_window_dims=[0], scatter_dims_to_operand_dims=[0], index_vector_dim=1,
            combiner=None,
        )  # fmt: skip
        return e.reshape(full, [n, n])

    grad_x = _cdist_grad(ctx, symmetric(g), a, a, p, symmetric(d))
    return e.convert(grad_x, ctx.out_dtype)
