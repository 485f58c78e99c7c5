"""Every pass leaves collectives alone: never evaluated, folded, merged, removed, rewritten or
reordered (issue 16: fold_constants evaluated an all_reduce of a constant at compile time).

Each row traces a small function with ``_c10d_functional`` ops on a one-rank gloo group, runs one
pass, and checks that the collectives and their waits are the same nodes, in the same order, with
the same arguments, and that the graph still computes what it computed before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
import torch.distributed._functional_collectives  # noqa: F401  (registers the legacy ops)
import torch.fx as fx
from torch.fx.experimental.proxy_tensor import make_fx

from neuron_compile.passes import (
    collapse_casts,
    eliminate_common_subexpressions,
    eliminate_dead_code,
    fold_constants,
    fold_permutes,
    functionalize_inplace,
    pipeline_for,
    remove_noops,
    run_pipeline,
    sink_transposes,
)
from neuron_compile.passes.effects import (
    COMMUNICATION_NAMESPACES,
    communicates,
    has_effects,
    is_impure,
    target_has_effects,
)
from neuron_compile.trainium.passes import rewrite_neuron_calls
from tests.distributed.group import single_rank_group
from tests.passes.graphs import count

aten = torch.ops.aten
c10d = torch.ops._c10d_functional


@pytest.fixture(scope="module")
def group() -> str:
    with single_rank_group() as name:
        yield name


def _reduced(x: torch.Tensor, group: str) -> torch.Tensor:
    return c10d.wait_tensor(c10d.all_reduce(x, "sum", group))


# ---- the functions each row traces -------------------------------------------------------------
def _mean_global(group: str) -> Callable[..., Any]:
    """The issue's reproduction, with the element count reduced as a constant tensor."""

    def fn(x):
        n = _reduced(torch.tensor(float(x.numel())), group)
        return _reduced(x.sum(), group) / n

    return fn


def _twice_reduced(group: str) -> Callable[..., Any]:
    """Two equal collectives, and an equal pure op on each side of them."""

    def fn(x):
        before = x * 2
        a = _reduced(x, group)
        b = _reduced(x, group)
        after = x * 2
        return a + b + before + after

    return fn


def _unused_collectives(group: str) -> Callable[..., Any]:
    """A collective nobody reads and a wait nobody reads: the other ranks still take part."""

    def fn(x):
        c10d.all_reduce(x, "sum", group)  # never waited on: never run (see _CASES)
        c10d.wait_tensor(c10d.all_reduce(x + 1, "sum", group))
        return x * 2

    return fn


def _in_place_into_copy(group: str) -> Callable[..., Any]:
    """A collective writes into a copy of the input: the copy is a real buffer."""

    def fn(x):
        buf = x.clone()
        out = c10d.wait_tensor(c10d.all_reduce_(buf, "sum", group))
        return out.view(x.shape) + buf

    return fn


def _in_place_into_intermediate(group: str) -> Callable[..., Any]:
    """``all_reduce_`` has a functional twin by schema; it must stay in place."""

    def fn(x):
        return c10d.wait_tensor(c10d.all_reduce_(x * 2, "sum", group))

    return fn


def _casts_around(group: str) -> Callable[..., Any]:
    def fn(x):
        return _reduced(x.float(), group).to(torch.bfloat16)

    return fn


def _permutes_around(group: str) -> Callable[..., Any]:
    """``permute(permute(x))`` would fold to ``x``: here a collective sits in between."""

    def fn(x):
        return _reduced(x.permute(1, 0), group).permute(1, 0)

    return fn


def _matmul_of_transposed(group: str) -> Callable[..., Any]:
    def fn(x, y):
        return torch.mm(_reduced(x, group).t(), y)

    return fn


def _silu_of_reduced(group: str) -> Callable[..., Any]:
    def fn(x):
        w = _reduced(x, group)
        return w * torch.sigmoid(w)

    return fn


@dataclass(frozen=True)
class _Case:
    graph_pass: Callable[[fx.GraphModule], bool]
    make: Callable[[str], Callable[..., Any]]
    inputs: Callable[[], tuple[torch.Tensor, ...]]
    #: (target, count) pairs that must hold after the pass, besides the collectives themselves
    counts: tuple[tuple[Any, int], ...] = field(default_factory=tuple)
    #: False when running the graph would leave a collective unwaited in the process
    run: bool = True


def _vec() -> tuple[torch.Tensor, ...]:
    return (torch.randn(4),)


def _mat() -> tuple[torch.Tensor, ...]:
    return (torch.randn(3, 4),)


_CASES = {
    "fold_constants": _Case(fold_constants, _mean_global, _vec),
    "eliminate_common_subexpressions": _Case(
        eliminate_common_subexpressions,
        _twice_reduced,
        _vec,
        # never hoisted across a collective: the x * 2 after it is not merged into the one before
        counts=((aten.mul.Tensor, 2),),
    ),
    "eliminate_dead_code": _Case(eliminate_dead_code, _unused_collectives, _vec, run=False),
    "remove_noops": _Case(
        remove_noops, _in_place_into_copy, _vec, counts=((aten.clone.default, 1),)
    ),
    "collapse_casts": _Case(
        collapse_casts,
        _casts_around,
        lambda: (torch.randn(4, dtype=torch.bfloat16),),
        counts=((aten._to_copy.default, 2),),
    ),
    "fold_permutes": _Case(
        fold_permutes, _permutes_around, _mat, counts=((aten.permute.default, 2),)
    ),
    "functionalize_inplace": _Case(
        functionalize_inplace,
        _in_place_into_intermediate,
        _vec,
        counts=((c10d.all_reduce_.default, 1), (c10d.all_reduce.default, 0)),
    ),
    "sink_transposes": _Case(
        sink_transposes, _matmul_of_transposed, lambda: (torch.randn(3, 4), torch.randn(3, 5))
    ),
    "rewrite_neuron_calls": _Case(rewrite_neuron_calls, _silu_of_reduced, _vec),
}


def _collectives(gm: fx.GraphModule) -> list[tuple[str, Any, tuple[Any, ...]]]:
    """Each communicating node, in graph order: name, target and arguments. A tensor argument
    counts only as "a node": a pass may feed the collective an equal value (a folded constant
    instead of the ops that made it); the numerics check covers the value."""
    return [
        (n.name, n.target, tuple(fx.node.map_arg(n.args, lambda a: "node")))
        for n in gm.graph.nodes
        if communicates(n)
    ]


def _trace(case: _Case, group: str) -> fx.GraphModule:
    return make_fx(case.make(group), tracing_mode="fake")(*case.inputs())


@pytest.mark.parametrize("name", sorted(_CASES))
def test_pass_leaves_collectives_alone(name: str, group: str) -> None:
    case = _CASES[name]
    gm = _trace(case, group)
    before = _collectives(gm)
    assert before, "the graph must contain collectives to test anything"
    case.graph_pass(gm)
    gm.graph.lint()
    gm.recompile()
    assert _collectives(gm) == before
    waits = gm.graph.find_nodes(op="call_function", target=c10d.wait_tensor.default)
    assert all(communicates(w.args[0]) for w in waits)  # each still waits on its collective
    for target, expected in case.counts:
        assert count(gm, target) == expected, (target, gm.code)
    if case.run:
        inputs = case.inputs()
        reference = _trace(case, group)(*inputs)
        torch.testing.assert_close(gm(*inputs), reference, rtol=0, atol=0)


@pytest.mark.parametrize("target", ["cpu", "trn2"])
def test_pipeline_keeps_the_issue_reproduction_exact(target: str, group: str) -> None:
    case = _CASES["fold_constants"]
    gm = _trace(case, group)
    before = _collectives(gm)
    run_pipeline(gm, pipeline_for(target))
    assert _collectives(gm) == before
    assert not any(n.op == "get_attr" and "_folded" in str(n.target) for n in gm.graph.nodes)
    (x,) = case.inputs()
    torch.testing.assert_close(gm(x), x.mean(), rtol=0, atol=1e-6)


def test_folding_never_runs_a_collective(group: str) -> None:
    """Evaluated at compile time, a collective talks to the other ranks from the compiler and
    leaves its work unwaited (the issue's "1 unwaited collective calls"): never even try."""
    from torch._C._distributed_c10d import _get_work_registry_size

    gm = _trace(_CASES["fold_constants"], group)
    pending = _get_work_registry_size()
    fold_constants(gm)
    assert _get_work_registry_size() == pending


# ---- the predicates themselves -----------------------------------------------------------------
_COMMUNICATION_OPS = [
    c10d.all_reduce.default,
    c10d.all_reduce_.default,
    c10d.wait_tensor.default,
    c10d.all_gather_into_tensor.default,
    c10d.reduce_scatter_tensor.default,
    c10d.broadcast.default,
    torch.ops._c10d_functional_autograd.all_to_all_single.default,
    torch.ops._c10d_functional_autograd.reduce_scatter_tensor.default,
    torch.ops.c10d_functional.all_reduce.default,
    torch.ops.c10d.allreduce_.default,  # by namespace, and by its ProcessGroup argument
    torch.ops._dtensor.shard_dim_alltoall.default,
    c10d.all_reduce,  # a packet as a target
]


@pytest.mark.parametrize("op", _COMMUNICATION_OPS, ids=str)
def test_communication_ops_have_effects(op: Any) -> None:
    assert target_has_effects(op)


@pytest.mark.parametrize(
    "op", [aten.add.Tensor, aten.permute.default, aten._to_copy.default, aten.mm.default], ids=str
)
def test_plain_aten_ops_have_no_effects(op: Any) -> None:
    assert not target_has_effects(op)


def test_communication_namespaces_cover_the_collective_libraries() -> None:
    assert {"_c10d_functional", "_c10d_functional_autograd", "c10d"} <= COMMUNICATION_NAMESPACES


def test_a_registered_effect_counts() -> None:
    """Ops torch knows as effectful (``torch.library`` registrations) need no name list."""
    from torch._higher_order_ops.effects import EffectType, _register_effectful_op

    lib = torch.library.Library("nc_test_registered", "FRAGMENT")  # noqa: TOR901
    for name in ("log_value", "log_twin"):
        lib.define(f"{name}(Tensor x) -> ()")
        lib.impl(name, lambda x: None, "CompositeExplicitAutograd")
    ops = torch.ops.nc_test_registered
    _register_effectful_op(ops.log_value.default, EffectType.ORDERED)
    assert target_has_effects(ops.log_value.default)
    assert not target_has_effects(ops.log_twin.default)


def test_node_predicates(group: str) -> None:
    gm = _trace(_CASES["fold_constants"], group)
    by_target = {n.target: n for n in gm.graph.nodes if n.op == "call_function"}
    for op in (c10d.all_reduce.default, c10d.wait_tensor.default):
        assert communicates(by_target[op]) and has_effects(by_target[op])
        assert is_impure(by_target[op])
    assert not has_effects(by_target[aten.sum.default])
