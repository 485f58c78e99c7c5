"""The fuzzer's warm mode: random graphs through ``torch.compile`` (Dynamo + AOTAutograd + our
compilers) in a cold process, then the same programs in a warm process on the same cache
directories (``warm.py``). Warm must equal cold bit for bit and load every stored frame.

``NEURON_COMPILE_FUZZ_WARM_EXAMPLES`` sets the number of drawn programs (default 200; the
``PINNED`` effectful ones run on top). Measured on a 2-core VM: 42 s cold + 20 s warm when
idle, up to 75 s + 34 s with other jobs running. Nearly all of the warm time is Dynamo tracing
and guard building (~0.1 s per frame), which no cache skips.
"""

from __future__ import annotations

import os

from tests.fuzz.warm import PINNED, Program, compare, run_cold_warm
from tests.helpers import warm_cache_problems

EXAMPLES = int(os.environ.get("NEURON_COMPILE_FUZZ_WARM_EXAMPLES", "200"))


def test_random_graphs_warm_after_cold_are_bit_identical(tmp_path):
    outcome = run_cold_warm(tmp_path, EXAMPLES)
    assert not outcome.failures, outcome.describe()
    assert len(outcome.cold) == len(outcome.warm) == EXAMPLES + len(PINNED)
    programs = [Program.from_json(r["program"]) for r in outcome.cold]
    # The run proves something only if it stored frames and covered both autograd modes.
    assert sum(r["cache"]["aot"]["saved"] for r in outcome.cold) > len(programs) // 2
    assert {p.grad for p in programs} == {True, False}


# The comparison itself, without processes: a refused load or a changed bit is a failure.

_COLD = {
    "error": None,
    "out": [["float32", [2], "aa"]],
    "grads": [],
    "fallback": {},
    "cache": {
        "aot": {"hit": 0, "miss": 1, "saved": 1, "bypass": 0},
        "sources": ["inference:compiled"],
    },
}
_WARM = {
    **_COLD,
    "cache": {"aot": {"hit": 1, "miss": 0, "saved": 0, "bypass": 0}, "sources": ["inference:disk"]},
}


def test_identical_warm_run_passes():
    assert compare(_COLD, _WARM) == []


def test_refused_load_is_a_failure():
    # AOTAutograd counts a load its OutputCode refuses as a bypass, then traces and saves again.
    refused = {"aot": {"hit": 0, "miss": 0, "saved": 1, "bypass": 1}, "sources": ["inference:disk"]}
    (problem,) = compare(_COLD, {**_WARM, "cache": refused})
    assert "AOTAutogradCache counters warm hit=0 miss=0 saved=1 bypass=1" in problem


def test_recompiled_graph_and_changed_bits_are_failures():
    warm = {**_WARM, "out": [["float32", [2], "ab"]]}
    warm["cache"] = {**_WARM["cache"], "sources": ["inference:compiled"]}
    problems = compare(_COLD, warm)
    assert problems[0].startswith("out: cold")
    assert problems[1] == "graphs not read from our cache warm: inference:compiled"


def test_warm_crash_is_a_failure_not_a_difference_in_kind():
    warm = {**_WARM, "error": "IndexError: list index out of range"}
    warm.pop("out")
    assert compare(_COLD, warm)[0] == (
        "error: cold None, warm 'IndexError: list index out of range'"
    )


def test_graphs_never_stored_stay_misses_and_bypasses():
    # A CPU-fallback graph: AOTAutogradCache refuses to save it (bypass) in both processes.
    cold = {
        "aot": {"hit": 0, "miss": 1, "saved": 0, "bypass": 1},
        "sources": ["inference:compiled"],
    }
    warm = {"aot": {"hit": 0, "miss": 1, "saved": 0, "bypass": 1}, "sources": ["inference:disk"]}
    assert warm_cache_problems(cold, warm) == []
