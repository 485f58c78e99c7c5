"""Random ops: rand/randn (and *_like), bernoulli, native_dropout, normal with tensor or float
moments, log_normal, cauchy, geometric; the streams and support predicates every random rule
shares (``random_draws.py`` holds the integer, multinomial and rrelu rules).

Continuous draws compute in float32 with eager's formulas (``median + sigma * tan(pi * (u -
1/2))``, ``exp(mean + std * z)``, ``ceil(log u / log1p(-p))``) and round once to the result dtype.

Randomness is threaded, not hidden: a graph with random ops takes one extra ``int32[4]`` seed
argument, which the runtime draws from PyTorch's default generator on every call. So
``torch.manual_seed(s)`` makes compiled training reproducible run to run, while the bits differ
from eager's (a different generator).

The generator is counter-based Threefry-2x32 (20 rounds, Salmon et al. 2011, as ``jax.random``
computes it), written in plain 32-bit integer StableHLO (add, xor, shifts, or): no
``rng_bit_generator``, no 64-bit state. neuronx-cc rejects a non-default RngBitGenerator
(NCC_EVRF006) and our legality rules reject the ui64 state Threefry needs there, so this form is
what every target gets, and a dropout mask computed on the XLA CPU executor is bit for bit the
one a trn target computes from the same seed.

Streams: the seed's four words ``s0..s3`` give the graph's key ``K = threefry((s0, s1), (s2,
s3))``, once per graph. Random op number ``d`` of the graph (in emission order) draws word pairs
``threefry(K, (d, i))`` for ``i = 0, 1, ...``; so no two ops, and no two elements, share a
counter, and no state is chained from op to op.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Sequence

import torch
import torch.fx as fx

from ...errors import LoweringError
from ..context import LoweringContext
from ..emit import Emitter, TensorType, Value
from ..registry import Support, lowering
from ..rules import FLOATS, INTS, all_of, arg, dtypes_in, floats

aten = torch.ops.aten
floats_or_bool = dtypes_in(*FLOATS, torch.bool)
SEED_SHAPE = (4,)  # int32[4]: Threefry key (s0, s1) and counter (s2, s3) of the graph key
U32 = torch.uint32

#: Threefry-2x32 rotation distances, alternating every four rounds (Random123 / jax.random).
ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
#: Threefry's key-schedule parity constant for 32-bit words (Random123's SKEIN_KS_PARITY32).
KEY_PARITY = 0x1BD11BDA

#: Random ops drawn so far per emitter (the ``d`` of the streams above).
_draws: weakref.WeakKeyDictionary[Emitter, int] = weakref.WeakKeyDictionary()


class _Consts:
    """Splat ui32 constants of one shape, emitted once each."""

    def __init__(self, e: Emitter, shape: tuple[int, ...]) -> None:
        self.e, self.shape = e, shape
        self.cache: dict[int, Value] = {}

    def __call__(self, value: int) -> Value:
        if value not in self.cache:
            self.cache[value] = self.e.full(value, self.shape, U32)
        return self.cache[value]


def threefry2x32(
    e: Emitter, key: tuple[Value, Value], x: tuple[Value, Value]
) -> tuple[Value, Value]:
    """Threefry-2x32 with 20 rounds of the ui32 word pairs ``x`` under ``key``.

    ``key`` words are rank-0 ui32 values; ``x`` words share one ui32 shape. Matches
    ``jax.random``'s ``threefry_2x32`` word for word (the known-answer vectors of Random123 are in
    ``tests/lowering/test_random.py``)."""
    shape = x[0].shape
    scalar = _Consts(e, ())
    const = _Consts(e, shape)
    k0, k1 = key
    ks = (k0, k1, e.binary("xor", e.binary("xor", k0, k1), scalar(KEY_PARITY)))

    def splat(k: Value, plus: int = 0) -> Value:
        if plus:
            k = e.binary("add", k, scalar(plus))
        return e.broadcast_in_dim(k, shape, ())

    x0 = e.binary("add", x[0], splat(ks[0]))
    x1 = e.binary("add", x[1], splat(ks[1]))
    for j in range(1, 6):
        for r in ROTATIONS[(j - 1) % 2]:
            x0 = e.binary("add", x0, x1)
            rotated = e.binary(
                "or",
                e.binary("shift_left", x1, const(r)),
                e.binary("shift_right_logical", x1, const(32 - r)),
            )
            x1 = e.binary("xor", x0, rotated)
        # key injection j: words j and j+1 of the schedule, plus the injection count
        x0 = e.binary("add", x0, splat(ks[j % 3]))
        x1 = e.binary("add", x1, splat(ks[(j + 1) % 3], j))
    return x0, x1


def _word(e: Emitter, words: Value, i: int) -> Value:
    return e.reshape(e.slice(words, [i], [i + 1], [1]), ())


def _graph_key(ctx: LoweringContext) -> tuple[Value, Value]:
    """The graph's Threefry key, derived from the seed argument (added on first use)."""
    e, m = ctx.emit, ctx.module
    if m.rng_state is None:
        m.rng_arg_index = len(e.args)
        seed = e.bitcast_convert(e.arg(TensorType(SEED_SHAPE, torch.int32)), U32)
        s = [_word(e, seed, i) for i in range(4)]
        k0, k1 = threefry2x32(e, (s[0], s[1]), (s[2], s[3]))
        m.rng_state = e.concatenate([e.reshape(k0, (1,)), e.reshape(k1, (1,))], 0)
    return _word(e, m.rng_state, 0), _word(e, m.rng_state, 1)


def random_words(ctx: LoweringContext, n: int) -> tuple[Value, Value]:
    """Two ``ui32[n]`` vectors of independent random words: the next random op's stream."""
    e = ctx.emit
    if n >= 2**32:
        raise LoweringError(
            f"a random op of {n:,} word pairs overflows the 32-bit Threefry counter",
            node=ctx.node,
            hint="draw random numbers in smaller pieces",
        )
    key = _graph_key(ctx)
    draw = _draws.get(e, 0)
    _draws[e] = draw + 1
    return threefry2x32(e, key, (e.full(draw, (n,), U32), e.iota((n,), 0, U32)))


def random_bits(ctx: LoweringContext, shape: Sequence[int]) -> Value:
    """uint32 random bits of ``shape`` (both words of each Threefry block are used)."""
    e = ctx.emit
    shape = tuple(int(d) for d in shape)
    n = math.prod(shape)
    if n == 0:
        return e.full(0, shape, U32)
    half = (n + 1) // 2
    y0, y1 = random_words(ctx, half)
    both = e.concatenate([y0, y1], 0)
    return e.reshape(e.slice(both, [0], [n], [1]), shape)


def _unit(e: Emitter, bits: Value) -> Value:
    """float32 in [0, 1) from uint32 bits: 23 mantissa bits under the exponent of 1.0, minus 1."""
    shape = bits.shape
    mantissa = e.binary("shift_right_logical", bits, e.full(9, shape, U32))
    one_to_two = e.binary("or", mantissa, e.full(0x3F800000, shape, U32))
    floats = e.bitcast_convert(one_to_two, torch.float32)
    return e.binary("subtract", floats, e.full(1.0, shape, torch.float32))


def uniform(ctx: LoweringContext, shape: Sequence[int]) -> Value:
    """float32 samples in [0, 1)."""
    return _unit(ctx.emit, random_bits(ctx, shape))


def normal(ctx: LoweringContext, shape: Sequence[int]) -> Value:
    """float32 standard normal samples (Box-Muller on the two words of each Threefry block)."""
    e = ctx.emit
    shape = tuple(int(d) for d in shape)
    n = math.prod(shape)
    if n == 0:
        return e.full(0.0, shape, torch.float32)
    w0, w1 = random_words(ctx, n)
    u1 = e.binary("subtract", e.full(1.0, (n,), torch.float32), _unit(e, w0))  # (0, 1]
    u2 = _unit(e, w1)
    radius = e.unary(
        "sqrt", e.binary("multiply", e.unary("log", u1), e.full(-2.0, (n,), torch.float32))
    )
    angle = e.binary("multiply", u2, e.full(2.0 * math.pi, (n,), torch.float32))
    return e.reshape(e.binary("multiply", radius, e.unary("cosine", angle)), shape)


def _as_dtype(ctx: LoweringContext, x: Value, dtype: torch.dtype) -> Value:
    out = ctx.emit.convert(x, dtype)
    if dtype != torch.float32 and dtype.is_floating_point:
        # Rounding to bf16/f16 can turn 0.9999 into 1.0; rand promises [0, 1).
        below_one = torch.nextafter(torch.tensor(1.0, dtype=dtype), torch.tensor(0.0, dtype=dtype))
        out = ctx.emit.binary("minimum", out, ctx.full_like(below_one.item(), out))
    return out


# ---- shared by the random rules: support predicates and the open unit interval -------------
def no_generator(index: int = 99) -> Support:
    """Rejects an explicit ``torch.Generator``: its state lives outside the graph."""

    def check(node: fx.Node) -> str | None:
        if arg(node, index, "generator") is not None:
            return "an explicit torch.Generator cannot be threaded into the graph's seed"
        return None

    return check


def scalar_args_ok(*checks: tuple[int, str, Callable[[float], bool], str]) -> Support:
    """Rejects scalar arguments eager rejects (its errors stay eager's)."""

    def check(node: fx.Node) -> str | None:
        for index, name, ok, why in checks:
            value = arg(node, index, name)
            if isinstance(value, int | float) and not ok(float(value)):  # not a tensor operand
                return f"{name}={value}: {why} (eager raises)"
        return None

    return check


def open_unit(ctx: LoweringContext, shape: tuple[int, ...]) -> Value:
    """float32 samples in (0, 1): ``(m + 0.5) / 2**23`` for 23 random bits ``m`` (exact in f32),
    so ``log`` of them is finite and nonzero."""
    e = ctx.emit
    m = e.binary("shift_right_logical", random_bits(ctx, shape), e.full(9, shape, U32))
    half = e.binary("add", e.convert(m, torch.float32), e.full(0.5, shape, torch.float32))
    return e.binary("multiply", half, e.full(2.0**-23, shape, torch.float32))


@lowering(aten.rand.default, aten.rand_like.default, supports=floats_or_bool)
def _lower_rand(ctx: LoweringContext, *args: object, **_: object) -> Value:
    return _as_dtype(ctx, uniform(ctx, ctx.out_shape), ctx.out_dtype)


@lowering(aten.randn.default, aten.randn_like.default, supports=floats_or_bool)
def _lower_randn(ctx: LoweringContext, *args: object, **_: object) -> Value:
    return ctx.emit.convert(normal(ctx, ctx.out_shape), ctx.out_dtype)


@lowering(aten.bernoulli.default, aten.bernoulli.p, supports=floats_or_bool)
def _lower_bernoulli(ctx: LoweringContext, x: Value, p: float | None = None, **_: object) -> Value:
    e = ctx.emit
    u = uniform(ctx, x.shape)
    if p is None:  # bernoulli(probabilities)
        (prob,) = ctx.promote(x, dtype=torch.float32)
    else:
        prob = e.full(p, x.shape, torch.float32)
    return e.convert(e.compare(u, prob, "LT"), ctx.out_dtype)


@lowering(aten.native_dropout.default, supports=floats_or_bool)
def _lower_native_dropout(
    ctx: LoweringContext, x: Value, p: float, train: bool | None
) -> tuple[Value, Value]:
    e = ctx.emit
    if not train or p == 0:
        return x, e.full(True, x.shape, torch.bool)
    keep = e.compare(uniform(ctx, x.shape), e.full(p, x.shape, torch.float32), "GE")
    scale = 0.0 if p >= 1 else 1.0 / (1.0 - p)
    compute = ctx.compute_dtype(x.dtype)
    # eager's x * mask * scale: a dropped element is x * 0, so -0.0 for a negative x and NaN for
    # an infinite or NaN one (a select of 0 gave +0.0 for all). Not a product with the converted
    # mask: XLA rewrites x * convert(mask) into that select.
    xc = e.convert(x, compute)
    dropped = e.binary("multiply", xc, e.full(0, x.shape, compute))
    out = e.select(keep, e.binary("multiply", xc, e.full(scale, x.shape, compute)), dropped)
    return e.convert(out, x.dtype), keep


# ---- more distributions: normal with tensor moments, cauchy, log_normal, geometric ------------


@lowering(
    aten.normal.Tensor_float,
    aten.normal.float_Tensor,
    aten.normal.Tensor_Tensor,
    aten.normal.float_float,
    supports=all_of(floats, no_generator(), scalar_args_ok((1, "std", lambda v: v >= 0, ">= 0"))),
)
def _lower_normal(
    ctx: LoweringContext, mean: Value | float, std: Value | float, *_: object, **__: object
) -> Value:
    """``mean + std * z`` in float32, rounded once; tensor moments broadcast to the result (a
    negative std inside a tensor, which eager rejects at run time, is not checked)."""
    e, shape = ctx.emit, ctx.out_shape
    z = normal(ctx, shape)
    moments = [
        ctx.broadcast_to(e.convert(m, torch.float32), shape)
        if isinstance(m, Value)
        else e.full(float(m), shape, torch.float32)
        for m in (mean, std)
    ]
    return e.convert(
        e.binary("add", e.binary("multiply", z, moments[1]), moments[0]), ctx.out_dtype
    )


@lowering(
    aten.log_normal.default,
    supports=all_of(floats, no_generator(), scalar_args_ok((2, "std", lambda v: v > 0, "> 0"))),
)
def _lower_log_normal(
    ctx: LoweringContext, x: Value, mean: float = 1.0, std: float = 2.0, **_: object
) -> Value:
    e = ctx.emit
    z = normal(ctx, x.shape)
    z = e.binary("add", e.binary("multiply", z, ctx.full_like(std, z)), ctx.full_like(mean, z))
    return e.convert(e.unary("exponential", z), ctx.out_dtype)


@lowering(
    aten.cauchy.default,
    supports=all_of(floats, no_generator(), scalar_args_ok((2, "sigma", lambda v: v > 0, "> 0"))),
)
def _lower_cauchy(
    ctx: LoweringContext, x: Value, median: float = 0.0, sigma: float = 1.0, **_: object
) -> Value:
    """``median + sigma * tan(pi * (u - 1/2))`` as eager, u in (0, 1) so the tangent is finite."""
    e = ctx.emit
    u = open_unit(ctx, x.shape)
    angle = e.binary(
        "multiply", e.binary("subtract", u, ctx.full_like(0.5, u)), ctx.full_like(math.pi, u)
    )
    tan = e.binary("divide", e.unary("sine", angle), e.unary("cosine", angle))
    out = e.binary(
        "add", e.binary("multiply", tan, ctx.full_like(sigma, tan)), ctx.full_like(median, tan)
    )
    return e.convert(out, ctx.out_dtype)


@lowering(
    aten.geometric.default,
    supports=all_of(
        dtypes_in(*FLOATS, *INTS),
        no_generator(),
        scalar_args_ok((1, "p", lambda v: 0 < v < 1, "in (0, 1)")),
    ),
)
def _lower_geometric(ctx: LoweringContext, x: Value, p: float, **_: object) -> Value:
    """``ceil(log(u) / log1p(-p))`` as eager: trials until the first success, >= 1."""
    e = ctx.emit
    u = open_unit(ctx, x.shape)
    k = e.unary("ceil", e.binary("divide", e.unary("log", u), ctx.full_like(math.log1p(-p), u)))
    return e.convert(k, ctx.out_dtype)
