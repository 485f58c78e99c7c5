"""More random ops on the Threefry streams of ``random.py``: randint/randint_like, random (the
functional ``random_``), uniform, exponential, normal_functional, bernoulli with a probability
tensor, multinomial, randperm, the ``generator=`` overloads of rand/randn/randint, and rrelu (its
functional form and backward).

Bits cannot equal eager's (a different generator); what matches eager is the distribution, the
dtype, the shape and the range of every draw, and ``torch.manual_seed`` reproduces a run as it does
for the ops of ``random.py``:

- Integer draws take eager's own formula, ``low + bits % (high - low)`` on 32 random bits (eager's
  ``random_from_to`` uses 32 bits whenever the range is below 2**32), so even the modulo bias is
  eager's. Ranges eager rejects, or that need its 64-bit path, fall back (eager raises its error).
- Float draws compute in float32 and round once, then clamp into eager's half-open range (rounding
  to bf16 could reach the excluded upper end).
- ``multinomial`` without replacement is the exponential race (Gumbel top-k in log form): the
  ``num_samples`` largest ``log p - log E``, E ~ Exp(1), which is how eager's CPU kernel samples it
  (``topk(p / E)``). With replacement it inverts the CDF; the index is then moved to the next
  category of positive probability, so a zero-probability category is never drawn however the
  cumulative sum rounds.
- rrelu in eval mode is deterministic: ``leaky_relu`` with slope ``(lower + upper) / 2``, computed
  as eager's kernel computes it (float32 for low-precision inputs), so forward and backward equal
  eager's bit for bit. In training mode the noise is uniform in [lower, upper) for inputs <= 0 and 1
  elsewhere, as in eager's ``_rrelu_with_noise_train``; the backward is ``grad * noise``.

A ``torch.Generator`` other than the default cannot be threaded into the graph (its state lives
outside it), so an op given one falls back to eager.
"""

from __future__ import annotations

import math

import torch
import torch.fx as fx

from ..context import LoweringContext
from ..emit import Value
from ..registry import lowering
from ..rules import FLOATS, INDEX, all_of, any_dtype, arg, dtypes_in, floats
from .random import (
    U32,
    no_generator,
    normal,
    open_unit,
    random_bits,
    random_words,
    scalar_args_ok,
    uniform,
)
from .scan import scan
from .sort import sort_with_indices

aten = torch.ops.aten
F32 = torch.float32
#: A with-replacement multinomial compares every sample with every category; above this many
#: comparisons it falls back rather than build a huge intermediate.
MAX_MULTINOMIAL_COMPARES = 1 << 26


# ---- support predicates ----------------------------------------------------------------------
def _out_dtype(node: fx.Node) -> torch.dtype:
    val = node.meta["val"]
    return (val[0] if isinstance(val, tuple | list) else val).dtype


def _int_bounds(dtype: torch.dtype) -> tuple[int, int]:
    """Inclusive bounds eager's ``random_`` checks ``from`` and ``to - 1`` against."""
    if dtype == torch.bool:
        return 0, 1
    if dtype.is_floating_point:
        digits = 1 - int(math.log2(torch.finfo(dtype).eps))  # mantissa digits: 24 for float32
        return -(2**digits), 2**digits
    info = torch.iinfo(dtype)
    return int(info.min), int(info.max)


def _range_reason(dtype: torch.dtype, low: int, high: int) -> str | None:
    """None when ``[low, high)`` is drawable as eager draws it in ``dtype``, else why not."""
    lo, hi = _int_bounds(dtype)
    if not low < high:
        return f"empty range [{low}, {high}) (eager raises)"
    if low < lo or high - 1 > hi:
        return f"range [{low}, {high}) is out of bounds for {dtype} (eager raises)"
    if high - low >= 2**32:
        return "a range of 2**32 or more takes eager's 64-bit generator path"
    if low < -(2**31) or high - 1 > 2**31 - 1:  # int64 runs as int32, draws are int32
        return f"range [{low}, {high}) does not fit the 32-bit dtype {dtype} runs as"
    return None


def _randint_range(node: fx.Node) -> tuple[int, int]:
    name = node.target._overloadname  # type: ignore[union-attr]
    like = node.target.overloadpacket is aten.randint_like  # type: ignore[union-attr]
    first = 1 if like else 0
    if name.startswith("low"):
        return int(node.args[first]), int(node.args[first + 1])
    return 0, int(node.args[first])


def _randint_support(node: fx.Node) -> str | None:
    low, high = _randint_range(node)
    return _range_reason(_out_dtype(node), low, high)


def _random_range(node: fx.Node) -> tuple[int, int]:
    """``[from, to)`` of ``aten.random``'s overloads, as eager's ``random_`` derives it."""
    dtype = _out_dtype(node)
    name = node.target._overloadname  # type: ignore[union-attr]
    if name == "to":
        return 0, int(node.args[1])
    top = _int_bounds(dtype)[1] + 1
    if name == "from":
        to = arg(node, 2, "to")
        return int(node.args[1]), top if to is None else int(to)
    return 0, top


def _random_support(node: fx.Node) -> str | None:
    low, high = _random_range(node)
    return _range_reason(_out_dtype(node), low, high)


def _multinomial_support(node: fx.Node) -> str | None:
    probs = node.args[0].meta["val"]  # type: ignore[union-attr]
    n = int(node.args[1])
    replacement = bool(arg(node, 2, "replacement", False))
    if probs.dim() not in (1, 2) or probs.shape[-1] == 0 or n <= 0:
        return "multinomial of an empty or >2-d distribution, or of no samples (eager raises)"
    if not replacement and n > probs.shape[-1]:
        return "more samples than categories without replacement (eager raises)"
    rows = probs.shape[0] if probs.dim() == 2 else 1
    if replacement and rows * n * probs.shape[-1] > MAX_MULTINOMIAL_COMPARES:
        return "multinomial with replacement compares every sample with every category: too large"
    return None


# ---- helpers ---------------------------------------------------------------------------------
def _below(value: float, dtype: torch.dtype) -> float:
    """The largest ``dtype`` value below ``value``."""
    t = torch.tensor(value, dtype=dtype)
    return torch.nextafter(t, torch.tensor(-math.inf, dtype=dtype)).item()


def _above(value: float, dtype: torch.dtype) -> float:
    """The smallest ``dtype`` value above ``value``."""
    t = torch.tensor(value, dtype=dtype)
    return torch.nextafter(t, torch.tensor(math.inf, dtype=dtype)).item()


def _in_dtype(value: float, dtype: torch.dtype) -> float:
    return torch.tensor(value, dtype=dtype).item()


def _scaled(ctx: LoweringContext, u: Value, low: float, high: float) -> Value:
    """``low + u * (high - low)`` in float32."""
    e = ctx.emit
    span = e.binary("multiply", u, ctx.full_like(high - low, u))
    return e.binary("add", span, ctx.full_like(low, u))


def int_draw(ctx: LoweringContext, shape: tuple[int, ...], low: int, high: int) -> Value:
    """Integers in ``[low, high)`` as eager's ``random_from_to``: ``low + bits % (high - low)``
    (32 bits), in int32 (wrapping uint32 arithmetic; the support check keeps values in range)."""
    e = ctx.emit
    r = e.binary("remainder", random_bits(ctx, shape), e.full(high - low, shape, U32))
    r = e.binary("add", r, e.full(low % 2**32, shape, U32))
    return e.bitcast_convert(r, torch.int32)


def _float_range(ctx: LoweringContext, x: Value, low: float, high: float) -> Value:
    """Clamp ``x`` (already in its dtype) into ``[low, high)``, eager's range for uniform."""
    dtype = x.dtype
    lo = _in_dtype(low, dtype)
    hi = _in_dtype(high, dtype)
    top = _below(hi, dtype) if lo < hi else lo
    return ctx.emit.clamp(ctx.full_like(lo, x), x, ctx.full_like(top, x))


# ---- integer draws ---------------------------------------------------------------------------
@lowering(
    aten.randint.default,
    aten.randint.low,
    aten.randint.generator,
    aten.randint.low_generator,
    aten.randint_like.default,
    aten.randint_like.low_dtype,
    aten.randint_like.generator,
    aten.randint_like.low_generator_dtype,
    supports=all_of(any_dtype, no_generator(), _randint_support),
)
def _lower_randint(ctx: LoweringContext, *args: object, **_: object) -> Value:
    low, high = _randint_range(ctx.node)
    return ctx.emit.convert(int_draw(ctx, ctx.out_shape, low, high), ctx.out_dtype)


@lowering(
    aten.random.default,
    aten.random.to,
    getattr(aten.random, "from"),  # `from` is a Python keyword
    supports=all_of(any_dtype, no_generator(), _random_support),
)
def _lower_random(ctx: LoweringContext, *args: object, **_: object) -> Value:
    low, high = _random_range(ctx.node)
    return ctx.emit.convert(int_draw(ctx, ctx.out_shape, low, high), ctx.out_dtype)


# ---- float draws -----------------------------------------------------------------------------
@lowering(
    aten.rand.generator,
    supports=all_of(dtypes_in(*FLOATS, torch.bool), no_generator()),
)
def _lower_rand_generator(ctx: LoweringContext, *args: object, **_: object) -> Value:
    u = ctx.emit.convert(uniform(ctx, ctx.out_shape), ctx.out_dtype)
    return _float_range(ctx, u, 0.0, 1.0) if ctx.out_dtype.is_floating_point else u


@lowering(
    aten.randn.generator,
    supports=all_of(dtypes_in(*FLOATS, torch.bool), no_generator()),
)
def _lower_randn_generator(ctx: LoweringContext, *args: object, **_: object) -> Value:
    return ctx.emit.convert(normal(ctx, ctx.out_shape), ctx.out_dtype)


def _uniform_width_fits(node: fx.Node) -> str | None:
    """Eager raises when ``to - from`` overflows the dtype (the draw is ``from + width * u``)."""
    low, high = arg(node, 1, "from", 0.0), arg(node, 2, "to", 1.0)
    if not isinstance(low, int | float) or not isinstance(high, int | float):
        return None
    limit = torch.finfo(node.meta["val"].dtype).max
    return (
        None
        if float(high) - float(low) <= limit
        else "to - from overflows the dtype (eager raises)"
    )


@lowering(
    aten.uniform.default,
    supports=all_of(
        floats,
        no_generator(),
        scalar_args_ok(
            (1, "from", math.isfinite, "not finite"), (2, "to", math.isfinite, "not finite")
        ),
        lambda n: (
            None
            if float(arg(n, 1, "from", 0.0)) <= float(arg(n, 2, "to", 1.0))
            else "from > to (eager raises)"
        ),
        _uniform_width_fits,
    ),
)
def _lower_uniform(
    ctx: LoweringContext, x: Value, low: float = 0.0, high: float = 1.0, **_: object
) -> Value:
    dtype = ctx.out_dtype
    lo, hi = _in_dtype(low, dtype), _in_dtype(high, dtype)  # eager casts from/to to the dtype
    u = ctx.emit.convert(_scaled(ctx, uniform(ctx, x.shape), lo, hi), dtype)
    return _float_range(ctx, u, lo, hi)


@lowering(
    aten.exponential.default,
    supports=all_of(
        floats,
        no_generator(),
        scalar_args_ok((1, "lambd", lambda v: v > 0, "must be positive")),
    ),
)
def _lower_exponential(ctx: LoweringContext, x: Value, lambd: float = 1.0, **_: object) -> Value:
    """``-log(u) / lambd`` with u in (0, 1); eager's draws are positive, so is every one here
    (the floor catches a float16/bf16 rounding of a tiny draw to 0)."""
    e, dtype = ctx.emit, ctx.out_dtype
    u = open_unit(ctx, x.shape)
    draw = e.binary("divide", e.unary("negate", e.unary("log", u)), ctx.full_like(lambd, u))
    out = e.convert(draw, dtype)
    return e.binary("maximum", out, ctx.full_like(_above(0.0, dtype), out))


@lowering(
    aten.normal_functional.default,
    supports=all_of(
        floats,
        no_generator(),
        scalar_args_ok((2, "std", lambda v: v >= 0, "must be non-negative")),
    ),
)
def _lower_normal_functional(
    ctx: LoweringContext, x: Value, mean: float = 0.0, std: float = 1.0, **_: object
) -> Value:
    e = ctx.emit
    z = normal(ctx, x.shape)
    z = e.binary("add", e.binary("multiply", z, ctx.full_like(std, z)), ctx.full_like(mean, z))
    return e.convert(z, ctx.out_dtype)


@lowering(aten.bernoulli.Tensor, supports=all_of(any_dtype, no_generator()))
def _lower_bernoulli_tensor(ctx: LoweringContext, x: Value, p: Value, **_: object) -> Value:
    """``u < p`` with p broadcast to ``x``'s shape, as eager's ``bernoulli_tensor_cpu_kernel``."""
    e = ctx.emit
    prob = ctx.broadcast_to(e.convert(p, F32), x.shape)
    return e.convert(e.compare(uniform(ctx, x.shape), prob, "LT"), ctx.out_dtype)


# ---- multinomial -----------------------------------------------------------------------------
@lowering(
    aten.multinomial.default,
    supports=all_of(dtypes_in(*FLOATS, INDEX), no_generator(), _multinomial_support),
)
def _lower_multinomial(
    ctx: LoweringContext, probs: Value, num_samples: int, replacement: bool = False, **_: object
) -> Value:
    e = ctx.emit
    rows, n = (probs.shape[0] if probs.rank == 2 else 1), probs.shape[-1]
    p = e.reshape(e.convert(probs, F32), (rows, n))
    if replacement:
        out = _multinomial_with_replacement(ctx, p, num_samples)
    else:
        # Exponential race in log form: log p - log E is -inf for p == 0, so a zero category
        # sorts after every positive one (and is drawn only where eager raises instead).
        log_e = e.unary("log", e.unary("negate", e.unary("log", open_unit(ctx, (rows, n)))))
        keys = e.binary("subtract", e.unary("log", p), log_e)
        _, order = sort_with_indices(ctx, keys, 1, descending=True)
        out = e.slice(order, [0, 0], [rows, num_samples], [1, 1])
    return e.convert(e.reshape(out, ctx.out_shape), ctx.out_dtype)


def _multinomial_with_replacement(ctx: LoweringContext, p: Value, samples: int) -> Value:
    """Inverse CDF: the first category whose cumulative mass exceeds ``u * total``."""
    e = ctx.emit
    rows, n = p.shape
    (cdf,) = scan(ctx, [p], [e.scalar(0.0, F32)], 1, lambda a, b: [e.binary("add", a, b)])
    total = e.slice(cdf, [0, n - 1], [rows, n], [1, 1])  # (rows, 1)
    t = e.binary(
        "multiply",
        uniform(ctx, (rows, samples)),
        e.broadcast_in_dim(total, (rows, samples), (0, 1)),
    )
    cube = (rows, samples, n)
    below = e.compare(
        e.broadcast_in_dim(cdf, cube, (0, 2)), e.broadcast_in_dim(t, cube, (0, 1)), "LE"
    )
    first = e.reduce_simple(e.convert(below, INDEX), 0, [2], "add")  # (rows, samples)
    # The first category at or after `first` with positive probability: rounding in the
    # cumulative sum can neither pick a zero category nor run past the last positive one.
    positive = e.compare(p, e.full(0.0, (rows, n), F32), "GT")
    category = e.iota(cube, 2, INDEX)
    eligible = e.binary(
        "and",
        e.broadcast_in_dim(positive, cube, (0, 2)),
        e.compare(category, e.broadcast_in_dim(first, cube, (0, 1)), "GE"),
    )
    nxt = e.reduce_simple(e.select(eligible, category, e.full(n, cube, INDEX)), n, [2], "minimum")
    last = e.reduce_simple(
        e.select(positive, e.iota((rows, n), 1, INDEX), e.full(0, (rows, n), INDEX)),
        0,
        [1],
        "maximum",
    )
    past_end = e.compare(nxt, e.full(n, (rows, samples), INDEX), "EQ")
    return e.select(past_end, e.broadcast_in_dim(last, (rows, samples), (0,)), nxt)


# ---- randperm --------------------------------------------------------------------------------
def _randperm_support(node: fx.Node) -> str | None:
    n = int(node.args[0])  # type: ignore[arg-type]
    if n < 0:
        return "randperm of a negative count (eager raises)"
    if n > 1 << 24 or n - 1 > _int_bounds(_out_dtype(node))[1]:
        return f"randperm({n}) does not fit {_out_dtype(node)} or is too large to sort"
    return None


@lowering(
    aten.randperm.default,
    aten.randperm.generator,
    supports=all_of(any_dtype, no_generator(), _randperm_support),
)
def _lower_randperm(ctx: LoweringContext, n: int, *_: object, **__: object) -> Value:
    """``0..n-1`` sorted by 64 random bits per position: every permutation equally likely (up to
    a 64-bit key collision, which the stable sort resolves by position)."""
    e = ctx.emit
    if n == 0:
        return e.full(0, (0,), ctx.out_dtype)
    w0, w1 = random_words(ctx, n)

    def before(a0: Value, b0: Value, a1: Value, b1: Value, ai: Value, bi: Value) -> list[Value]:
        del ai, bi
        tie = e.binary("and", e.compare(a0, b0, "EQ"), e.compare(a1, b1, "LT"))
        return [e.binary("or", e.compare(a0, b0, "LT"), tie)]

    perm = e.sort([w0, w1, e.iota((n,), 0, INDEX)], 0, before, is_stable=True)[2]
    return e.convert(perm, ctx.out_dtype)


# ---- rrelu ------------------------------------------------------------------------------------
def _rrelu_support(node: fx.Node) -> str | None:
    lower, upper = float(arg(node, 2, "lower", 0.125)), float(arg(node, 3, "upper", 1 / 3))
    if bool(arg(node, 4, "training", False)) and lower > upper:
        return "training rrelu with lower > upper (eager raises)"
    return None


def _rrelu_backward_support(node: fx.Node) -> str | None:
    lower, upper = float(node.args[3]), float(node.args[4])  # type: ignore[arg-type]
    training, self_is_result = bool(node.args[5]), bool(node.args[6])
    if not training and self_is_result and lower + upper < 0:
        return "in-place leaky_relu backward with a negative slope (eager raises)"
    return None


def _leaky(
    ctx: LoweringContext, x: Value, grad: Value | None, slope: float, shape: tuple[int, ...]
) -> Value:
    """``x > 0 ? v : v * slope`` for v = x (forward) or the grad (backward), in float32 and
    rounded once to the result dtype, as eager's leaky_relu kernels compute low precision."""
    e = ctx.emit
    x32 = e.convert(x, F32)
    v = x32 if grad is None else e.convert(grad, F32)
    v, x32 = ctx.broadcast_to(v, shape), ctx.broadcast_to(x32, shape)
    scaled = e.binary("multiply", v, ctx.full_like(slope, v))
    positive = e.compare(x32, ctx.full_like(0.0, x32), "GT")
    return e.select(positive, v, scaled)


@lowering(
    aten.rrelu_with_noise_functional.default,
    supports=all_of(dtypes_in(*FLOATS), no_generator(5), _rrelu_support),
)
def _lower_rrelu_with_noise_functional(
    ctx: LoweringContext,
    x: Value,
    noise: Value,
    lower: float = 0.125,
    upper: float = 1.0 / 3.0,
    training: bool = False,
    *_: object,
    **__: object,
) -> tuple[Value, Value]:
    e = ctx.emit
    out_dtype = ctx.out_type(0).dtype
    if not training:
        # Eager computes the slope in double and leaves the noise untouched.
        slope = (float(lower) + float(upper)) / 2
        return e.convert(_leaky(ctx, x, None, slope, x.shape), out_dtype), noise
    x32 = e.convert(x, F32)
    r = _scaled(ctx, uniform(ctx, x.shape), float(lower), float(upper))
    not_positive = e.compare(x32, ctx.full_like(0.0, x32), "LE")
    out = e.select(not_positive, e.binary("multiply", x32, r), x32)
    new_noise = e.select(not_positive, r, ctx.full_like(1.0, r))
    return e.convert(out, out_dtype), e.convert(new_noise, ctx.out_type(1).dtype)


@lowering(
    aten.rrelu_with_noise_backward.default,
    supports=all_of(dtypes_in(*FLOATS), _rrelu_backward_support),
)
def _lower_rrelu_with_noise_backward(
    ctx: LoweringContext,
    grad: Value,
    x: Value,
    noise: Value,
    lower: float,
    upper: float,
    training: bool,
    self_is_result: bool,
) -> Value:
    e = ctx.emit
    if training:
        # grad * noise, whatever lower and upper are (as eager's kernel)
        g, n = ctx.promote(grad, noise, dtype=F32)
        out = e.binary("multiply", g, n)
    else:
        out = _leaky(ctx, x, grad, (float(lower) + float(upper)) / 2, ctx.out_shape)
    return e.convert(out, ctx.out_dtype)
