"""Cold and warm processes over a matrix of small model scripts (``scripts/``): a warm start must
compute what the cold start computed, bit for bit, and be served by the caches.

A cold process runs every script against empty cache directories (our disk cache and
PyTorch's AOTAutogradCache), then a warm process runs them again against the same directories.
For each scenario:

1. warm results equal cold results bit for bit: outputs, losses, gradients, buffers, dtypes,
   fallback counts, stdout, failures of asserts, warning categories;
2. both match eager (within each check's tolerance);
3. in the warm process every frame that cold stored (or already found) in AOTAutogradCache is
   a hit, nothing new is stored, and every graph comes from our cache (``memory`` or
   ``disk``), except what is not stored by design: AOTAutogradCache bypasses the scenario
   declares (CPU-fallback graphs, ...), which must happen in both processes, and the trn2
   target, which never consults it.

All scripts share the cold process and the warm process: a process per script and phase would
spend most of the budget starting interpreters (harness.py). Measured with 2 cores: ~17 s of CPU
cold and ~10 s warm; two groups of processes side by side cost more CPU (each pays the start)
and, on a busy machine, more time.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"
#: The frame number in a graph name ``{model}_{frame}_{kind}_{n}``.
_FRAME_NUMBER = re.compile(r"_\d+_(forward|backward|inference)_")


@dataclass(frozen=True)
class Expect:
    """What AOTAutogradCache does with a scenario's frames by design."""

    #: Reasons it bypasses a frame (a substring of its logged reason), once per bypass, in the
    #: cold and in the warm process alike.
    bypass: tuple[str, ...] = ()
    #: False when the backend never consults it (trn targets: aot_cache.enabled).
    consulted: bool = True
    #: Frames only the warm process compiles (Outputs.warm_only): misses, then stored.
    warm_only_frames: int = 0


SCENARIOS = {
    "infer_then_train": Expect(),
    "train_then_infer": Expect(),
    "modes": Expect(),
    "new_shape": Expect(
        # NOTE: a frame under automatic dynamic shapes is compiled per concrete shape by
        # ShapeSpecializer at call time, outside Dynamo's tracing context: AOTAutogradCache
        # finds no shape env and never stores it (our disk cache still serves it). The first
        # shape, compiled by Dynamo statically, is stored.
        bypass=("No shape env",) * 2,
        warm_only_frames=1,
    ),
    "buffers": Expect(),
    "aliasing": Expect(),
    "dropout": Expect(),
    "linalg_effects": Expect(),
    # print's higher-order op cannot be hashed into a key; its graphs also fall back to the CPU.
    "print_assert": Expect(bypass=("Unsupported call_function target print",) * 3),
    "fallback": Expect(bypass=("graph has CPU-fallback regions",) * 2),
    "trn2": Expect(consulted=False),
    "dtypes": Expect(),
}


def _run_phase(phase: str, cache: Path) -> dict[str, dict]:
    env = {
        **os.environ,
        "NEURON_COMPILE_CACHE_DIR": str(cache / "neuron"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "torch"),
        "PYTHONPATH": str(ROOT),
    }
    scripts = [str(SCRIPTS / f"{name}.py") for name in sorted(SCENARIOS)]
    proc = subprocess.run(
        [sys.executable, "-m", "tests.warm.harness", "--phase", phase, *scripts],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"{phase} process failed:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict[str, dict]]:
    """``{"cold": {scenario: facts}, "warm": {...}}``: one cold process, then one warm one."""
    cache = tmp_path_factory.mktemp("warm-matrix")
    cold = _run_phase("cold", cache)
    return {"cold": cold, "warm": _run_phase("warm", cache)}


def _facts(runs: dict, name: str, phase: str) -> dict:
    facts = runs[phase][name]
    assert facts["error"] is None, f"{name} failed in the {phase} process:\n{facts['error']}"
    return facts


def _graphs(facts: dict) -> list[tuple]:
    # Sorted: a cold process compiles a backward at its first call, a warm one loads it with its
    # forward. Names without the frame number, which counts the whole process's frames.
    return sorted(
        (
            _FRAME_NUMBER.sub(r"_\1_", g["name"]),
            json.dumps(g["fallback_ops"], sort_keys=True),
            g["regions"],
        )
        for g in facts["graphs"]
    )


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_warm_results_equal_cold_bit_for_bit(runs, name):
    cold, warm = _facts(runs, name, "cold"), _facts(runs, name, "warm")
    assert cold["tensors"], "the scenario recorded nothing"
    assert warm["tensors"].keys() == cold["tensors"].keys()
    differ = [
        f"{key} ({cold['tensors'][key]['dtype']} -> {warm['tensors'][key]['dtype']})"
        for key in cold["tensors"]
        if warm["tensors"][key] != cold["tensors"][key]
    ]
    assert not differ, f"warm results differ from cold: {differ}"
    assert warm["raises"] == cold["raises"]  # asserts inside graphs still fail, alike
    assert warm["stdout"] == cold["stdout"]  # prints inside graphs still happen, alike
    assert warm["fallback_calls"] == cold["fallback_calls"]
    assert _graphs(warm) == _graphs(cold)
    assert warm["warnings"] == cold["warnings"]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
@pytest.mark.parametrize("phase", ["cold", "warm"])
def test_results_match_eager(runs, name, phase):
    facts = _facts(runs, name, phase)
    off = {key: e for key, e in facts["eager"].items() if not e["err"] <= e["tol"]}
    assert not off, f"{phase} results differ from eager beyond tolerance: {off}"


def _bypass_reasons(facts: dict, expect: Expect) -> Counter:
    reasons: Counter = Counter()
    for note in facts["aot_notes"]:
        known = [r for r in expect.bypass if r in note]
        reasons[known[0] if known else note] += 1
    return reasons


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_warm_start_is_served_by_the_caches(runs, name):
    expect = SCENARIOS[name]
    cold, warm = _facts(runs, name, "cold"), _facts(runs, name, "warm")
    sources = [(g["name"], g["cache_source"]) for g in warm["graphs"]]
    assert all(src in ("memory", "disk") for _, src in sources), sources
    assert warm["graphs"], "no graph compiled or loaded"

    if not expect.consulted:
        for facts in (cold, warm):
            assert set(facts["aot"].values()) == {0}, facts["aot"]
            assert set(facts["warm_only"]["aot"].values()) == {0}
        return
    for phase, facts in (("cold", cold), ("warm", warm)):
        reasons = _bypass_reasons(facts, expect)
        assert reasons == Counter(expect.bypass), f"{phase} bypasses: {facts['aot_notes']}"
    c, w = cold["aot"], warm["aot"]
    assert c["saved"] + c["bypass"] > 0, f"the cache was not consulted: {c}"
    # Every frame stored cold (or found cold: a frame equal to an earlier one) is a hit warm;
    # a warm miss is a frame whose save was bypassed cold; nothing new to store.
    assert w["hit"] == c["saved"] + c["hit"], (c, w)
    assert w["miss"] == c["miss"] - c["saved"], (c, w)
    assert w["saved"] == 0, w
    assert w["bypass"] == c["bypass"], (c, w)

    # Work only the warm process did: traced, compiled and stored like any cold frame.
    only = warm["warm_only"]
    frames = expect.warm_only_frames
    assert (only["aot"]["miss"], only["aot"]["saved"], only["aot"]["hit"]) == (frames, frames, 0)
    assert all(g["cache_source"] == "compiled" for g in only["graphs"]), only["graphs"]
    assert bool(only["tensors"]) == bool(frames)
