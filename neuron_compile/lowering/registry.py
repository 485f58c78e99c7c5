"""The lowering registry: ``@lowering(aten.op, ...)`` fills one dict keyed by ``(OpOverload, key)``.

The key is ``reference`` (the default: the rule every target can run, and the one XLA CPU runs)
or a target's own key, e.g. ``trn`` for the Trainium kernel forms (``AwsNeuron*`` custom calls,
NKI kernels). ``lookup`` tries the target's keys (``Target.lowering_keys``) before the
reference, like JAX's per-platform lowering overrides.

Every entry carries a support predicate returning ``None`` (lowerable) or a reason string; the
reason becomes the user-facing explanation (a fallback ``SplitReason``, or NC101).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch._ops import OpOverload, OpOverloadPacket

from ..errors import RegistryError
from .literals import has_element_type

Support = Callable[[fx.Node], "str | None"]
Rule = Callable[..., Any]

#: The default registry key: the rule every target can run.
REFERENCE = "reference"


def always(node: fx.Node) -> str | None:
    return None


@dataclass(frozen=True)
class Lowering:
    rule: Rule
    supports: Support
    key: str
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


def lowering(*ops: Any, key: str = REFERENCE, supports: Support = always) -> Callable[[Rule], Rule]:
    """Register ``rule`` for ``ops`` (overloads, packets, or plain callables like ``operator.getitem``)
    under registry ``key`` (``reference``, or a target's key such as ``trn``).

    A packet expands to every overload that no other rule registered explicitly, so a specific
    overload rule and a packet rule can live side by side regardless of import order.
    """

    def register(rule: Rule) -> Rule:
        for op in ops:
            explicit = not isinstance(op, OpOverloadPacket)
            for overload in _expand([op]):
                entry = _LOWERINGS.get((overload, key))
                if entry is not None and explicit and entry.explicit:
                    owner = entry.rule.__qualname__
                    raise RegistryError(f"{overload} is already lowered for {key} by {owner}")
                if entry is not None and not explicit:
                    continue  # an explicit overload rule wins over a packet expansion
                _LOWERINGS[(overload, key)] = Lowering(rule, supports, key, explicit)
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
    if not isinstance(node.target, OpOverload) or torch.int64 not in tensor_dtypes(node):
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


def lookup(node: fx.Node, keys: Iterable[str] = ()) -> Lowering | str:
    """Return the lowering for ``node``, or the reason there is none: the first rule of
    ``keys`` (a target's ``lowering_keys``) whose predicate admits the node, else the
    reference rule."""
    big = int64_value_beyond_int32(node)
    if big is not None:  # the op runs on the CPU instead
        return (
            f"int64 value {big} does not fit int32, the type int64 runs as (the 64-bit policy); "
            "the op runs eagerly on the CPU"
        )
    unrepresentable = sorted({str(d) for d in tensor_dtypes(node) if not has_element_type(d)})
    if unrepresentable:  # no rule can take or make such a value: checked once, for every rule
        return (
            f"dtype {', '.join(unrepresentable)} has no StableHLO element type; "
            "the op runs eagerly on the CPU"
        )
    reasons = []
    for key in (*keys, REFERENCE):
        entry = _LOWERINGS.get((node.target, key))
        if entry is None:
            continue
        why = entry.supports(node)
        if why is None:
            return entry
        reasons.append(why if key == REFERENCE else f"{key}: {why}")
    if reasons:
        return "; ".join(reasons)
    if isinstance(node.target, OpOverload):
        return f"no lowering registered for {node.target}"
    return f"no lowering registered for {getattr(node.target, '__name__', node.target)}"


def registered_ops(key: str = REFERENCE) -> list[str]:
    """Names of every op with a rule under ``key`` (for ``neuron-compile ops``)."""
    return sorted(str(op) for (op, k) in _LOWERINGS if k == key)


# ---- reusable support predicates -------------------------------------------------------------
# The predicates and dtype sets live in ``rules.py`` (the rule authors' toolkit); what stays here
# is what ``lookup`` itself needs.
def tensor_dtypes(node: fx.Node) -> list[torch.dtype]:
    """Dtypes of the tensor inputs and the tensor output of ``node`` (from ``meta["val"]``)."""
    dtypes = []
    for arg in node.all_input_nodes:
        val = arg.meta.get("val")
        if isinstance(val, torch.Tensor):
            dtypes.append(val.dtype)
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        dtypes.append(val.dtype)
    return dtypes
