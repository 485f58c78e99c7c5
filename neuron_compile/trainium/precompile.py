"""``neuron-compile precompile SCRIPT``: fill the NEFF cache on a CPU machine, in parallel.

1. **Collect.** Run ``SCRIPT`` (a fresh Python process, ``sys.argv`` = the script and its args)
   with ``NEURON_COMPILE_TARGET=<target>`` and ``NEURON_COMPILE_PRECOMPILE_DIR=<dir>``. Graphs
   compile as usual (lowering, trn legality, verified artifacts, XLA CPU executables: all into
   the cache) and run on the CPU executor, so the script's control flow is exactly the one it
   has in production; instead of calling neuronx-cc, each graph records a *job* in ``<dir>``
   (its neuronx-cc input, cache key and settings; ``cached`` when its NEFF is already cached).
2. **Compile.** Jobs not yet cached go to a process pool of ``--jobs`` workers (default: the
   smaller of the CPU count and host RAM / ``--ram-per-job``), each running neuronx-cc through
   ``neuronx_cc.compile_job`` into the disk cache (negative entries on failure). A progress bar
   goes to stderr.
3. **Report.** One row per graph: status (``compiled``/``cached``/``failed``/``timeout``/
   ``cached-failure``), seconds, NEFF bytes, our error code and the NCC code + triage class;
   printed as a table, or as JSON with ``--json``, and written to ``<dir>/report.json``.

Failed graphs can be retried alone from the collected jobs, without rerunning the script:
``neuron-compile precompile --from DIR --only GRAPH --retry-failed``.

``--nproc-per-node N`` collects from a distributed script: it runs under torchrun as N ranks
(``report/ranks.py``), all writing jobs into the one collection directory. A job is keyed by its
NEFF cache key, so a graph every rank compiles is one job, compiled once; each rank that
produced it leaves a marker (``jobs/<key>.rank<k>``), and the report lists each distinct graph
once with its ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .neuronx_cc import NeffJob, NeffResult, compile_job

ENV_COLLECT = "NEURON_COMPILE_PRECOMPILE_DIR"
DEFAULT_RAM_PER_JOB = 8 * 2**30  # neuronx-cc's host RAM per compile: a conservative guess


def collect_dir() -> Path | None:
    """The collection directory when this process runs under ``precompile``, else None."""
    raw = os.environ.get(ENV_COLLECT, "").strip()
    return Path(raw) if raw else None


def record_job(root: Path, job: NeffJob, data: bytes, *, cached_neff_bytes: int) -> None:
    """Write one collected job (``jobs/<key>.json`` + its input bytes) and this rank's marker
    (``jobs/<key>.rank<k>``); idempotent per key, so ranks producing one graph share its job."""
    from ..report.ranks import process_rank

    jobs = root / "jobs"
    jobs.mkdir(parents=True, exist_ok=True)
    (jobs / f"{job.key}.rank{process_rank()[0]}").touch()
    inp = jobs / f"{job.key}.{job.input_name}"
    tmp = inp.with_name(f".{inp.name}.{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, inp)
    job.input_path = str(inp)
    record = {
        **job.as_dict(),
        "cached_at_collection": cached_neff_bytes > 0,
        "neff_bytes": cached_neff_bytes,
        "collected_at": time.time(),
    }
    meta = jobs / f"{job.key}.json"
    tmp = meta.with_name(f".{meta.name}.{os.getpid()}")
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, meta)


def load_jobs(root: Path) -> list[dict[str, Any]]:
    """Collected jobs, one per key, each with ``ranks``: the ranks that produced it."""
    out = []
    for path in sorted((root / "jobs").glob("*.json")):
        job = json.loads(path.read_text())
        markers = path.parent.glob(f"{job['key']}.rank*")
        job["ranks"] = sorted(int(m.suffix.removeprefix(".rank")) for m in markers)
        out.append(job)
    return sorted(out, key=lambda j: (j["graph_name"], j["key"]))


def host_ram_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 16 * 2**30


def pool_size(jobs: int | None, n_work: int, ram_per_job: int) -> int:
    """Workers: ``--jobs`` if given, else min(CPU count, host RAM / RAM per compile); never
    more than the number of compiles, at least 1."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    limit = jobs or min(cores or 1, max(1, host_ram_bytes() // max(1, ram_per_job)))
    return max(1, min(limit, n_work))


class Progress:
    """A one-line progress bar on stderr (``\\r``-redrawn on a TTY, a line per step otherwise)."""

    def __init__(self, total: int, stream: Any = None) -> None:
        self.total, self.done, self.failed = total, 0, 0
        self.stream = stream or sys.stderr
        self.start = time.perf_counter()
        self.tty = getattr(self.stream, "isatty", lambda: False)()

    def step(self, result: NeffResult) -> None:
        self.done += 1
        self.failed += result.status not in ("compiled", "cached")
        width = 30
        filled = int(width * self.done / max(1, self.total))
        line = (
            f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} "
            f"{time.perf_counter() - self.start:6.1f}s  {self.failed} failed  "
            f"{result.graph_name}: {result.status}"
        )
        end = "" if self.tty and self.done < self.total else "\n"
        print(("\r" if self.tty else "") + line, end=end, file=self.stream, flush=True)


def run_script(
    script: str,
    script_args: list[str],
    root: Path,
    target: str,
    env_extra: dict,
    nproc_per_node: int | None = None,
    stdout: Any = None,
) -> int:
    """Phase 1: run the user's script in graph-collection mode (as ``nproc_per_node`` ranks
    under torchrun when given); returns its exit status. ``stdout``: where the script's output
    goes (``sys.stderr`` when ours must be JSON alone), by default ours."""
    env = {ENV_COLLECT: str(root), "NEURON_COMPILE_TARGET": target, **env_extra}
    if nproc_per_node:
        from ..report.ranks import run_ranks

        return run_ranks(nproc_per_node, [script, *script_args], env, stdout=stdout)
    command = [sys.executable, script, *script_args]
    env = {**os.environ, **env}
    return subprocess.run(command, env=env, stdout=stdout, check=False).returncode


def compile_jobs(
    jobs: list[dict[str, Any]], workers: int, progress: Progress | None = None
) -> list[NeffResult]:
    """Phase 2: compile every job not cached at collection, ``workers`` at a time."""
    results: list[NeffResult] = []
    todo = []
    for job in jobs:
        if job.get("cached_at_collection"):
            res = NeffResult(
                job["graph_name"], job["key"], "cached", neff_bytes=job.get("neff_bytes", 0)
            )
            results.append(res)
            if progress:
                progress.step(res)
        else:
            todo.append(job)
    fields = set(NeffJob.__dataclass_fields__)
    if todo and workers == 1:
        for job in todo:
            res = compile_job({k: v for k, v in job.items() if k in fields})
            results.append(res)
            if progress:
                progress.step(res)
    elif todo:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = [
                pool.submit(compile_job, {k: v for k, v in job.items() if k in fields})
                for job in todo
            ]
            for fut in as_completed(futures):
                res = fut.result()
                results.append(res)
                if progress:
                    progress.step(res)
    return sorted(results, key=lambda r: r.graph_name)


def summarize(results: list[NeffResult]) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    n = len(results)
    return {
        "graphs": n,
        "counts": counts,
        "cache_hit_rate": (counts.get("cached", 0) / n) if n else None,  # no graph: no rate
        "failed": sum(r.status not in ("compiled", "cached") for r in results),
        "compile_seconds": round(sum(r.seconds for r in results if r.status == "compiled"), 3),
    }


def print_table(report: dict[str, Any], stream: Any = None) -> None:
    from ..cache.maintenance import format_bytes
    from ..report.model import format_ranks

    stream = stream or sys.stdout
    rows = report["graphs"]
    ranked = report.get("world_size", 1) > 1  # each distinct graph once, with its ranks
    print(
        f"{'graph':<44} {'status':<15} {'seconds':>8} {'NEFF':>11}"
        + (f"  {'ranks':<8}" if ranked else "")
        + "  error",
        file=stream,
    )
    for r in rows:
        err = " ".join(x for x in (r["error_code"], r["ncc_code"], r["triage"]) if x)
        ranks = f"  {format_ranks(r.get('ranks', [])) or '-':<8}" if ranked else ""
        print(
            f"{r['graph_name']:<44} {r['status']:<15} {r['seconds']:>8.2f} "
            f"{format_bytes(r['neff_bytes']):>11}{ranks}  {err}",
            file=stream,
        )
    s = report["summary"]
    print(
        f"{s['graphs']} graphs for {report['target']}"
        + (f" (distinct over {report['world_size']} ranks)" if ranked else "")
        + ": "
        + ", ".join(f"{v} {k}" for k, v in sorted(s["counts"].items()))
        + (
            f"; cache hit rate {100 * rate:.0f} %"
            if (rate := s["cache_hit_rate"]) is not None
            else ""
        )
        + f"; {report['workers']} workers; "
        f"collection {report['collect_seconds']:.1f} s, compile {report['compile_seconds']:.1f} s",
        file=stream,
    )


def add_parser(sub: Any) -> None:
    """Register ``neuron-compile precompile`` on the CLI's subparsers."""
    p = sub.add_parser(
        "precompile",
        help="run a script in graph-collection mode, then compile its graphs to NEFFs in parallel",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("script", nargs="?", help="the training/inference script to run")
    p.add_argument(
        "script_args", nargs="*", help="arguments for the script (after our options and --)"
    )
    p.add_argument(
        "--args",
        dest="args_str",
        default="",
        help='arguments for the script as one string: --args "--samples 48"',
    )
    p.add_argument("--target", default="trn2", choices=("trn2", "trn3"))
    p.add_argument("--buckets", help="NEURON_COMPILE_BUCKETS for the script, e.g. 128,256,512")
    p.add_argument("--jobs", "-j", type=int, help="parallel compiles (default: cores and RAM)")
    p.add_argument(
        "--ram-per-job",
        type=float,
        default=DEFAULT_RAM_PER_JOB / 2**30,
        help="host RAM one neuronx-cc needs, GiB (bounds the pool; default 8)",
    )
    p.add_argument("--dir", help="collection directory (default: a new temporary one)")
    p.add_argument("--from", dest="from_dir", help="skip collection: compile jobs in this dir")
    p.add_argument("--only", action="append", help="compile only this graph (repeatable)")
    p.add_argument(
        "--retry-failed", action="store_true", help="ignore cached failures (negative entries)"
    )
    p.add_argument(
        "--nproc-per-node",
        type=int,
        metavar="N",
        help="run the script as N ranks under torchrun (torch.distributed); each distinct graph "
        "is compiled once and reported with the ranks that produced it",
    )
    p.add_argument("--report", help="also write the JSON report here")
    p.add_argument("--json", dest="json_out", action="store_true", help="print the JSON report")
    p.set_defaults(run=main)


def main(args: argparse.Namespace, as_json: bool = False) -> int:
    from .neuronx_cc import find_neuronx_cc, not_found_reason

    as_json = as_json or args.json_out
    if find_neuronx_cc() is None:
        print(f"neuron-compile precompile: {not_found_reason()}", file=sys.stderr)
        return 2
    if args.nproc_per_node is not None and args.nproc_per_node < 1:
        print("neuron-compile precompile: --nproc-per-node must be >= 1", file=sys.stderr)
        return 2
    if args.retry_failed:
        os.environ["NEURON_COMPILE_CACHE_RETRY_FAILED"] = "1"
    collect_s = 0.0
    status = 0
    if args.from_dir:
        root = Path(args.from_dir)
    else:
        if not args.script:
            print("neuron-compile precompile: give SCRIPT or --from DIR", file=sys.stderr)
            return 2
        root = Path(args.dir or tempfile.mkdtemp(prefix="nc-precompile-"))
        root.mkdir(parents=True, exist_ok=True)
        for old in (root / "jobs").glob("*"):
            old.unlink()
        extra = {"NEURON_COMPILE_BUCKETS": args.buckets} if args.buckets else {}
        t = time.perf_counter()
        script_args = [*args.script_args, *shlex.split(args.args_str)]
        print(f"collecting graphs: {shlex.join([args.script, *script_args])}", file=sys.stderr)
        status = run_script(
            args.script, script_args, root, args.target, extra, args.nproc_per_node,
            stdout=sys.stderr if as_json else None,  # --json: stdout holds the report alone
        )  # fmt: skip
        collect_s = time.perf_counter() - t
        if status != 0:
            print(
                f"neuron-compile precompile: the script exited with status {status}; "
                "compiling the graphs it produced before that",
                file=sys.stderr,
            )
    jobs = load_jobs(root)
    if args.only:
        jobs = [j for j in jobs if j["graph_name"] in set(args.only)]
        for j in jobs:  # retrying named graphs: recheck the cache instead of trusting collection
            j["cached_at_collection"] = False
    todo = sum(not j.get("cached_at_collection") for j in jobs)
    workers = pool_size(args.jobs, todo, int(args.ram_per_job * 2**30))
    print(f"{len(jobs)} graphs collected, {todo} to compile, {workers} workers", file=sys.stderr)
    collected_none = not jobs and not args.from_dir
    if collected_none:
        print(
            "neuron-compile precompile: no graph reached the neuron backend; does the script "
            'compile with torch.compile(..., backend="neuron") (or set '
            'torch.compiler.set_default_backend("neuron"))?',
            file=sys.stderr,
        )
    t = time.perf_counter()
    results = compile_jobs(jobs, workers, Progress(len(jobs)))
    ranks = {j["key"]: j.get("ranks", []) for j in jobs}
    report = {
        "target": args.target,
        "script": args.script,
        "collect_dir": str(root),
        "script_status": status,
        "world_size": args.nproc_per_node
        or max((max(r) + 1 for r in ranks.values() if r), default=1),
        "workers": workers,
        "collect_seconds": round(collect_s, 3),
        "compile_seconds": round(time.perf_counter() - t, 3),
        "summary": summarize(results),
        "graphs": [{**asdict(r), "ranks": ranks.get(r.key, [])} for r in results],
    }
    text = json.dumps(report, indent=2)
    (root / "report.json").write_text(text)
    if args.report:
        Path(args.report).write_text(text)
    if as_json:
        print(text)
    else:
        print_table(report)
    return 1 if report["summary"]["failed"] or status or collected_none else 0
