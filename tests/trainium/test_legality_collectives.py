"""Collective legality (``trainium/legality_collectives.py``) on hand-written StableHLO modules
of the form the collective lowering emits, each verified by jaxlib first. The tests do not
depend on that lowering: the op/dtype table, the replica-group partition (NC514) and the
warnings for the constraints only a third-party source states."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from neuron_compile import artifact, errors
from neuron_compile.lowering.lower_graph import LoweredGraph
from neuron_compile.targets import get_target
from neuron_compile.trainium import legality, legality_collectives
from neuron_compile.trainium.legality import check_legality, find_violations
from neuron_compile.trainium.legality_base import info
from neuron_compile.trainium.legality_collectives import (
    SOURCE_3P,
    CollectiveConstraintWarning,
    partition_problem,
)

TRN2, TRN3 = get_target("trn2"), get_target("trn3")
ANY_GM = make_fx(lambda x: x + 1, tracing_mode="fake")(torch.ones(4))
_CHANNEL = "channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>"


@pytest.fixture(autouse=True)
def _fresh_warnings():
    """Each test sees the one-per-graph warning afresh."""
    legality_collectives._WARNED.clear()
    yield
    legality_collectives._WARNED.clear()


def _dense(groups: list[list[int]]) -> str:
    width = max(len(g) for g in groups)
    padded = [g + [-1] * (width - len(g)) for g in groups]  # XLA pads short groups with -1
    return f"dense<{padded}> : tensor<{len(groups)}x{width}xi64>"


def _module(world: int, arg: str, result: str, op: str) -> str:
    """A verified module over ``world`` replicas whose one op ``%r = ...`` maps ``%arg0``."""
    text = f"""module @neuron_graph attributes {{mhlo.num_partitions = 1 : i32, \
mhlo.num_replicas = {world} : i32}} {{
  func.func public @main(%arg0: {arg}) -> {result} {{
{op}
    return %r : {result}
  }}
}}
"""
    artifact.verify(text)
    return text


def _all_reduce(groups: list[list[int]], world: int, element: str = "f32") -> str:
    t = f"tensor<4x8x{element}>"
    return _module(
        world,
        t,
        t,
        f'    %r = "stablehlo.all_reduce"(%arg0) ({{\n'
        f"    ^bb0(%a: tensor<{element}>, %b: tensor<{element}>):\n"
        f"      %s = stablehlo.add %a, %b : tensor<{element}>\n"
        f"      stablehlo.return %s : tensor<{element}>\n"
        f"    }}) {{{_CHANNEL}, replica_groups = {_dense(groups)}}} : ({t}) -> {t}",
    )


def _all_gather(groups: list[list[int]], world: int, element: str = "f32") -> str:
    n = len(groups[0])
    src, dst = f"tensor<4x{element}>", f"tensor<{4 * n}x{element}>"
    return _module(
        world,
        src,
        dst,
        f'    %r = "stablehlo.all_gather"(%arg0) {{all_gather_dim = 0 : i64, {_CHANNEL}, '
        f"replica_groups = {_dense(groups)}}} : ({src}) -> {dst}",
    )


def _lowered(text: str) -> LoweredGraph:
    return LoweredGraph(text=text, inputs=[], outputs=[], num_results=0)


def _check(text: str, target=TRN2, **kw) -> tuple[list, list[warnings.WarningMessage]]:
    """(violations, CollectiveConstraintWarnings) of one legality check."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = find_violations(ANY_GM, _lowered(text), target, **kw)
    return found, [w for w in caught if issubclass(w.category, CollectiveConstraintWarning)]


def _codes(found) -> list[tuple[str, str, str]]:
    return [(v.error.code, v.ncc_code, v.rule) for v in found]


# -- the rules are wired in ------------------------------------------------------------------


def test_collective_rules_run_with_every_trn_legality_check():
    names = {info(rule).rule for rule in legality_collectives.RULES}
    assert names == {"collective_support", "replica_groups", "collective_constraints"}
    assert all(rule in legality.RULES for rule in legality_collectives.RULES)
    assert {"collective_support", "replica_groups"} <= set(legality.HINTS)


# -- replica groups partition the world ------------------------------------------------------


@pytest.mark.parametrize("groups", [[[0, 1], [2, 3]], [[0, 2], [1, 3]], [[0, 1, 2, 3]]])
def test_a_partition_of_four_ranks_passes(groups):
    found, _ = _check(_all_reduce(groups, world=4))
    assert found == []


def test_a_group_missing_a_rank_fails():
    found, _ = _check(_all_reduce([[0, 1]], world=4))
    assert _codes(found) == [("NC514", "NCC_EVRF064", "replica_groups")]
    assert "rank 2 of the world of 4 ranks is in no group" in found[0].message


def test_unequal_groups_fail():
    # [[0, 1], [2]] is legal StableHLO for an all-reduce (XLA pads the short group with -1)
    found, _ = _check(_all_reduce([[0, 1], [2]], world=3))
    assert _codes(found) == [("NC514", "NCC_EVRF064", "replica_groups")]
    assert "unequal sizes [1, 2]" in found[0].message


def test_a_rank_past_num_replicas_fails():
    found, _ = _check(_all_reduce([[0, 1], [2, 3]], world=2))
    assert _codes(found) == [("NC514", "NCC_EVRF064", "replica_groups")]
    assert "rank 2 is outside the world of 2 ranks" in found[0].message


def test_a_rank_in_two_groups_fails():
    # StableHLO's verifier already rejects such a module, so no legality check ever sees one;
    # the partition judge rejects it on its own too.
    with pytest.raises(artifact.VerifyFailure, match="seen more than once"):
        _all_reduce([[0, 1], [1, 2]], world=3)
    assert partition_problem(((0, 1), (1, 2)), 3) == "rank 1 is in more than one group"
    assert partition_problem(((0, 1), (2,)), 3) == "the groups have unequal sizes [1, 2]"
    assert partition_problem(((0, 1), (2, 3)), 4) is None
    assert partition_problem((), 4) is None  # no groups: one group of every rank


def test_the_error_names_the_rule_code_and_what_to_do():
    text = _all_reduce([[0, 1]], world=4)
    with (
        pytest.raises(errors.CollectiveViolation) as raised,
        pytest.warns(CollectiveConstraintWarning),
    ):
        check_legality(ANY_GM, _lowered(text), TRN2, graph_name="g0")
    err = raised.value
    assert err.code == "NC514" and err.ncc_code == "NCC_EVRF064" and err.rule == "replica_groups"
    assert "graph g0" in str(err) and "DeviceMesh" in str(err)


# -- unverified constraints warn, once per graph, naming their source -------------------------


def test_groups_of_two_warn_once_naming_the_source():
    text = _all_reduce([[0, 1]], world=2)
    found, warned = _check(text)
    assert found == []
    assert len(warned) == 1
    message = str(warned[0].message)
    assert SOURCE_3P in message and "torchneuron.md §9 [3P]" in message
    assert "replica groups of size 2" in message and "unverified" in message
    again, warned_again = _check(text)  # the same graph checked again: no second warning
    assert again == [] and warned_again == []


def test_aligned_groups_do_not_warn():
    found, warned = _check(_all_reduce([[0, 1, 2, 3], [4, 5, 6, 7]], world=8))
    assert found == [] and warned == []


def test_one_warning_covers_every_collective_of_a_graph():
    t = "tensor<4x8xf32>"
    region = (
        "({\n    ^bb0(%a: tensor<f32>, %b: tensor<f32>):\n"
        "      %s = stablehlo.add %a, %b : tensor<f32>\n      stablehlo.return %s : tensor<f32>\n"
        "    })"
    )
    text = _module(
        2,
        t,
        t,
        f'    %q = "stablehlo.all_reduce"(%arg0) {region} {{{_CHANNEL}, '
        f"replica_groups = {_dense([[0, 1]])}}} : ({t}) -> {t}\n"
        f'    %r = "stablehlo.collective_permute"(%q) {{{_CHANNEL}, '
        f"source_target_pairs = {_dense([[0, 1], [1, 0]])}}} : ({t}) -> {t}",
    )
    found, warned = _check(text)
    assert found == [] and len(warned) == 1
    message = str(warned[0].message)
    assert "stablehlo.all_reduce at line 3" in message  # no FX node: the module line
    assert "collective_permute ('no send/recv/collective_permute')" in message


class _FromNode(LoweredGraph):
    """A lowered graph whose every line came from one FX node (as the emitter records)."""

    node = None

    def node_at_line(self, line: int):
        return self.node


def test_findings_name_the_fx_node_and_the_users_line():
    node = next(n for n in ANY_GM.graph.nodes if n.op == "call_function")
    node.meta["stack_trace"] = '  File "train.py", line 12, in step\n    y = all_reduce(x)\n'
    lowered = _FromNode(text=_all_reduce([[0, 1]], world=4), inputs=[], outputs=[], num_results=0)
    lowered.node = node
    with pytest.warns(CollectiveConstraintWarning, match=r"train\.py:12 in step"):
        found = find_violations(ANY_GM, lowered, TRN2)
    assert found[0].node is node
    assert found[0].message.startswith(f"%{node.name} (train.py:12 in step): replica groups")
    del node.meta["stack_trace"]


def test_collective_permute_warns_and_does_not_raise():
    t = "tensor<4x8xf32>"
    text = _module(
        4,
        t,
        t,
        f'    %r = "stablehlo.collective_permute"(%arg0) {{{_CHANNEL}, '
        f"source_target_pairs = {_dense([[0, 1], [1, 2], [2, 3], [3, 0]])}}} : ({t}) -> {t}",
    )
    found, warned = _check(text)
    assert found == []
    assert len(warned) == 1 and "no send/recv/collective_permute" in str(warned[0].message)
    check_legality(ANY_GM, _lowered(text), TRN2)  # legal: no error raised


def test_collective_broadcast_warns():
    t = "tensor<4x8xf32>"
    text = _module(
        4,
        t,
        t,
        f'    %r = "stablehlo.collective_broadcast"(%arg0) {{{_CHANNEL}, '
        f"replica_groups = {_dense([[0, 1, 2, 3]])}}} : ({t}) -> {t}",
    )
    found, warned = _check(text)
    assert found == []
    assert len(warned) == 1 and "broadcast not functional" in str(warned[0].message)


def test_a_single_replica_module_neither_fails_nor_warns():
    found, warned = _check(_all_reduce([[0]], world=1))
    assert found == [] and warned == []


# -- op and element type against the target's table --------------------------------------------


def test_f64_all_reduce_is_not_in_the_dtype_table():
    found, _ = _check(_all_reduce([[0, 1, 2, 3]], world=4, element="f64"))
    ours = [v for v in found if v.rule == "collective_support"]
    assert _codes(ours) == [("NC514", "NCC_EUOC002", "collective_support")]
    assert "stablehlo.all_reduce on f64 elements" in ours[0].message
    # the 64-bit rule reports the f64 value as well (it never reaches neuronx-cc narrowed)
    assert ("NC503", "NCC_EVRF062", "int64") in _codes(found)


def test_i64_all_gather_fails_even_with_native_int64():
    text = _all_gather([[0, 1, 2, 3]], world=4, element="i64")
    found, _ = _check(text, flags="--native-int64=enabled")
    assert _codes(found) == [("NC514", "NCC_EUOC002", "collective_support")]
    assert "i64" in found[0].message


def test_integer_all_reduce_follows_the_downcast_flag():
    text = _all_reduce([[0, 1, 2, 3]], world=4, element="i64")
    flags = "--native-int64=enabled --implicit-integer-downcast=all_reduce"
    found, _ = _check(text, flags=flags)
    assert found == []  # neuronx-cc computes it in f32, as EVRF061's page says
    found, _ = _check(text, flags="--native-int64=enabled")
    assert ("NC504", "NCC_EVRF061", "integer_collectives") in _codes(found)
    assert ("NC514", "NCC_EUOC002", "collective_support") in _codes(found)


@pytest.mark.parametrize("element", ["f32", "bf16", "f16", "i32", "ui8", "i16"])
def test_documented_element_types_pass(element):
    found, warned = _check(_all_gather([[0, 1, 2, 3]], world=4, element=element))
    assert found == [] and warned == []


def test_fp8_and_bool_collectives_warn_instead_of_failing():
    found, warned = _check(_all_gather([[0, 1, 2, 3]], world=4, element="f8E5M2"))
    assert found == [] and len(warned) == 1
    assert "f8E5M2 (no source lists it)" in str(warned[0].message)
    legality_collectives._WARNED.clear()
    found, warned = _check(_all_gather([[0, 1, 2, 3]], world=4, element="i1"))
    assert found == [] and len(warned) == 1


def test_f8e4m3fn_collectives_are_a_trn3_type():
    text = _all_gather([[0, 1, 2, 3]], world=4, element="f8E4M3FN")
    found, warned = _check(text, target=TRN3)
    assert found == [] and len(warned) == 1
    found, _ = _check(text, target=TRN2)
    assert _codes(found) == [("NC514", "NCC_EUOC002", "collective_support")]


def test_an_op_the_target_lacks_is_an_error():
    table = dataclasses.replace(TRN2.collectives, ops=frozenset({"all_reduce"}))
    narrow = dataclasses.replace(TRN2, collectives=table)
    found, _ = _check(_all_gather([[0, 1, 2, 3]], world=4), target=narrow)
    assert _codes(found) == [("NC514", "NCC_EUOC002", "collective_support")]
    assert "trn2 has no stablehlo.all_gather" in found[0].message
    assert _check(_all_gather([[0, 1, 2, 3]], world=4))[0] == []  # the real trn2 has it


def test_the_table_says_where_its_facts_come_from():
    for target in (TRN2, TRN3):
        table = target.collectives
        assert table.ops == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"}
        assert {"collective_permute", "send", "recv", "collective_broadcast"} == set(
            table.unverified_ops
        )
        assert not {"f64", "i64", "ui64"} & (table.dtypes | table.unverified_dtypes)
        assert "[3P]" in table.source and "unverified" in table.source
