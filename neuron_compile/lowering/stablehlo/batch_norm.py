"""Batch normalization (training and inference) for any input rank ``(N, C, *)``.

Statistics, normalization and the running-stat update are computed in float32 for low-precision
inputs and rounded once, as eager PyTorch does. The training update follows eager:
``new_running_mean = (1 - momentum) * running_mean + momentum * mean`` and
``new_running_var = (1 - momentum) * running_var + momentum * var * n / (n - 1)`` (unbiased).

The backward, ``native_batch_norm_backward``, is lowered whole where a target keeps it (the cpu
target: tracing its decomposition cost more than the rest of a BatchNorm); others have
AOTAutograd decompose it into elementwise ops and sums. The in-place forms
(``native_batch_norm`` and ``_native_batch_norm_legit`` with running stats in training mode)
would update the running stats by mutation, which a pure StableHLO function cannot express;
functionalization turns them into ``_native_batch_norm_legit_functional`` before we see them, so
their predicates reject only that case, with a reason.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.fx as fx

from ..context import LoweringContext
from ..emit import Value
from ..registry import lowering
from ..rules import floats
from .reduction import moments, sum_

aten = torch.ops.aten

Outputs = tuple[Value, Value, Value]


def _per_channel(ctx: LoweringContext, v: Value, like: Value) -> Value:
    """Broadcast a (C,) vector along dim 1 of ``like`` in ``like``'s dtype."""
    return ctx.emit.broadcast_in_dim(ctx.emit.convert(v, like.dtype), like.shape, [1])


def _affine(
    ctx: LoweringContext,
    xf: Value,
    mean: Value,
    rstd: Value,
    weight: Value | None,
    bias: Value | None,
) -> Value:
    """``(x - mean) * rstd * weight + bias`` with (C,) statistics, in xf's dtype."""
    e = ctx.emit
    y = e.binary("subtract", xf, _per_channel(ctx, mean, xf))
    y = e.binary("multiply", y, _per_channel(ctx, rstd, xf))
    if weight is not None:
        y = e.binary("multiply", y, _per_channel(ctx, weight, xf))
    if bias is not None:
        y = e.binary("add", y, _per_channel(ctx, bias, xf))
    return y


def _batch_stats(ctx: LoweringContext, xf: Value, eps: float) -> tuple[Value, Value, Value]:
    """(mean, biased var, rstd), each (C,), over every dim but the channel dim."""
    e = ctx.emit
    mean, var = moments(ctx, xf, [0, *range(2, xf.rank)])
    mean, var = e.reshape(mean, [xf.shape[1]]), e.reshape(var, [xf.shape[1]])
    rstd = e.unary("rsqrt", e.binary("add", var, ctx.full_like(eps, var)))
    return mean, var, rstd


def _ema(ctx: LoweringContext, running: Value, batch: Value, momentum: float, index: int) -> Value:
    """``(1 - momentum) * running + momentum * batch``, in the running stat's dtype."""
    e = ctx.emit
    acc = batch.dtype
    old = e.binary("multiply", e.convert(running, acc), ctx.full_like(1 - momentum, batch))
    new = e.binary("add", old, e.binary("multiply", batch, ctx.full_like(momentum, batch)))
    return e.convert(new, ctx.out_type(index).dtype)


def _saved(ctx: LoweringContext, stat: Value, index: int) -> Value:
    """Saved statistic ``index`` of the node; CPU returns empty (0,) tensors in eval mode."""
    out = ctx.out_type(index)
    if out.shape == (0,):
        return ctx.emit.full(0, out.shape, out.dtype)
    return ctx.emit.convert(stat, out.dtype)


def _train(
    ctx: LoweringContext, x: Value, weight: Value | None, bias: Value | None, eps: float
) -> tuple[Outputs, Value, Value]:
    """((output, save_mean, save_rstd), mean, biased var); the last two in the compute dtype."""
    xf = ctx.emit.convert(x, ctx.compute_dtype(x.dtype))
    mean, var, rstd = _batch_stats(ctx, xf, eps)
    y = ctx.emit.convert(_affine(ctx, xf, mean, rstd, weight, bias), ctx.out_type(0).dtype)
    return (y, _saved(ctx, mean, 1), _saved(ctx, rstd, 2)), mean, var


def _eval(
    ctx: LoweringContext,
    x: Value,
    weight: Value | None,
    bias: Value | None,
    running_mean: Value,
    running_var: Value,
    eps: float,
) -> Outputs:
    e = ctx.emit
    acc = ctx.compute_dtype(x.dtype)
    xf = e.convert(x, acc)
    mean, var = e.convert(running_mean, acc), e.convert(running_var, acc)
    rstd = e.unary("rsqrt", e.binary("add", var, ctx.full_like(eps, var)))
    y = e.convert(_affine(ctx, xf, mean, rstd, weight, bias), ctx.out_type(0).dtype)
    return y, _saved(ctx, mean, 1), _saved(ctx, rstd, 2)


def _unbiased(ctx: LoweringContext, x: Value, var: Value) -> Value:
    n = math.prod(x.shape) // x.shape[1]
    factor = n / (n - 1) if n > 1 else float("nan")  # eager: 0 / 0 for a single value
    return ctx.emit.binary("multiply", var, ctx.full_like(factor, var))


@lowering(aten._native_batch_norm_legit_functional.default, supports=floats)
def _lower_native_batch_norm_legit_functional(
    ctx: LoweringContext,
    x: Value,
    weight: Value | None,
    bias: Value | None,
    running_mean: Value | None,
    running_var: Value | None,
    training: bool,
    momentum: float,
    eps: float,
) -> tuple[Value, Value, Value, Value | None, Value | None]:
    """Returns (out, save_mean, save_rstd, new_running_mean, new_running_var)."""
    if not training:
        return (
            *_eval(ctx, x, weight, bias, running_mean, running_var, eps),
            running_mean,
            running_var,
        )
    outs, mean, var = _train(ctx, x, weight, bias, eps)
    new_mean = new_var = None
    if running_mean is not None:
        new_mean = _ema(ctx, running_mean, mean, momentum, 3)
    if running_var is not None:
        new_var = _ema(ctx, running_var, _unbiased(ctx, x, var), momentum, 4)
    return (*outs, new_mean, new_var)


@lowering(aten._native_batch_norm_legit_no_training.default, supports=floats)
def _lower_native_batch_norm_legit_no_training(
    ctx: LoweringContext,
    x: Value,
    weight: Value | None,
    bias: Value | None,
    running_mean: Value,
    running_var: Value,
    momentum: float,
    eps: float,
) -> Outputs:
    return _eval(ctx, x, weight, bias, running_mean, running_var, eps)


@lowering(aten._native_batch_norm_legit.no_stats, supports=floats)
def _lower_native_batch_norm_legit_no_stats(
    ctx: LoweringContext,
    x: Value,
    weight: Value | None,
    bias: Value | None,
    training: bool,
    momentum: float,
    eps: float,
) -> Outputs:
    """No running stats (``track_running_stats=False``): always normalizes with batch stats."""
    return _train(ctx, x, weight, bias, eps)[0]


def _no_inplace_update(node: fx.Node) -> str | None:
    """The in-place forms are lowerable unless they would update running stats by mutation."""
    why = floats(node)
    if why is not None:
        return why
    _, _, _, running_mean, running_var, training = node.args[:6]
    if training and (running_mean is not None or running_var is not None):
        return (
            "training-mode batch norm updates running_mean/running_var in place; only its "
            "functionalized form (_native_batch_norm_legit_functional) is lowered"
        )
    return None


@lowering(
    aten._native_batch_norm_legit.default,
    aten.native_batch_norm.default,
    supports=_no_inplace_update,
)
def _lower_native_batch_norm(
    ctx: LoweringContext,
    x: Value,
    weight: Value | None,
    bias: Value | None,
    running_mean: Value | None,
    running_var: Value | None,
    training: bool,
    momentum: float,
    eps: float,
) -> Outputs:
    if training:  # the predicate guarantees there are no running stats to update
        return _train(ctx, x, weight, bias, eps)[0]
    return _eval(ctx, x, weight, bias, running_mean, running_var, eps)


@lowering(aten._batch_norm_with_update_functional.default, supports=floats)
def _lower_batch_norm_with_update_functional(
    ctx: LoweringContext,
    x: Value,
    weight: Value | None,
    bias: Value | None,
    running_mean: Value,
    running_var: Value,
    momentum: float,
    eps: float,
) -> tuple[Value, Value, Value, Value, Value, Value]:
    """Training-mode batch norm with running-stat updates (the newer op family's functional
    form): (out, save_mean, save_rstd, reserve, new_running_mean, new_running_var). ``reserve``
    is cuDNN's workspace; CPU returns it empty."""
    outs, mean, var = _train(ctx, x, weight, bias, eps)
    new_mean = _ema(ctx, running_mean, mean, momentum, 4)
    new_var = _ema(ctx, running_var, _unbiased(ctx, x, var), momentum, 5)
    reserve = ctx.out_type(3)
    return (*outs, ctx.emit.full(0, reserve.shape, reserve.dtype), new_mean, new_var)


@lowering(aten.native_batch_norm_backward.default, supports=floats)
def _lower_native_batch_norm_backward(
    ctx: LoweringContext,
    grad_out: Value,
    x: Value,
    weight: Value | None,
    running_mean: Value | None,
    running_var: Value | None,
    save_mean: Value | None,
    save_invstd: Value | None,
    train: bool,
    eps: float,
    output_mask: Sequence[bool],
) -> tuple[Value | None, Value | None, Value | None]:
    """(grad_input, grad_weight, grad_bias), ``None`` where ``output_mask`` leaves one out: what
    PyTorch's decomposition (``torch._decomp.decompositions.native_batch_norm_backward``)
    computes, operation for operation in the same dtypes, for the targets that keep the op whole
    (``Target.kept_ops``; the others trace that decomposition).

    With ``g`` the grad, ``c = x - mean`` and sums over every dim but the channel's:
    ``grad_input = ((g - c * (sum(g c) / n) * invstd^2) - sum(g) / n) * invstd * weight``
    (eval: ``g * invstd * weight``, ``invstd = rsqrt(running_var + eps)``),
    ``grad_weight = sum(g c) * invstd``, ``grad_bias = sum(g)``, all in the compute dtype."""
    e = ctx.emit
    acc = ctx.compute_dtype(x.dtype)
    g, xf = e.convert(grad_out, acc), e.convert(x, acc)
    dims = [d for d in range(x.rank) if d != 1]

    def per_channel(v: Value) -> Value:
        return e.broadcast_in_dim(v, x.shape, [1])

    def times(a: Value, b: Value | float) -> Value:
        return e.binary("multiply", a, b if isinstance(b, Value) else ctx.full_like(b, a))

    if train:
        mean, invstd = e.convert(save_mean, acc), e.convert(save_invstd, acc)
    else:
        mean = e.convert(running_mean, acc)
        var = e.convert(running_var, acc)
        invstd = e.unary("rsqrt", e.binary("add", var, ctx.full_like(eps, var)))
    norm = 1.0 / (math.prod(x.shape) / x.shape[1])  # the decomposition's Python float
    grad_sum = sum_(ctx, g, dims, False, acc)
    centered = e.binary("subtract", xf, per_channel(mean))
    dot_p = sum_(ctx, times(g, centered), dims, False, acc)
    scale = invstd if weight is None else times(invstd, e.convert(weight, acc))
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        if train:
            proj_scale = times(times(dot_p, norm), times(invstd, invstd))
            proj = times(centered, per_channel(proj_scale))
            shifted = e.binary("subtract", e.binary("subtract", g, proj),
                               per_channel(times(grad_sum, norm)))  # fmt: skip
            grad_input = times(shifted, per_channel(scale))
        else:
            grad_input = times(g, per_channel(scale))
        grad_input = e.convert(grad_input, ctx.out_type(0).dtype)
    if output_mask[1]:
        grad_weight = e.convert(times(dot_p, invstd), ctx.out_type(1).dtype)
    if output_mask[2]:
        grad_bias = e.convert(grad_sum, ctx.out_type(2).dtype)
    return grad_input, grad_weight, grad_bias
