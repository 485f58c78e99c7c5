"""Distributed settings under torchrun: graphs per step, collectives inside vs between graphs,
the trn2 cost model's device time per step, and the step time against eager.

Run: ``python benchmarks/bench_distributed.py [--settings ...] [--steps 5] [--json out.json]``.

Each setting runs as real gloo ranks (``torch.distributed.run``, one thread per rank) on the
models of ``tests/distributed/settings_worker.py`` (tiny MLP; the Llama-style example model for
tensor parallel). Per rank, after one warm-up step that compiles, ``--steps`` compiled steps are
measured, and as many eager steps of a second copy:

* graphs per step: compiled graph executions (``GraphRecord.calls``) per step;
* collectives inside graphs: the StableHLO collectives those executions ran
  (``GraphRecord.collectives``);
* collectives between graphs: c10d collectives torch issued itself during a step (torch
  profiler events ``gloo:*``, which jaxlib's own gloo never emits);
* est. trn2 ms/step: ``GraphRecord.est_device_s`` (the roofline cost model, with its collective
  term: bytes over the link bandwidth) summed over the step's executions;
* step ms: median wall time of a compiled step / of an eager step, and their ratio (XLA CPU
  here, not Trainium: a numerics executor).

Rank 0's numbers are printed (every rank runs the same graphs).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {  # name -> world size
    "ddp_optimizer": 2,
    "ddp_python_reducer": 2,
    "fsdp2_blocks": 2,
    "simple_fsdp_mlp": 2,
    "tensor_parallel": 2,
    "tp_simple_fsdp_2d": 4,
}


def _step_functions(setting: str, steps: int) -> tuple[Callable, Callable, int]:
    """``(compiled_step, eager_step, batches)``: each step runs forward, backward and SGD."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from tests.distributed import settings_worker as w

    rank, world = dist.get_rank(), dist.get_world_size()
    compile_ = w.compile_neuron
    mlp_data = w.mlp_batches(rank) * steps

    def sgd_steps(model, forward, data, scale=1.0):
        opt = torch.optim.SGD(model.parameters(), lr=w.LR)
        it = iter(data)

        def step():
            x, y = next(it)
            opt.zero_grad()
            (w.mse(forward, x, y) * scale).backward()
            opt.step()

        return step

    if setting == "ddp_optimizer":
        from torch.nn.parallel import DistributedDataParallel as DDP

        dist._DEFAULT_FIRST_BUCKET_BYTES = 1024
        c, e = (DDP(w.seeded(w.MLP), bucket_cap_mb=0.001) for _ in range(2))
        return sgd_steps(c, compile_(c), mlp_data), sgd_steps(e, e, mlp_data), len(mlp_data)
    if setting == "ddp_python_reducer":
        from torch.nn.parallel import DistributedDataParallel as DDP

        torch._dynamo.config.optimize_ddp = "python_reducer"
        torch._dynamo.config.compiled_autograd = True
        c = DDP(w.seeded(w.MLP))
        opt = torch.optim.SGD(c.parameters(), lr=w.LR)
        step_fn = compile_(w.fwd_bwd(c))
        it = iter(mlp_data)

        def compiled_step():
            x, y = next(it)
            opt.zero_grad()
            step_fn(x, y)
            opt.step()

        torch._dynamo.config.optimize_ddp = True
        e = DDP(w.seeded(w.MLP))
        eager = sgd_steps(e, e, mlp_data)

        def eager_step():
            with torch._dynamo.config.patch(compiled_autograd=False):
                eager()

        return compiled_step, eager_step, len(mlp_data)
    if setting == "fsdp2_blocks":
        c, e = w._fsdp2(w.seeded(w.MLP), compile_blocks=True), w._fsdp2(w.seeded(w.MLP))
        return sgd_steps(c, c, mlp_data), sgd_steps(e, e, mlp_data), len(mlp_data)
    if setting == "simple_fsdp_mlp":
        from simple_fsdp import simple_fsdp

        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
        c, e = (simple_fsdp(w.seeded(w.MLP), mesh) for _ in range(2))
        scale = 1 / world
        return (
            sgd_steps(c, compile_(c), mlp_data, scale),
            sgd_steps(e, e, mlp_data, scale),
            len(mlp_data),
        )
    import torch.nn.functional as F
    import train_tp_fsdp as example
    from simple_fsdp import simple_fsdp

    shape = (1, world) if setting == "tensor_parallel" else (2, world // 2)
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=("dp", "tp"))
    dp = mesh["dp"].size()

    def build():
        model = example.tensor_parallel(example.Llama(), mesh["tp"])
        return simple_fsdp(model, mesh["dp"]) if dp > 1 else model

    data = example.batches(steps + 1, mesh["dp"].get_local_rank())

    def llama_steps(model, forward):
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        it = iter(data)

        def step():
            tokens, labels = next(it)
            opt.zero_grad()
            logits = forward(tokens).flatten(0, 1)
            (F.cross_entropy(logits, labels.flatten()) / dp).backward()
            opt.step()

        return step

    c, e = w.seeded(build), w.seeded(build)
    return llama_steps(c, compile_(c)), llama_steps(e, e), len(data)


def worker(setting: str, steps: int, out: str) -> None:
    """One rank: warm up, measure, write rank 0's numbers to ``out``."""
    import torch
    import torch.distributed as dist

    import neuron_compile

    dist.init_process_group("gloo")
    compiled_step, eager_step, available = _step_functions(setting, steps)
    steps = min(steps, available - 1)
    compiled_step()  # compiles
    eager_step()
    before = {r.name: r.calls for r in neuron_compile.metrics()}
    between: Counter[str] = Counter()
    times = []
    for _ in range(steps):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            t = time.perf_counter()
            compiled_step()
            times.append(time.perf_counter() - t)
        between.update(e.name for e in prof.events() if e.name.startswith("gloo:"))
    eager_times = []
    for _ in range(steps):
        t = time.perf_counter()
        eager_step()
        eager_times.append(time.perf_counter() - t)
    records = neuron_compile.metrics()
    calls = {r.name: r.calls - before.get(r.name, 0) for r in records}
    inside: Counter[str] = Counter()
    for r in records:
        for op, n in r.collectives.items():
            inside[op] += n * calls[r.name]
    est = [r.est_device_s * calls[r.name] for r in records if r.est_device_s is not None]
    row = {
        "setting": setting,
        "ranks": dist.get_world_size(),
        "graphs_compiled": len(records),
        "graphs_per_step": sum(calls.values()) / steps,
        "inside_per_step": {k: v / steps for k, v in sorted(inside.items())},
        "between_per_step": {k: v / steps for k, v in sorted(between.items())},
        "fallback_ops": sorted({op for r in records for op in r.fallback_ops}),
        "est_trn2_ms_per_step": 1e3 * sum(est) / steps if est else None,
        "step_ms": 1e3 * statistics.median(times),
        "eager_step_ms": 1e3 * statistics.median(eager_times),
    }
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(row))
    dist.destroy_process_group()


def _launch(setting: str, steps: int) -> dict:
    import subprocess

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "row.json")
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "examples")]),
            "OMP_NUM_THREADS": "1",
            "NEURON_COMPILE_ESTIMATE": "trn2",
            "NEURON_COMPILE_CACHE_DIR": str(Path(tmp, "cache")),
        }
        command = [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={SETTINGS[setting]}", __file__,
            "--worker", setting, "--steps", str(steps), "--out", str(out),
        ]  # fmt: skip
        done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0 or not out.exists():
            raise RuntimeError(f"{setting} failed:\n{done.stderr[-3000:]}")
        return json.loads(out.read_text())


def _fmt(counts: dict[str, float]) -> str:
    return ", ".join(f"{k.removeprefix('gloo:')} {v:g}" for k, v in counts.items()) or "0"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--settings", nargs="*", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        sys.path[:0] = [str(ROOT), str(ROOT / "examples")]
        worker(args.worker, args.steps, args.out)
        return
    rows = [_launch(s, args.steps) for s in args.settings]
    print(f"{args.steps} measured steps per setting, 1 thread per rank, medians\n")
    print(
        "| setting | ranks | graphs/step | collectives inside graphs /step | between graphs /step "
        "| est. trn2 ms/step | step ms (neuron / eager) |"
    )
    print("|---|---:|---:|---|---|---:|---|")
    for r in rows:
        est = f"{r['est_trn2_ms_per_step']:.4f}" if r["est_trn2_ms_per_step"] is not None else "—"
        ratio = r["step_ms"] / r["eager_step_ms"]
        print(
            f"| {r['setting']} | {r['ranks']} | {r['graphs_per_step']:g} "
            f"| {_fmt(r['inside_per_step'])} | {_fmt(r['between_per_step'])} | {est} "
            f"| {r['step_ms']:.1f} / {r['eager_step_ms']:.1f} ({ratio:.2f}×) |"
        )
        if r["fallback_ops"]:
            print(f"  ops run eagerly: {', '.join(r['fallback_ops'])}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
