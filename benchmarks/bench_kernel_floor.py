"""How far XLA CPU's compile alone keeps neuron's first call above ``aot_eager``'s, per model.

Run: ``python benchmarks/bench_kernel_floor.py [--models resnet18,mlp] [--repeats 3] [--json F]``.

XLA CPU compiles every fusion, and every op it leaves unfused, to an LLVM function of its own,
and each costs milliseconds whatever its size: LLVM's whole pipeline runs per function. In one
run this script measures

* the per-kernel floor: modules of ``K`` trivial elementwise kernels (a divide and an add on 64
  floats each, kept apart by distinct constants), compiled by the same client and options as our
  graphs; the slope over ``K`` is the cost of one kernel, the intercept that of one compile;
* each model of ``bench_models.py``: its ``aot_eager`` first call (cold, median of
  ``--repeats``) and, with XLA's dump on, neuron's graphs and the kernels in their LLVM IR
  (one subprocess per model: XLA reads ``XLA_FLAGS`` once per process);

and prints the *floor ratio* ``1 + (graphs x compile + kernels x kernel) / aot_eager``: neuron's
first call over ``aot_eager``'s if tracing cost no more than ``aot_eager``'s whole first call
(it measures 0.9-1.1x of it), our own work and the first execution cost nothing, and every kernel
compiled as fast as a trivial one. No setting of ours goes below it without fewer kernels.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
#: A kernel function of XLA CPU's LLVM IR: ``define ptr @name(ptr %0)`` (one call frame argument).
KERNEL = re.compile(r"^define ptr @\S+\(ptr(?: noalias)? %0\)", re.M)
SIZES = (1, 21, 41)


def _trivial_module(kernels: int) -> bytes:
    """The portable artifact of ``kernels`` independent tiny fusions (distinct constants: no
    CSE), serialized as our graphs are."""
    from neuron_compile.artifact import serialize

    t = "tensor<1x64xf32>"
    body = []
    for i in range(kernels):
        body += [
            f"  %c{i} = stablehlo.constant dense<{i + 2}.0> : {t}",
            f"  %d{i} = stablehlo.divide %a, %c{i} : {t}",
            f"  %e{i} = stablehlo.add %d{i}, %a : {t}",
        ]
    results = ", ".join([t] * kernels)
    text = "\n".join(
        [f"func.func public @main(%a: {t}) -> ({results}) {{", *body]
        + [f"  return {', '.join(f'%e{i}' for i in range(kernels))} : {results}", "}"]
    )
    return serialize(text, "portable")


def kernel_floor(rounds: int = 5) -> dict[str, float]:
    """Seconds per compile and per kernel: a least-squares line through the median compile wall
    time of each module size."""
    from neuron_compile.runtime import xla_cpu

    backend, _, devices, xc = xla_cpu._client()
    modules = {k: _trivial_module(k) for k in SIZES}
    walls: dict[int, list[float]] = {k: [] for k in SIZES}
    for _ in range(rounds):
        for k, data in modules.items():  # interleaved: the VM's drift hits every size alike
            t0 = time.perf_counter()
            backend.compile_and_load(data, devices, xla_cpu.compile_options(xc.CompileOptions()))
            walls[k].append(time.perf_counter() - t0)
    fit = statistics.linear_regression(SIZES, [statistics.median(walls[k]) for k in SIZES])
    return {"per_kernel_s": fit.slope, "per_compile_s": fit.intercept}


def _modules(dump_dir: str) -> dict[str, list[str]]:
    """XLA's LLVM IR dumps by compiled module (``module_0004``), in compile order."""
    paths: dict[str, list[str]] = {}
    for path in sorted(glob.glob(os.path.join(dump_dir, "module_*.ir-no-opt.ll"))):
        paths.setdefault(os.path.basename(path).split(".", 1)[0], []).append(path)
    return paths


def count_kernels(dump_dir: str, skip: list[str]) -> list[int]:
    """Kernel functions per module compiled, but for the modules in ``skip``."""
    return [
        sum(len(KERNEL.findall(Path(p).read_text())) for p in paths)
        for module, paths in _modules(dump_dir).items()
        if module not in skip
    ]


def child(name: str, repeats: int, dump_dir: str) -> dict[str, Any]:
    """In a process whose ``XLA_FLAGS`` dump to ``dump_dir``: ``name``'s cold ``aot_eager`` first
    calls, then one neuron first call; and which modules XLA compiled before that call."""
    os.environ["NEURON_COMPILE_CACHE_DIR"] = "off"
    sys.path.insert(0, str(HERE))
    import bench_models as bm
    import torch

    import neuron_compile

    build, optimizer = bm.MODELS[name]
    torch.manual_seed(0)
    model, batch = build(torch.Generator().manual_seed(0))
    model.train()
    for backend in ("aot_eager", "neuron"):  # the process's one-time costs, as bench_models
        bm.warm_up_process(backend)
    aot = []
    for _ in range(repeats):
        torch._dynamo.reset()
        aot.append(bm.Runner(model, "aot_eager", optimizer).first_call(batch)[0])
    torch._dynamo.reset()
    neuron_compile.reset_metrics()
    before = list(_modules(dump_dir))
    bm.Runner(model, "neuron", optimizer).first_call(batch)
    graphs = len(neuron_compile.metrics())
    return {"aot_eager_s": statistics.median(aot), "graphs": graphs, "warm_up_modules": before}


def measure_model(name: str, repeats: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kernel_floor_") as dump:
        env = dict(os.environ, XLA_FLAGS=f"--xla_dump_to={dump} --xla_dump_hlo_pass_re=^$")
        out = subprocess.run(
            [sys.executable, __file__, "--child", name, "--repeats", str(repeats), "--dump", dump],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        row = json.loads(out.stdout.strip().splitlines()[-1])
        row["kernels"] = count_kernels(dump, row.pop("warm_up_modules"))
    row["model"] = name
    return row


def floor_ratio(row: dict[str, Any], floor: dict[str, float]) -> float:
    xla_s = row["graphs"] * floor["per_compile_s"] + sum(row["kernels"]) * floor["per_kernel_s"]
    return 1 + xla_s / row["aot_eager_s"]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated subset of bench_models.py's models")
    parser.add_argument("--repeats", type=int, default=3, help="aot_eager cold first calls")
    parser.add_argument("--json", metavar="PATH", help="also write every number as JSON")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--dump", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.repeats, args.dump)))
        return {}

    sys.path.insert(0, str(HERE))
    from bench_models import MODELS, TARGETS

    floor = kernel_floor()
    print(
        f"XLA CPU floor: {floor['per_kernel_s'] * 1e3:.2f} ms per kernel, "
        f"{floor['per_compile_s'] * 1e3:.1f} ms per compile (wall, this machine's threads)"
    )
    print(f"{'model':12s} {'graphs':>6s} {'kernels':>8s} {'aot_eager s':>11s} {'floor ratio':>11s}")
    rows = []
    for name in args.models.split(",") if args.models else list(MODELS):
        row = measure_model(name, args.repeats)
        row["floor_ratio"] = floor_ratio(row, floor)
        rows.append(row)
        print(
            f"{name:12s} {row['graphs']:6d} {sum(row['kernels']):8d} "
            f"{row['aot_eager_s']:11.2f} {row['floor_ratio']:10.2f}x",
            flush=True,
        )
    _, each, median_target = TARGETS["first_ratio"]
    median = statistics.median(r["floor_ratio"] for r in rows)
    print(
        f"median floor ratio {median:.2f}x (target for the measured ratio <= {median_target}x); "
        f"over {each}x even at the floor: "
        f"{', '.join(r['model'] for r in rows if r['floor_ratio'] > each) or 'none'}"
    )
    result = {"floor": floor, "rows": rows, "median_floor_ratio": median}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
