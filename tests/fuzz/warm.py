"""Cold and warm fuzzing through ``torch.compile``: random graphs (``graphs.py``) compiled with
``backend="neuron"`` (Dynamo, AOTAutograd, our compilers), with and without inputs that require
grad, once in a cold process on empty caches and again in a warm process on the same cache
directories. Warm results must equal cold results bit for bit (outputs, gradients, dtypes,
fallback counts), every frame stored cold must be an AOTAutogradCache hit warm and every graph
must be read from our cache (``tests.helpers.warm_cache_problems``).

``test_warm_graphs.py`` is the CI test. By hand (prints timings and every difference)::

    python -m tests.fuzz.warm --examples 200 [--keep DIR]

The cold process draws the programs with Hypothesis (derandomized) and writes each program with
its results as one JSON line as it finishes; the warm process replays exactly those programs. A
process that dies leaves every finished case on disk, and the first case missing from the warm
file is the one that crashed it.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from tests.fuzz.graphs import COMPILE_STEPS, TOL, chain_of, inputs, programs
from tests.helpers import CacheProbe, cache_env, tensor_digest, warm_cache_problems

_STEPS = {s.name: s for s in COMPILE_STEPS}
_DTYPES = {str(d).removeprefix("torch."): d for d in (torch.float32, torch.bfloat16, torch.int32)}
PROCESS_TIMEOUT = 900.0


@dataclass(frozen=True)
class Program:
    """One fuzz case as plain data, so the warm process can rebuild it exactly."""

    dtype: str
    shape: tuple[int, ...]
    steps: tuple[str, ...]
    seed: int
    grad: bool  # the inputs require grad (floating dtypes only): forward + backward graphs

    @staticmethod
    def from_json(d: dict[str, Any]) -> Program:
        return Program(d["dtype"], tuple(d["shape"]), tuple(d["steps"]), d["seed"], d["grad"])

    def label(self) -> str:
        grad = " grad" if self.grad else ""
        return f"{self.dtype}{list(self.shape)}{grad}: {' -> '.join(self.steps)} (seed {self.seed})"


#: Run after the drawn programs, so that every run covers them: ``linalg.inv`` threads an effect
#: token through AOTAutograd (its singular-input check), which once made every warm start of
#: the frame crash (IndexError), with and without grad. Hypothesis rarely draws it.
PINNED = (
    Program("float32", (3, 4), ("linalg-inv",), 1, False),
    Program("float32", (2, 3, 4), ("tanh", "linalg-inv", "sum"), 2, True),
    Program("bfloat16", (3, 5, 4), ("linalg-inv",), 3, True),
)


def draw_programs(n: int) -> list[Program]:
    """``n`` programs drawn by Hypothesis, derandomized (the same list in every process), then
    the ``PINNED`` ones."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    found: list[Program] = []

    @settings(
        max_examples=n,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(programs(COMPILE_STEPS), st.booleans())
    def collect(program: tuple, grad: bool) -> None:
        dtype, shape, steps, seed = program
        name = str(dtype).removeprefix("torch.")
        names = tuple(s.name for s in steps)
        found.append(Program(name, shape, names, seed, grad and dtype.is_floating_point))

    collect()
    return [*found[:n], *PINNED]


def _eager_gap(actual: Any, expected: Any, dtype: torch.dtype) -> str | None:
    """Why compiled and eager results differ beyond the fuzzer's tolerance, or None."""
    for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
        if a is None or e is None:
            if (a is None) != (e is None):
                return f"result {i}: {'no' if a is None else 'a'} gradient, eager differs"
            continue
        if dtype.is_floating_point:
            rtol, atol = TOL[dtype]
            if a.dtype != e.dtype or a.shape != e.shape or not torch.allclose(a, e, rtol, atol):
                return f"result {i} differs from eager"
        elif not torch.equal(a, e) or a.dtype != e.dtype:
            return f"result {i} differs from eager"
    return None


def run_case(program: Program) -> dict[str, Any]:
    """Compile and run ``program`` (and its backward when it takes grad): JSON-able results."""
    import neuron_compile

    torch._dynamo.reset()  # every case is a fresh frame, as in a new process
    dtype = _DTYPES[program.dtype]
    chain = chain_of([_STEPS[s] for s in program.steps])
    x, other = inputs(dtype, program.shape, program.seed)
    result: dict[str, Any] = {"error": None, "eager": None}
    probe = CacheProbe()
    neuron_compile.clear_fallback_ops()
    try:
        ins = [t.clone().requires_grad_(program.grad) for t in (x, other)]
        compiled = torch.compile(chain, backend="neuron", dynamic=False, fullgraph=True)
        out = compiled(*ins)
        outs, grads, cot = [out], [], None
        if program.grad and out.requires_grad:
            g = torch.Generator().manual_seed(program.seed + 1)
            cot = torch.randn(out.shape, generator=g).to(out.dtype)
            grads = list(torch.autograd.grad(out, ins, cot, allow_unused=True))
        result["out"], result["grads"] = tensor_digest(outs), tensor_digest(grads)
    except Exception as e:  # recorded, so both processes run every case
        first = next((ln for ln in str(e).splitlines() if ln.strip()), "")
        result["error"] = f"{type(e).__name__}: {first[:300]}"
    result["fallback"] = neuron_compile.get_fallback_ops()
    result["cache"] = probe.facts()
    if result["error"] is None:
        eager_ins = [t.clone().requires_grad_(program.grad) for t in (x, other)]
        expected = chain(*eager_ins)
        want = [expected]
        if grads:
            want += torch.autograd.grad(expected, eager_ins, cot, allow_unused=True)
        result["eager"] = _eager_gap([*outs, *grads], want, dtype)
    return result


def _quiet() -> None:
    warnings.simplefilter("ignore")
    for name in ("torch._dynamo", "torch._functorch", "torch.fx", "torch._inductor"):
        logging.getLogger(name).setLevel(logging.ERROR)


def worker(mode: str, out: Path, examples: int, replay: Path | None) -> None:
    """One process: run every program, one JSON line each as it finishes."""
    _quiet()
    if replay is not None:
        progs = [Program.from_json(r["program"]) for r in read_records(replay)]
    else:
        progs = draw_programs(examples)
    with open(out, "w") as f:
        for i, program in enumerate(progs):
            record = {"i": i, "mode": mode, "program": asdict(program), **run_case(program)}
            f.write(json.dumps(record) + "\n")
            f.flush()


def read_records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


# --------------------------------------------------------------------------- cold, then warm


@dataclass
class Outcome:
    """A cold and a warm process over the same programs, and what differed."""

    cold: list[dict[str, Any]]
    warm: list[dict[str, Any]]
    seconds: dict[str, float]
    failures: list[str] = field(default_factory=list)

    def describe(self, limit: int = 25) -> str:
        head = f"{len(self.failures)} failure(s) over {len(self.cold)} programs"
        head += " (" + ", ".join(f"{k} {v:.1f} s" for k, v in self.seconds.items()) + ")"
        shown = self.failures[:limit]
        more = [f"... and {len(self.failures) - limit} more"] if len(self.failures) > limit else []
        return "\n".join([head, *(f"- {f}" for f in shown), *more])


def _process(mode: str, root: Path, examples: int, timeout: float) -> tuple[Any, float]:
    args = [sys.executable, "-m", "tests.fuzz.warm", "--worker", mode, "--examples", str(examples)]
    args += ["--out", str(root / f"{mode}.jsonl")]
    if mode == "warm":
        args += ["--replay", str(root / "cold.jsonl")]
    start = time.perf_counter()
    proc = subprocess.run(
        args, env=cache_env(root), capture_output=True, text=True, timeout=timeout
    )
    return proc, time.perf_counter() - start


def _crash(mode: str, proc: Any, records: list[dict[str, Any]], programs_: list[Program]) -> str:
    """A failure line for a process that did not finish, naming the case it died in."""
    at = len(records)
    case = programs_[at].label() if at < len(programs_) else f"case {at}"
    tail = " | ".join(ln for ln in proc.stderr.strip().splitlines()[-6:])
    return f"{mode} process exited {proc.returncode} in case {at} ({case}): {tail}"


def compare(cold: dict[str, Any], warm: dict[str, Any]) -> list[str]:
    """Why ``warm`` is not the same result as ``cold`` for one program ([] if it is)."""
    problems = []
    for key in ("error", "out", "grads", "fallback"):
        if cold.get(key) != warm.get(key):
            problems.append(f"{key}: cold {cold.get(key)!r}, warm {warm.get(key)!r}")
    return problems + warm_cache_problems(cold["cache"], warm["cache"])


def run_cold_warm(root: Path, examples: int, timeout: float = PROCESS_TIMEOUT) -> Outcome:
    """The cold process, then the warm one, with both caches under ``root``; every failure."""
    cold_proc, cold_s = _process("cold", root, examples, timeout)
    cold = read_records(root / "cold.jsonl")
    progs = [Program.from_json(r["program"]) for r in cold]
    out = Outcome(cold, [], {"cold": cold_s})
    if cold_proc.returncode != 0:
        out.failures.append(_crash("cold", cold_proc, cold, draw_programs(examples)))
        return out
    warm_proc, out.seconds["warm"] = _process("warm", root, examples, timeout)
    out.warm = read_records(root / "warm.jsonl")
    if warm_proc.returncode != 0 or len(out.warm) != len(cold):
        out.failures.append(_crash("warm", warm_proc, out.warm, progs))
    for c in cold:  # the fuzzer's own checks, on the cold run
        label = Program.from_json(c["program"]).label()
        if c["error"] or c["eager"]:
            out.failures.append(f"cold {label}: {c['error'] or c['eager']}")
    for c, w in zip(cold, out.warm, strict=False):
        label = Program.from_json(c["program"]).label()
        out.failures += [f"warm {label}: {p}" for p in compare(c, w)]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.fuzz.warm", description=__doc__)
    p.add_argument("--examples", type=int, default=200)
    p.add_argument("--keep", type=Path, help="cache directories and JSONL files go here")
    p.add_argument("--worker", choices=("cold", "warm"), help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--replay", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args.worker, args.out, args.examples, args.replay)
        return 0
    with tempfile.TemporaryDirectory(prefix="fuzz-warm-") as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        outcome = run_cold_warm(root, args.examples)
    sys.stdout.write(outcome.describe(limit=10_000) + "\n")
    return 1 if outcome.failures else 0


if __name__ == "__main__":
    sys.exit(main())
