"""The conformance CI slice, cold then warm (``warm.py``): two real processes on the same cache
directories; no entry may change and every stored frame must load. Plus the comparison and the
crash handling, checked without OpInfos.

The slice runs one sample per entry to stay within its 90 s budget. Measured on a 2-core VM:
25 s cold + 17 s warm when idle, 48 s + 35 s with other jobs running (about 13 s of each is
the child's imports and OpInfo database); the default three samples took 52 s + 39 s idle.
"""

from __future__ import annotations

import sys
import textwrap

from tests.conformance import report, warm
from tests.conformance.test_conformance import CI_OPS

# linalg.inv checks for singular input with an effectful op: AOTAutograd threads an effect
# token through its graphs, which once made every warm start crash (IndexError).
WARM_OPS = (*CI_OPS, "linalg.inv")


def test_ci_slice_warm_after_cold_changes_nothing(tmp_path):
    run = warm.run_cold_warm(["--ops", ",".join(WARM_OPS), "--samples", "1"], tmp_path)
    counts, failures = run.counts(), run.failures()
    seconds = {"cold": run.cold.seconds, "warm": run.warm.seconds}
    assert not failures, report.warm_text(counts, failures, seconds)
    # Proves something only if frames were stored cold and loaded warm.
    assert counts["cold_saved"] >= len(WARM_OPS) and counts["warm_hit"] >= counts["cold_saved"]


# --------------------------------------------------------------------------- without OpInfos

_ROW = {"op": "x", "variant": "", "dtype": "float32", "reason": "", "warm": ""}
_ROWS = [
    {**_ROW, "phase": "forward", "outcome": "pass", "max_abs_err": 0.0, "max_rel_err": 0.0},
    {**_ROW, "phase": "backward", "outcome": "pass", "max_abs_err": 1e-6, "max_rel_err": 0.0},
]
_COLD = {
    "rows": _ROWS,
    "observed": [
        ["forward", [["float32", [2], "aa"]], {}],
        ["backward", [["float32", [2], "bb"]], {}],
    ],
    "cache": {
        "aot": {"hit": 0, "miss": 1, "saved": 1, "bypass": 0},
        "sources": ["forward:compiled", "backward:compiled"],
    },
}
_WARM = {
    **_COLD,
    "cache": {
        "aot": {"hit": 1, "miss": 0, "saved": 0, "bypass": 0},
        "sources": ["forward:disk", "backward:disk"],
    },
}


def _verdict(cold: dict, warm_: dict) -> str:
    key = ("x", "", "float32")
    return warm.verdict(warm.ProcessRun({key: cold}), warm.ProcessRun({key: warm_}), key)


def test_identical_entry_is_same():
    assert _verdict(_COLD, _WARM) == "same: stored, loaded"


def test_status_change_bits_and_fallback_counts_are_differences():
    rows = [{**_ROWS[0], "outcome": "error", "reason": "IndexError: list index out of range"}]
    rows.append({**_ROWS[1], "outcome": "skip", "reason": "forward did not run"})
    crashed = {**_WARM, "rows": rows, "observed": []}
    assert _verdict(_COLD, crashed).startswith(
        "differs: forward pass -> error: IndexError: list index out of range; backward pass -> skip"
    )
    flipped = [_COLD["observed"][0], ["backward", [["float32", [2], "bc"]], {}]]
    assert "compiled result 1 (backward) differs: leaf 0: float32[2] #bb -> float32[2] #bc" in (
        _verdict(_COLD, {**_WARM, "observed": flipped})
    )
    fell_back = [_COLD["observed"][0], ["backward", [["float32", [2], "bb"]], {"aten.x": 1}]]
    assert "compiled result 1 (backward): fallback counts {} -> {'aten.x': 1}" in _verdict(
        _COLD, {**_WARM, "observed": fell_back}
    )


def test_refused_load_is_a_difference():
    refused = {
        "aot": {"hit": 0, "miss": 0, "saved": 1, "bypass": 1},
        "sources": ["forward:compiled", "backward:compiled"],
    }
    v = _verdict(_COLD, {**_WARM, "cache": refused})
    assert "AOTAutogradCache counters warm hit=0 miss=0 saved=1 bypass=1" in v
    assert "graphs not read from our cache warm: forward:compiled, backward:compiled" in v


def test_warm_column_in_csv_table_and_markdown(tmp_path):
    run = warm.WarmRun(
        warm.ProcessRun({("x", "", "float32"): _COLD}),
        warm.ProcessRun({("x", "", "float32"): _WARM}),
        {("x", "", "float32"): "same: stored, loaded"},
    )
    results = run.results()
    assert [r.warm for r in results] == ["same: stored, loaded"] * 2
    summary = report.summarize(results)
    assert "warm same" in report.format_table(summary) and summary["float32"].warm_cell() == "1/1"
    md = report.markdown(results, command="x", meta={})
    assert "| warm same |" in md and "1/1 |" in md and "#### Warm start" in md
    with open(tmp_path / "r.csv", "w", newline="") as f:
        writer = report.CsvWriter(f)
        for r in results:
            writer.write(r)
    with open(tmp_path / "r.csv", newline="") as f:
        assert [r.warm for r in report.read_csv(f)] == ["same: stored, loaded"] * 2


# A stand-in child process: writes the entry lines run.py's child would, and aborts (as a crash
# in XLA would) the first time it reaches entry 1.
_FAKE_CHILD = textwrap.dedent(
    """
    import json, os, sys
    out, start = sys.argv[sys.argv.index("--probe-out") + 1], int(sys.argv[-1])
    aot = {"hit": 0, "miss": 1, "saved": 1, "bypass": 0}
    cold = {"aot": aot, "sources": ["inference:compiled"]}
    with open(out, "a") as f:
        for i in range(start, 3):
            key = [f"op{i}", "", "float32"]
            f.write(json.dumps({"start": i, "of": 3, "key": key}) + "\\n")
            f.flush()
            if i == 1 and start == 0:
                os.abort()
            row = {"op": key[0], "variant": "", "dtype": "float32", "phase": "forward",
                   "outcome": "pass", "reason": ""}
            f.write(json.dumps({"i": i, "entry": key, "rows": [row], "observed": [],
                                "cache": cold}) + "\\n")
    """
)


def test_a_crashed_process_is_a_failure_and_the_run_goes_on(tmp_path):
    child = (sys.executable, "-c", _FAKE_CHILD)
    run = warm.run_mode("warm", [], tmp_path, timeout=60, child=child)
    assert sorted(run.records) == [("op0", "", "float32"), ("op2", "", "float32")]
    (why,) = run.crashed.values()
    assert list(run.crashed) == [("op1", "", "float32")] and "died (exit -6)" in why
    cold = warm.ProcessRun(dict(run.records), total=3)
    both = warm.WarmRun(cold, run, {k: warm.verdict(cold, run, k) for k in run.order})
    assert both.verdicts[("op1", "", "float32")].startswith("crashed: warm process died")
    (row,) = [r for r in both.results() if r.op == "op1"]
    assert row.outcome == "error"  # reported as a failure, never as a skip
    assert any(f.startswith("op1 float32: crashed") for f in both.failures())


def test_graph_numbering_in_reasons_is_not_a_difference():
    # A process restarted after a crash numbers its graphs from 0 again.
    why = "NC301 ExecutorError: XLA CPU failed to run graph fn_{}_backward_0: E0102"
    rows = [{**_ROWS[0], "outcome": "error", "reason": why.format(1549)}]
    renumbered = [{**rows[0], "reason": why.format(3)}]
    assert _verdict({**_COLD, "rows": rows}, {**_WARM, "rows": renumbered}).startswith("same")
