"""Runtime asserts and range constraints: ``_assert_scalar``, ``sym_constrain_range(_for_size)``,
``_assert_async`` and their functional (dependency-token) forms.

Shapes are static, so a scalar condition or constrained size that reaches a compiled region is a
Python number (symbolic ones are data-dependent and the partitioner keeps them eager with their
producer). Such a check is decided at compile time by running eager's own kernel on the number,
so the verdict, the bounds defaults (``_for_size`` means ``[0, max]``) and the message are eager's:

- it holds: the op lowers to nothing (the functional forms return their dependency token, a
  fresh empty tensor as eager's clone of it);
- it is statically false: the support predicate rejects the node with eager's message as the
  reason. Under ``fallback="error"`` that is a compile-time ``NC101`` naming the node and the
  user's line; under ``fallback="cpu"`` the op runs eagerly and raises eager's own
  ``RuntimeError`` when the graph runs, exactly where and how eager raises it.

A **tensor** condition (``torch._assert_async(t)``, ``_functional_assert_async.msg``) depends on
the data and is kept checked: StableHLO has no runtime assertion XLA CPU could raise from, and
dropping the check would return values where eager raises (a Python ``assert`` on a tensor
becomes ``_assert_async``: users rely on it failing on bad input). So the node runs eagerly on the
CPU, a fallback whose reason says so; the graph splits around it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

from ..context import LoweringContext
from ..emit import Value
from ..registry import lowering

aten = torch.ops.aten

#: Ops whose first argument is a Python scalar decided at compile time; each is its own eager
#: check. The functional forms below check with the non-functional kernel and return a token.
_SCALAR_CHECKS: dict[Any, Any] = {
    op: op
    for op in (
        aten._assert_scalar.default,
        aten.sym_constrain_range.default,
        aten.sym_constrain_range_for_size.default,
    )
}
_FUNCTIONAL_CHECKS: dict[Any, Any] = {
    aten._functional_assert_scalar.default: aten._assert_scalar.default,
    aten._functional_sym_constrain_range.default: aten.sym_constrain_range.default,
    aten._functional_sym_constrain_range_for_size.default: (
        aten.sym_constrain_range_for_size.default
    ),
}


def _concrete(arg: Any) -> Any:
    """A Python value of ``arg`` (an FX node's value when it is a concrete number)."""
    if isinstance(arg, fx.Node):
        return arg.meta.get("val")
    return arg


def _static_check_fails(node: fx.Node) -> str | None:
    """Run eager's check on the node's concrete arguments: None if it holds, else why not."""
    target = node.target
    check = _SCALAR_CHECKS.get(target) or _FUNCTIONAL_CHECKS[target]
    # Bind by the schema's names: the functional forms take the bounds positionally and a
    # dependency token the check does not need.
    names = [a.name for a in target._schema.arguments]
    bound = {**dict(zip(names, node.args, strict=False)), **node.kwargs}  # defaults omitted
    bound = {k: _concrete(v) for k, v in bound.items() if k != "dep_token"}
    if not all(isinstance(v, (bool, int, float, str, type(None))) for v in bound.values()):
        return "the condition is not a compile-time number"
    try:
        if check is aten._assert_scalar.default:
            check(bound["self"], bound["assert_msg"])
        else:
            check(bound["size"], min=bound.get("min"), max=bound.get("max"))
    except RuntimeError as e:
        return f"the check is false for the static shapes: {e}"
    return None


def supports_static_check(node: fx.Node) -> str | None:
    """Lowerable when the check holds for the compile-time values; else eager's message."""
    why = _static_check_fails(node)
    return f"runtime assert: {why}" if why else None


@lowering(*_SCALAR_CHECKS, supports=supports_static_check)
def _lower_static_check(ctx: LoweringContext, *_: object, **__: object) -> None:
    # The support predicate proved the check holds: nothing is left to run.
    return None


@lowering(*_FUNCTIONAL_CHECKS, supports=supports_static_check)
def _lower_functional_static_check(ctx: LoweringContext, *_: object, **__: object) -> Value:
    # The new dependency token: eager returns a copy of the (empty) token it was given.
    return ctx.emit.full(0, ctx.out_shape, ctx.out_dtype)


def _tensor_condition(node: fx.Node) -> str | None:
    return (
        "runtime assert on a tensor value: StableHLO has no runtime assertion, so the check runs "
        "eagerly on the CPU to raise as eager does"
    )


# Registered so the fallback reason says why (instead of "no lowering"); the predicate always
# rejects, so the rule never runs.
@lowering(
    aten._assert_async.default,
    aten._assert_async.msg,
    aten._functional_assert_async.msg,
    supports=_tensor_condition,
)
def _lower_tensor_condition(ctx: LoweringContext, *_: object, **__: object) -> None:
    raise AssertionError("unreachable: the support predicate rejects every tensor assert")
