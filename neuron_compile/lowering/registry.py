"""The lowering registry: ``@lowering(aten.op, ...)`` fills one dict keyed by ``(OpOverload, target)``.

Every entry carries a support predicate returning ``None`` (lowerable) or a reason string; the
reason becomes the user-facing explanation (NC101 today, a fallback ``SplitReason`` once the
partitioner lands). Lookup prefers the ``nki`` target over the ``stablehlo`` default, like JAX's
per-platform lowering overrides.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch._ops import OpOverload, OpOverloadPacket

from ..errors import RegistryError

Support = Callable[[fx.Node], "str | None"]
Rule = Callable[..., Any]

TARGETS = ("nki", "stablehlo")  # lookup order


def always(node: fx.Node) -> str | None:
    return None


@dataclass(frozen=True)
class Lowering:
    rule: Rule
    supports: Support
    target: str
    explicit: bool = True  # False when registered through an OpOverloadPacket expansion


_LOWERINGS: dict[tuple[Any, str], Lowering] = {}


def _expand(ops: Iterable[Any]) -> list[Any]:
    out: list[Any] = []
    for op in ops:
        if isinstance(op, OpOverloadPacket):
            out.extend(getattr(op, name) for name in op.overloads())
        else:
            out.append(op)
    return out


def lowering(
    *ops: Any, target: str = "stablehlo", supports: Support = always
) -> Callable[[Rule], Rule]:
    """Register ``rule`` for ``ops`` (overloads, packets, or plain callables like ``operator.getitem``).

    A packet expands to every overload that no other rule registered explicitly, so a specific
    overload rule and a packet rule can live side by side regardless of import order.
    """

    def register(rule: Rule) -> Rule:
        for op in ops:
            explicit = not isinstance(op, OpOverloadPacket)
            for overload in _expand([op]):
                key = (overload, target)
                entry = _LOWERINGS.get(key)
                if entry is not None and explicit and entry.explicit:
                    owner = entry.rule.__qualname__
                    raise RegistryError(f"{overload} is already lowered for {target} by {owner}")
                if entry is not None and not explicit:
                    continue  # an explicit overload rule wins over a packet expansion
                _LOWERINGS[key] = Lowering(rule, supports, target, explicit)
        return rule

    return register


#: The int32 range int64 is narrowed to (the 64-bit policy).
INT32 = (-(2**31), 2**31 - 1)
#: Schema types of value arguments: a Python int there becomes a constant of the op's dtype
#: (sizes, dims and slice bounds are ``int``/``int[]`` and may hold INT64_MAX as "to the end").
_VALUE_TYPES = {"Tensor", "Optional[Tensor]", "number", "Optional[number]"}


def int64_value_beyond_int32(node: fx.Node) -> int | None:
    """A Python int value argument outside int32 of an op on int64 (it would become an
    out-of-range int32 constant under the 64-bit policy), else None."""
    if not isinstance(node.target, OpOverload) or torch.int64 not in _tensor_dtypes(node):
        return None
    schema = node.target._schema.arguments
    named = {a.name: a for a in schema}
    positional = zip(schema, node.args, strict=False)  # trailing defaults may be omitted
    pairs = [*positional, *((named.get(k), v) for k, v in node.kwargs.items())]
    for arg, value in pairs:
        if (
            type(value) is int
            and arg is not None
            and str(arg.type) in _VALUE_TYPES
            and not INT32[0] <= value <= INT32[1]
        ):
            return value
    return None


def lookup(node: fx.Node) -> Lowering | str:
    """Return the lowering for ``node``, or the reason there is none."""
    big = int64_value_beyond_int32(node)
    if big is not None:  # the op runs on the CPU instead
        return (
            f"int64 value {big} does not fit int32, the type int64 runs as (the 64-bit policy); "
            "the op runs eagerly on the CPU"
        )
    reasons = []
    for target in TARGETS:
        entry = _LOWERINGS.get((node.target, target))
        if entry is None:
            continue
        why = entry.supports(node)
        if why is None:
            return entry
        reasons.append(f"{target}: {why}")
    if reasons:
        return "; ".join(reasons)
    if isinstance(node.target, OpOverload):
        return f"no lowering registered for {node.target}"
    return f"no lowering registered for {getattr(node.target, '__name__', node.target)}"


def registered_ops(target: str = "stablehlo") -> list[str]:
    """Names of every op with a rule for ``target`` (for ``neuron-compile ops``)."""
    return sorted(str(op) for (op, t) in _LOWERINGS if t == target)


# ---- reusable support predicates -------------------------------------------------------------
def _tensor_dtypes(node: fx.Node) -> list[torch.dtype]:
    dtypes = []
    for arg in node.all_input_nodes:
        val = arg.meta.get("val")
        if isinstance(val, torch.Tensor):
            dtypes.append(val.dtype)
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        dtypes.append(val.dtype)
    return dtypes


def dtypes_in(*allowed: torch.dtype) -> Support:
    """Supported when every tensor input and the output has one of ``allowed`` (64-bit types are
    checked after the 64-bit policy maps them to 32-bit)."""
    from .context import canonical_dtype

    allowed_set = set(allowed)

    def check(node: fx.Node) -> str | None:
        bad = sorted(
            {str(d) for d in _tensor_dtypes(node) if canonical_dtype(d) not in allowed_set}
        )
        return f"dtype {', '.join(bad)} not supported" if bad else None

    check.__name__ = "dtypes_in(" + ", ".join(str(d) for d in allowed) + ")"
    return check


FLOATS = (torch.float32, torch.bfloat16, torch.float16)
INTS = (torch.int32, torch.int16, torch.int8, torch.uint8)
ALL_DTYPES = FLOATS + INTS + (torch.bool,)
