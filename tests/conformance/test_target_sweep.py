"""The conformance harness on a trn target (``run.py --target trn2``): every compile gets the
target, a graph the legality rules reject is an ``illegal`` entry with our code, the neuronx-cc
code and the rule, and the run counts entries per rule."""

from __future__ import annotations

import functools
import json

import pytest
import torch

from tests.conformance import harness, opinfo, report, run
from tests.conformance.harness import Result, run_entry


@functools.cache
def _op_db() -> dict[str, object]:
    return {opinfo.full_name(op): op for op in opinfo.load_op_db()}


def _int_vector(op, device, dtype, requires_grad, **kwargs):
    from torch.testing._internal.opinfo.core import SampleInput

    yield SampleInput(torch.arange(4, dtype=dtype, device=device))


def _adds_a_big_int64_literal():
    """An entry whose graph holds an int64 constant beyond int32: the 64-bit policy narrows
    int64 to int32, so neuronx-cc would reject it (NCC_ESFH002); no trn form avoids it."""
    opinfo.load_op_db()  # first: registers the expecttest stand-in the imports below need
    from torch.testing._internal.common_dtype import integral_types
    from torch.testing._internal.opinfo.core import OpInfo

    def fn(x):
        return x + torch.tensor([2**40, 1, 2, 3])

    return OpInfo(
        "test_big_literal", op=fn, dtypes=integral_types(), sample_inputs_func=_int_vector
    )


@pytest.fixture
def legality_checks(monkeypatch):
    """How many graphs the trn legality rules checked (the target really reached the backend)."""
    from neuron_compile.trainium import legality

    calls = []
    original = legality.check_legality

    def counting(*args, **kwargs):
        calls.append(args[2].name)
        return original(*args, **kwargs)

    monkeypatch.setattr(legality, "check_legality", counting)
    return calls


def test_add_passes_legality_on_trn2_and_cpu_runs_no_rule(legality_checks):
    with harness.compiling_for("trn2"):
        results = run_entry(_op_db()["add"], torch.float32)
    assert [(r.phase, r.outcome) for r in results] == [("forward", "pass"), ("backward", "pass")]
    assert legality_checks and set(legality_checks) == {"trn2"}
    checked = len(legality_checks)
    assert run_entry(_op_db()["add"], torch.float32)[0].outcome == "pass"
    assert len(legality_checks) == checked  # no target: the cpu compile, options as they were


def test_a_rejected_graph_is_illegal_with_our_code_the_ncc_code_and_the_rule():
    op = _adds_a_big_int64_literal()
    with harness.compiling_for("trn2"):
        fwd = run_entry(op, torch.int64)[0]
    assert fwd.outcome == "illegal", fwd
    assert fwd.reason.startswith("NC503 NCC_ESFH002 int64: "), fwd.reason
    assert "1099511627776" in fwd.reason
    assert run_entry(op, torch.int64)[0].outcome != "illegal"  # cpu has no legality rules


def test_expectations_do_not_hide_a_legality_rejection():
    """int32 ``mm`` has no integer datapath on Trainium (NCC_EVRF035): it stays ``illegal``
    even when expectations.toml lists the entry (those are the cpu target's failures)."""
    xfail = [{"op": "mm", "dtype": "int32", "reason": "listed"}]
    with harness.compiling_for("trn2"):
        fwd = run_entry(_op_db()["mm"], torch.int32, expectations=xfail)[0]
    assert fwd.outcome == "illegal"
    assert fwd.reason.startswith("NC504 NCC_EVRF035 integer_datapath: "), fwd.reason


def test_run_prints_the_rules_and_writes_the_summary_json(tmp_path, capsys):
    path = tmp_path / "trn2.json"
    argv = ["--target", "trn2", "--ops", "mm", "--dtypes", "int32", "--quiet"]
    assert run.main([*argv, "--summary-json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "NCC_EVRF035" in out and "NC504 integer_datapath" in out and "mm[int32]" in out
    summary = json.loads(path.read_text())
    assert summary["target"] == "trn2"
    assert summary["totals"]["int32"]["illegal"] == 1
    assert [(r["ncc_code"], r["entries"]) for r in summary["rules"]] == [
        ("NCC_EVRF035", ["mm[int32]"])
    ]
    with pytest.raises(SystemExit):
        run.main(["--target", "no-such-target", "--ops", "mm"])


def _illegal(op: str, reason: str, phase: str = "forward", variant: str = "") -> Result:
    return Result(op, variant, "float32", phase, "illegal", reason)


def _rows() -> list[Result]:
    evrf019 = "NC511 NCC_EVRF019 reduce_window: graph g is not legal for trn2: two operands"
    return [
        Result("a", "", "float32", "forward", "pass"),
        Result("a", "", "float32", "backward", "pass"),
        _illegal("pool", "NC511 NCC_EVRF017 reduce_window: dilation (aten.x) [also NCC_EVRF010]"),
        Result("pool", "", "float32", "backward", "skip", "forward did not run"),
        _illegal("sort", evrf019),
        Result("max", "binary", "float32", "forward", "pass"),  # forward passes, backward not
        _illegal("max", evrf019, phase="backward", variant="binary"),
        Result(
            "conv", "", "float32", "forward", "illegal", "NC510 NCC_EVRF010 convolution_form: x"
        ),
        Result("gone", "", "float32", "forward", "fallback", "fell back: aten.y: no lowering"),
        Result("rng", "", "float32", "forward", "skip", "random output: eager depends on the seed"),
    ]


def test_rule_summary_counts_entries_per_rule_with_their_names():
    summary = report.rule_summary(_rows(), "trn2")
    rules = [
        (r["ncc_code"], r["code"], r["rule"], r["count"], r["entries"]) for r in summary["rules"]
    ]
    assert rules == [
        ("NCC_EVRF019", "NC511", "reduce_window", 2, ["max.binary[float32]", "sort[float32]"]),
        ("NCC_EVRF010", "NC510", "convolution_form", 1, ["conv[float32]"]),
        ("NCC_EVRF017", "NC511", "reduce_window", 1, ["pool[float32]"]),
    ]
    assert summary["rules"][2]["also"] == {"NCC_EVRF010": ["pool[float32]"]}
    totals = summary["totals"]["float32"]
    assert (totals["pass"], totals["illegal"], totals["fallback"], totals["skip"]) == (1, 4, 1, 1)
    assert summary["entries"]["max.binary[float32]"]["outcome"] == "illegal"
    text = report.format_rule_summary(summary)
    assert "NCC_EVRF019   NC511 reduce_window" in text and "max.binary[float32], sort" in text
    assert "also NCC_EVRF010 (1): pool[float32]" in text
    assert "pass 1, illegal 4, fallback 1, mismatch 0, error 0" in text
    assert report.FALLBACK_NOTE in text


def test_two_summaries_compare_by_entry_and_an_illegal_sample_outranks_a_mismatch():
    cpu = report.rule_summary([Result("sort", "", "float32", "forward", "pass")])
    trn2 = report.rule_summary(_rows(), "trn2")
    assert report.compare_summaries(cpu, trn2) == [
        "sort[float32]: pass -> illegal (NC511 NCC_EVRF019 reduce_window: graph g is not legal "
        "for trn2: two operands)"
    ]
    merged = harness._merge(
        [
            Result("s", "", "float32", "forward", "mismatch", "output 0 differs"),
            _illegal("s", "NC511 NCC_EVRF019 reduce_window: x"),
            Result("s", "", "float32", "forward", "pass"),
        ]
    )
    assert merged.outcome == "illegal"


def test_illegal_column_only_where_a_run_has_illegal_entries():
    rejected = {r.op for r in _rows() if r.outcome == "illegal"}
    cpu_rows = [r for r in _rows() if r.op not in rejected]
    assert "illegal" not in report.format_table(report.summarize(cpu_rows))
    assert "illegal" not in report.summarize(cpu_rows)["float32"].as_dict()
    assert "illegal" not in report.markdown(cpu_rows, command="x", meta={})
    md = report.markdown(_rows(), command="x", meta={})
    assert "| mismatch | illegal | error |" in md
    assert "- **illegal** — NC511 NCC_EVRF019 reduce_window (2): `max.binary`, `sort`" in md
    assert "illegal" in report.format_table(report.summarize(_rows())).splitlines()[0]
