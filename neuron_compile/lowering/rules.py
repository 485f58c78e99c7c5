"""The toolkit rule authors write lowering rules with.

A rule file under ``stablehlo/`` holds rules; everything two families need lives here, once:

- dtype sets, the index dtype and the support predicates (``supports=`` of ``@lowering``),
- arithmetic shorthand over one emitter (``Ops``) and the Horner evaluator,
- the opmath wrappers: low-precision floats compute in float32 and round once, as eager does,
- table registrars in the spirit of Inductor's ``register_pointwise``: one line per op for the
  dozens of elementwise ops that differ only in their StableHLO op name or formula.

Names defined elsewhere are not re-exported: ``lowering`` stays in ``registry``,
``LoweringContext`` in ``context`` and ``Value`` in ``emit``, so each name has one home to find and
``registry``/``context`` import without the toolkit (which is built on them).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx
from torch._ops import OpOverload, OpOverloadPacket
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as Kind

from .context import LoweringContext, canonical_dtype
from .emit import Value
from .literals import is_unsigned
from .registry import Support, lowering, tensor_dtypes

Operand = Value | int | float | bool
Formula = Callable[["Ops", Value], Value]
BinaryFormula = Callable[["Ops", Value, Value], Value]

# ---- dtypes ----------------------------------------------------------------------------------
#: Floating dtypes a rule may see (float64 runs as float32 under the 64-bit policy).
FLOATS = (torch.float32, torch.bfloat16, torch.float16)
#: Integer dtypes a rule may see (int64 runs as int32 under the 64-bit policy).
INTS = (torch.int32, torch.int16, torch.int8, torch.uint8)
ALL_DTYPES = FLOATS + INTS + (torch.bool,)
#: The dtype of index tensors inside a lowered graph: int64 indices run as int32.
INDEX = torch.int32


# ---- support predicates ----------------------------------------------------------------------
def dtypes_in(*allowed: torch.dtype) -> Support:
    """Supported when every tensor input and the output has one of ``allowed`` (64-bit types are
    checked after the 64-bit policy maps them to 32-bit)."""
    allowed_set = set(allowed)

    def check(node: fx.Node) -> str | None:
        bad = sorted({str(d) for d in tensor_dtypes(node) if canonical_dtype(d) not in allowed_set})
        return f"dtype {', '.join(bad)} not supported" if bad else None

    check.__name__ = "dtypes_in(" + ", ".join(str(d) for d in allowed) + ")"
    return check


#: Every dtype a rule may see. Rules whose math is floating (exp, erf, atan2, ...) admit integers
#: and bool too: PyTorch promotes those to float, and ``float_unary``/``float_binary`` do the same.
any_dtype = dtypes_in(*ALL_DTYPES)
#: The floating dtypes only.
floats = dtypes_in(*FLOATS)
#: float32 only (the linear-algebra rules and the bit-level float rules).
float32_only = dtypes_in(torch.float32)
#: Floats and integers (no bool): integer matmul, convolution and pooling on the CPU target.
floats_and_ints = dtypes_in(*FLOATS, *INTS)


def all_of(*checks: Support) -> Support:
    """Supported when every check is: the first reason wins."""

    def check(node: fx.Node) -> str | None:
        for c in checks:
            reason = c(node)
            if reason:
                return reason
        return None

    return check


def arg(node: fx.Node, index: int, name: str, default: Any = None) -> Any:
    """Argument ``name`` (position ``index``) of ``node``, by keyword or position."""
    if name in node.kwargs:
        return node.kwargs[name]
    return node.args[index] if index < len(node.args) else default


# ---- scalar helpers --------------------------------------------------------------------------
def normalize_dim(d: int, rank: int) -> int:
    """A torch ``dim`` argument (negative counts from the end) as a non-negative axis."""
    return d + rank if d < 0 else d


def minmax_init(dtype: torch.dtype, largest: bool) -> float | int | bool:
    """The identity of a max (``largest``) or min reduction over ``dtype``."""
    if dtype == torch.bool:
        return not largest
    if dtype.is_floating_point:
        return -math.inf if largest else math.inf
    info = torch.iinfo(dtype)
    return info.min if largest else info.max


# ---- arithmetic shorthand --------------------------------------------------------------------
class Ops:
    """Scalar-broadcasting arithmetic shorthand over one emitter (keeps formulas readable).

    Python numbers become constants shaped and typed like ``like``; an unknown attribute is the
    unary StableHLO op of that name (``o.sqrt(x)``, ``o.log_plus_one(x)``).
    """

    def __init__(self, ctx: LoweringContext, like: Value) -> None:
        self.ctx, self.e, self.like = ctx, ctx.emit, like

    def c(self, value: float) -> Value:
        return self.ctx.full_like(value, self.like)

    def add(self, a: Value, b: Value | float) -> Value:
        return self.e.binary("add", a, b if isinstance(b, Value) else self.c(b))

    def sub(self, a: Value | float, b: Value | float) -> Value:
        a = a if isinstance(a, Value) else self.c(a)
        return self.e.binary("subtract", a, b if isinstance(b, Value) else self.c(b))

    def mul(self, a: Value, b: Value | float) -> Value:
        return self.e.binary("multiply", a, b if isinstance(b, Value) else self.c(b))

    def div(self, a: Value | float, b: Value) -> Value:
        return self.e.binary("divide", a if isinstance(a, Value) else self.c(a), b)

    def lt(self, a: Value, b: float) -> Value:
        return self.e.compare(a, self.c(b), "LT")

    def eq(self, a: Value, b: Value | float) -> Value:
        return self.e.compare(a, b if isinstance(b, Value) else self.c(b), "EQ")

    def and_(self, a: Value, b: Value) -> Value:
        return self.e.binary("and", a, b)

    def or_(self, a: Value, b: Value) -> Value:
        return self.e.binary("or", a, b)

    def isfinite(self, x: Value) -> Value:
        """``|x| < inf`` (not ``stablehlo.is_finite``, which the rules were written without)."""
        return self.e.compare(self.abs(x), self.c(math.inf), "LT")

    def __getattr__(self, hlo: str) -> Callable[[Value], Value]:
        return lambda x: self.e.unary(hlo, x)


def one_minus_x_squared(o: Ops, x: Value) -> Value:
    """``(1 - x)(1 + x)``: no cancellation near ``|x| = 1``, unlike ``1 - x * x``."""
    return o.mul(o.sub(1.0, x), o.add(x, 1.0))


def polynomial(ctx: LoweringContext, x: Value, coefficients: Sequence[float]) -> Value:
    """Horner evaluation, highest degree first: the one polynomial evaluator of the rules."""
    e = ctx.emit
    acc = ctx.full_like(coefficients[0], x)
    for c in coefficients[1:]:
        acc = e.binary("add", e.binary("multiply", acc, x), ctx.full_like(c, x))
    return acc


def chbevl(o: Ops, x: Value, coeffs: Sequence[float]) -> Value:
    """Cephes ``chbevl``: Clenshaw's recurrence for a Chebyshev series, highest degree first (the
    Cephes Bessel approximations are written as such series)."""
    b0, b1, b2 = o.c(coeffs[0]), o.c(0.0), o.c(0.0)
    for c in coeffs[1:]:
        b2, b1 = b1, b0
        b0 = o.add(o.sub(o.mul(x, b1), b2), c)
    return o.mul(o.sub(b0, b2), 0.5)


def exact_divide(ctx: LoweringContext, a: Value, b: Value) -> Value:
    """``a / b`` divided element by element, as eager's kernels divide. XLA rewrites a division
    by a constant or a broadcast value into a multiplication by its reciprocal, an ulp off in up
    to four quotients of ten: a barrier on a float divisor hides it from that rewrite."""
    if b.dtype.is_floating_point:
        b = ctx.emit.op1("optimization_barrier", [b], b.type)
    return ctx.emit.binary("divide", a, b)


# ---- opmath: compute in float32, round once --------------------------------------------------
def float_unary(ctx: LoweringContext, x: Value, body: Callable[[Value], Value]) -> Value:
    """Run ``body`` in the compute dtype (float32 for bf16/f16; int inputs become float) and
    convert to the output dtype once, as eager's opmath does (per-op rounding would drift)."""
    out = ctx.out_dtype
    (x,) = ctx.promote(x, dtype=ctx.compute_dtype(out))
    return ctx.emit.convert(body(x), out)


def float_binary(ctx: LoweringContext, a: Operand, b: Operand, fn: BinaryFormula) -> Value:
    """``float_unary`` for two operands, broadcast together; ``fn`` gets ``Ops`` over them."""
    out = ctx.out_dtype
    a, b = ctx.promote(a, b, dtype=ctx.compute_dtype(out))
    return ctx.emit.convert(fn(Ops(ctx, a), a, b), out)


def arith(
    ctx: LoweringContext,
    hlo: str,
    a: Operand,
    b: Operand,
    kind: Kind = Kind.DEFAULT,
    opmath_scalars: bool = False,
) -> Value:
    """Binary StableHLO op ``hlo`` on promoted, broadcast operands, converted to the out dtype
    (``opmath_scalars``: ``LoweringContext.promote``)."""
    a, b = ctx.promote(a, b, kind=kind, opmath_scalars=opmath_scalars)
    return ctx.emit.convert(ctx.emit.binary(hlo, a, b), ctx.out_dtype)


# ---- table registrars ------------------------------------------------------------------------
#: Rounding is the identity on integers (StableHLO's rounding ops take floats only).
_ROUNDING = frozenset({"floor", "ceil", "round_nearest_even"})


def _named(rule: Callable[..., Value], name: str) -> None:
    """Give a generated rule the name a hand-written one would have (it shows in errors)."""
    rule.__name__ = rule.__qualname__ = f"_lower_{name}"


def unary(
    op: OpOverloadPacket, hlo: str, *, supports: Support = any_dtype, opmath: bool = False
) -> None:
    """``op.default`` is the unary StableHLO op ``hlo``.

    ``opmath``: a floating function computed in float32 for low-precision and integer inputs and
    rounded once (exp, tanh, ...); otherwise the op keeps its dtype (neg, abs, floor, ...).
    """

    @lowering(op.default, supports=supports)
    def rule(ctx: LoweringContext, x: Value) -> Value:
        if opmath:
            return float_unary(ctx, x, lambda v: ctx.emit.unary(hlo, v))
        if hlo in _ROUNDING and not x.dtype.is_floating_point:
            return x
        if hlo == "abs" and is_unsigned(x.dtype):  # stablehlo.abs takes signed types only
            return x
        return ctx.emit.unary(hlo, x)

    _named(rule, op.__name__)


def unary_formula(op: OpOverload, fn: Formula, *, supports: Support = any_dtype) -> None:
    """``op`` is the float formula ``fn(Ops, x)``, computed in float32 and rounded once (the
    functions StableHLO has no op for: asinh, erfinv, lgamma, the Bessel functions, ...)."""

    @lowering(op, supports=supports)
    def rule(ctx: LoweringContext, x: Value) -> Value:
        return float_unary(ctx, x, lambda v: fn(Ops(ctx, v), v))

    _named(rule, op.__name__.split(".")[0])


def binary_formula(
    ops: OpOverload | Sequence[OpOverload],
    fn: BinaryFormula,
    *,
    name: str | None = None,
    supports: Support = any_dtype,
) -> None:
    """``ops`` are the float formula ``fn(Ops, a, b)`` over two operands promoted and broadcast
    together, computed in float32 and rounded once (atan2, igamma, the orthogonal polynomials).
    ``name`` names the rule (default: the first overload's op name)."""
    ops = [ops] if isinstance(ops, OpOverload) else list(ops)

    @lowering(*ops, supports=supports)
    def rule(ctx: LoweringContext, a: Any, b: Any) -> Value:
        return float_binary(ctx, a, b, fn)

    _named(rule, name or ops[0].__name__.split(".")[0])


def binary(
    op: OpOverloadPacket,
    hlo: str,
    *,
    overloads: Sequence[str] = ("Tensor", "Scalar"),
    logical: bool = False,
    supports: Support = any_dtype,
) -> None:
    """The listed overloads of ``op`` are the binary StableHLO op ``hlo`` on promoted operands.

    ``logical``: the operands are truthiness, converted to bool first (logical_and, ...).
    """

    @lowering(*(getattr(op, name) for name in overloads), supports=supports)
    def rule(ctx: LoweringContext, a: Any, b: Any) -> Value:
        if logical:
            a, b = ctx.promote(a, b, dtype=torch.bool)
            return ctx.emit.binary(hlo, a, b)
        return arith(ctx, hlo, a, b)

    _named(rule, op.__name__)


def compare(op: OpOverloadPacket, direction: str, *, supports: Support = any_dtype) -> None:
    """``op.Tensor`` and ``op.Scalar`` are ``stablehlo.compare`` with ``direction`` (EQ, LT, ...)
    on operands promoted to their common dtype."""

    @lowering(op.Tensor, op.Scalar, supports=supports)
    def rule(ctx: LoweringContext, a: Any, b: Any) -> Value:
        a, b = ctx.promote(a, b)
        return ctx.emit.compare(a, b, direction)

    _named(rule, op.__name__)
