"""Exact records for sample models with one known defect each (tests/report/samples.py)."""

from __future__ import annotations

import os

import pytest

from tests.report import samples
from tests.report.samples import line_of

SAMPLES = os.path.abspath(samples.__file__)


def _only(report, category):
    found = [f for f in report.findings if f.category == category]
    assert len(found) == 1 or category == "graph-break", [f.message for f in found]
    return found


def test_counts_per_category(sample_run):
    report, _, _ = sample_run
    assert report.counts() == {
        "compile-error": 1,
        "eager-frame": 0,
        "mismatch": 1,
        "graph-break": 2,
        "fallback": 1,
        "recompile": 1,
        "downcast": 1,
    }
    assert report.crash is None


@pytest.mark.parametrize(
    "marker, reason_class",
    [("print", "Failed to trace builtin operator"), ("branch", "Data-dependent branching")],
)
def test_graph_breaks_have_reason_class_and_user_line(sample_run, marker, reason_class):
    report, _, _ = sample_run
    (gb,) = [
        f
        for f in report.findings
        if f.category == "graph-break" and f.location.line == line_of(marker)
    ]
    assert (gb.code, gb.location.file, gb.count) == ("NC601", SAMPLES, 1)
    assert gb.details["reason_class"] == reason_class
    assert gb.details["gb_id"].startswith("gb")


def test_fallback_names_op_count_and_line(sample_run):
    report, _, _ = sample_run
    (f,) = _only(report, "fallback")
    assert (f.code, f.details["op"], f.count) == ("NC101", "nctest.cpu_scan.default", 1)
    assert (f.location.file, f.location.line, f.location.function) == (
        SAMPLES,
        line_of("fallback"),
        "forward",
    )
    graph = next(g for g in report.graphs if g.name == f.graph)
    assert graph.fallback_ops == {"nctest.cpu_scan.default": 1} and graph.regions == 2


def test_downcast_points_at_first_use_of_the_float64_input(sample_run):
    report, _, _ = sample_run
    (f,) = _only(report, "downcast")
    assert (f.code, f.count, f.location.file, f.location.line) == (
        "NC104",
        1,
        SAMPLES,
        line_of("downcast"),
    )
    assert f.details["inputs"] == ["x: torch.float64 -> torch.float32"]  # the user's name
    assert f.message == "float64 inputs run as float32: x: torch.float64 -> torch.float32"


def test_recompile_names_the_changed_dim(sample_run):
    report, _, _ = sample_run
    (f,) = _only(report, "recompile")
    assert (f.code, f.location.file, f.location.line) == ("NC202", SAMPLES, line_of("recompile"))
    assert f.details["changed"] == "x dim 0=6 (was 4)"
    assert [g.recompile for g in report.graphs if g.name.startswith("shape_sensitive")] == [
        False,
        True,
    ]


def test_verifier_error_has_code_node_line_and_bundle(sample_run):
    report, _, _ = sample_run
    (f,) = _only(report, "compile-error")
    assert (f.code, f.location.file, f.location.line) == ("NC103", SAMPLES, line_of("verifier"))
    assert f.details["stage"] == "verify" and f.details["node"] == "bad_verify"
    assert "requires the same shape" in f.message
    assert sorted(os.listdir(f.bundle)) == [
        "error.txt",
        "graph.fx.py",
        "inputs.json",
        "meta.json",
        "module.stablehlo.mlir",
        "replay.py",
    ]
    failed = [g for g in report.graphs if g.status == "failed"]
    assert [g.name for g in failed] == [f.graph]


def test_run_mode_flags_the_wrong_lowering_and_matches_the_rest(sample_run):
    report, _, _ = sample_run
    (f,) = _only(report, "mismatch")
    assert (f.code, f.location.line) == ("NC602", line_of("mismatch"))
    assert f.details["max_abs_error"] == pytest.approx(1.0)
    statuses = {g.name.split("_")[0]: g.numerics for g in report.graphs if g.status == "ok"}
    assert statuses["wrong"] == "mismatch"
    assert statuses["ScanNet"] == statuses["wide"] == "matched"


def test_per_graph_stage_seconds_and_cache(sample_run):
    report, _, _ = sample_run
    ok = [g for g in report.graphs if g.status == "ok"]
    assert ok and all(g.seconds["backend"] > 0 and g.node_count > 0 for g in ok)
    assert all(g.cache["source"] == "compiled" and g.cache["miss"] for g in ok)


def test_check_estimates_trn2_device_time_of_a_cpu_compile(sample_run):
    report, _, _ = sample_run
    scan = [g for g in report.graphs if g.name.startswith("ScanNet")]  # nn.Linear: a matmul
    assert scan and all(g.est_target == "trn2" and g.est_device_s > 0 for g in scan)
    assert report.est_device_s_total() >= sum(g.est_device_s for g in scan)


@pytest.mark.parametrize("estimate, expected", [(None, "trn2"), ("off", ""), ("trn3", "trn3")])
def test_check_keeps_an_estimate_the_user_set(tmp_path, monkeypatch, estimate, expected):
    # Only the default "off" of a cpu compile becomes trn2 under a check; an explicit choice,
    # "off" included, is the user's.
    import torch

    from neuron_compile.report import Collector

    monkeypatch.setenv("NEURON_COMPILE_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()
    options = {} if estimate is None else {"estimate": estimate}
    with Collector("inline", "compile") as c, torch.no_grad():
        torch.compile(torch.nn.Linear(8, 8), backend="neuron", options=options)(torch.randn(2, 8))
    (graph,) = c.report().graphs
    torch._dynamo.reset()
    assert graph.est_target == expected
    assert (graph.est_device_s is None) == (expected == "")
