"""Random ops: rand/randn (and *_like), bernoulli, native_dropout.

Randomness is threaded, not hidden: a graph with random ops takes one extra ``int32[4]`` seed
argument, which the runtime draws from PyTorch's default generator on every call. So
``torch.manual_seed(s)`` makes compiled training reproducible run to run, while the bits differ
from eager's (a different generator: StableHLO ``rng_bit_generator`` with Threefry). The state is
chained from one random op to the next inside the graph, so no two ops share bits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..context import LoweringContext
from ..emit import TensorType, Value
from ..registry import FLOATS, dtypes_in, lowering

aten = torch.ops.aten
floats = dtypes_in(*FLOATS, torch.bool)
SEED_SHAPE = (4,)  # int32[4], bitcast to the uint64[2] Threefry state


def _state(ctx: LoweringContext) -> Value:
    e = ctx.emit
    if e.rng_state is None:
        e.rng_arg_index = len(e.args)
        seed = e.arg(TensorType(SEED_SHAPE, torch.int32))
        pairs = e.reshape(seed, (2, 2))
        e.rng_state = e.op1("bitcast_convert", [pairs], TensorType((2,), torch.uint64))
    return e.rng_state


def random_bits(ctx: LoweringContext, shape: Sequence[int]) -> Value:
    """uint32 random bits of ``shape``; advances the graph's RNG state."""
    e = ctx.emit
    state = _state(ctx)
    new_state, bits = e.op(
        "rng_bit_generator",
        [state],
        [state.type, TensorType(tuple(shape), torch.uint32)],
        "rng_algorithm = #stablehlo<rng_algorithm THREE_FRY>",
    )
    e.rng_state = new_state
    return bits


def uniform(ctx: LoweringContext, shape: Sequence[int]) -> Value:
    """float32 samples in [0, 1): 23 random mantissa bits under the exponent of 1.0, minus 1."""
    e = ctx.emit
    bits = random_bits(ctx, shape)
    mantissa = e.binary("shift_right_logical", bits, e.full(9, shape, torch.uint32))
    one_to_two = e.binary("or", mantissa, e.full(0x3F800000, shape, torch.uint32))
    floats = e.op1("bitcast_convert", [one_to_two], TensorType(tuple(shape), torch.float32))
    return e.binary("subtract", floats, e.full(1.0, shape, torch.float32))


def normal(ctx: LoweringContext, shape: Sequence[int]) -> Value:
    """float32 standard normal samples (Box-Muller on two uniforms)."""
    e = ctx.emit
    u1 = e.binary("subtract", e.full(1.0, shape, torch.float32), uniform(ctx, shape))  # (0, 1]
    u2 = uniform(ctx, shape)
    radius = e.unary(
        "sqrt", e.binary("multiply", e.unary("log", u1), e.full(-2.0, shape, torch.float32))
    )
    angle = e.binary("multiply", u2, e.full(2.0 * math.pi, shape, torch.float32))
    return e.binary("multiply", radius, e.unary("cosine", angle))


def _as_dtype(ctx: LoweringContext, x: Value, dtype: torch.dtype) -> Value:
    out = ctx.emit.convert(x, dtype)
    if dtype != torch.float32 and dtype.is_floating_point:
        # Rounding to bf16/f16 can turn 0.9999 into 1.0; rand promises [0, 1).
        below_one = torch.nextafter(torch.tensor(1.0, dtype=dtype), torch.tensor(0.0, dtype=dtype))
        out = ctx.emit.binary("minimum", out, ctx.full_like(below_one.item(), out))
    return out


@lowering(aten.rand.default, aten.rand_like.default, supports=floats)
def _lower_rand(ctx: LoweringContext, *args: object, **_: object) -> Value:
    return _as_dtype(ctx, uniform(ctx, ctx.out_shape), ctx.out_dtype)


@lowering(aten.randn.default, aten.randn_like.default, supports=floats)
def _lower_randn(ctx: LoweringContext, *args: object, **_: object) -> Value:
    return ctx.emit.convert(normal(ctx, ctx.out_shape), ctx.out_dtype)


@lowering(aten.bernoulli.default, aten.bernoulli.p, supports=floats)
def _lower_bernoulli(ctx: LoweringContext, x: Value, p: float | None = None, **_: object) -> Value:
    e = ctx.emit
    u = uniform(ctx, x.shape)
    if p is None:  # bernoulli(probabilities)
        (prob,) = ctx.promote(x, dtype=torch.float32)
    else:
        prob = e.full(p, x.shape, torch.float32)
    return e.convert(e.compare(u, prob, "LT"), ctx.out_dtype)


@lowering(aten.native_dropout.default, supports=floats)
def _lower_native_dropout(
    ctx: LoweringContext, x: Value, p: float, train: bool | None
) -> tuple[Value, Value]:
    e = ctx.emit
    if not train or p == 0:
        return x, e.full(True, x.shape, torch.bool)
    keep = e.compare(uniform(ctx, x.shape), e.full(p, x.shape, torch.float32), "GE")
    scale = 0.0 if p >= 1 else 1.0 / (1.0 - p)
    compute = ctx.compute_dtype(x.dtype)
    kept = e.select(keep, e.convert(x, compute), e.full(0, x.shape, compute))
    out = e.binary("multiply", kept, e.full(scale, x.shape, compute))
    return e.convert(out, x.dtype), keep
