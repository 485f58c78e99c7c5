"""Run the OpInfo conformance sweep: ``python -m tests.conformance.run --help``.

The full float32 run (documented command)::

    python -m tests.conformance.run --csv conformance.csv --markdown coverage.md

prints the summary table, writes one CSV row per (op, variant, dtype, phase) as entries finish and
a generated Markdown coverage section (``--doc docs/conformance.md`` rewrites the one in the docs).

Cold and warm (``warm.py``): ``--warm`` runs the selection in a cold process on empty cache
directories, then in a warm one on the same directories, and checks that no entry changes and
every stored frame loads; the report gains a warm column and the exit status is 1 on any
difference::

    python -m tests.conformance.run --warm --csv conformance.csv --markdown coverage.md

A trn target (``--target trn2``): every compile gets ``options={"target": "trn2"}``, so each
graph is lowered with the trn forms and checked by the legality rules (without neuronx-cc it then
runs on XLA CPU and is compared with eager as usual). An entry whose graph a rule rejects is
``illegal``, its reason led by our code, the neuronx-cc code and the rule; the run prints how
many entries each rule rejects, and ``--summary-json`` writes that and every entry's outcome,
which ``--baseline`` (another run's summary JSON, e.g. the cpu sweep's) compares against::

    python -m tests.conformance.run --target trn2 --summary-json trn2.json --baseline cpu.json
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import torch

from neuron_compile.targets import target_names

from . import harness, opinfo, promotion, report, warm


def _progress(enabled: bool):
    tty = sys.stderr.isatty()
    start = time.perf_counter()

    def show(i: int, n: int, label: str) -> None:
        if not enabled:
            return
        elapsed = time.perf_counter() - start
        line = f"[{i}/{n}] {elapsed:6.0f}s {label}"
        if tty:
            sys.stderr.write("\r" + line[:100].ljust(100) + ("\n" if i == n else ""))
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    return show


def _quiet_torch_logs() -> None:
    """Failing entries are expected here; PyTorch's own warnings about them (tracebacks of
    suppressed eager backward compiles, recompiles) would bury the progress lines."""
    for name in ("torch._dynamo", "torch._functorch", "torch.fx", "torch._subclasses"):
        logging.getLogger(name).setLevel(logging.ERROR)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.conformance.run", description=__doc__)
    p.add_argument("--ops", help="comma-separated OpInfo names (name or name.variant); default all")
    p.add_argument("--dtypes", default="float32", help="comma-separated, e.g. float32,bfloat16")
    p.add_argument("--limit", type=int, help="only the first N selected OpInfos")
    p.add_argument("--samples", type=int, default=harness.DEFAULT_SAMPLES, help="per entry")
    p.add_argument("--timeout", type=float, default=harness.DEFAULT_TIMEOUT, help="s per entry")
    p.add_argument("--csv", type=Path, help="write one row per (op, variant, dtype, phase)")
    p.add_argument("--markdown", type=Path, help="write the generated coverage section")
    p.add_argument(
        "--doc",
        type=Path,
        help="replace the generated coverage section of this Markdown file (between its markers), "
        "e.g. docs/conformance.md",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument(
        "--target",
        help="compile for this target (e.g. trn2: trn forms and legality rules, run on XLA CPU "
        "without neuronx-cc); default cpu, the options as they are",
    )
    p.add_argument(
        "--summary-json",
        type=Path,
        help="write the totals, the entries each legality rule rejects and every entry's outcome",
    )
    p.add_argument(
        "--baseline",
        type=Path,
        help="another run's --summary-json: print every entry whose outcome differs from it",
    )
    p.add_argument("--expectations", type=Path, default=opinfo.EXPECTATIONS)
    p.add_argument(
        "--from-csv", type=Path, nargs="+", help="summarize earlier runs' CSVs instead of running"
    )
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.add_argument("--verbose", action="store_true", help="keep PyTorch's warnings and logs")
    p.add_argument(
        "--warm",
        action="store_true",
        help="run cold, then warm on the same cache directories, and compare (warm.py)",
    )
    p.add_argument(
        "--cache-root",
        type=Path,
        help="with --warm: an empty directory for both caches and the runs' JSONL (default: "
        "a temporary directory, removed afterwards)",
    )
    p.add_argument(
        "--promotion",
        action="store_true",
        help="run the mixed-dtype samples instead (promotion.py): binary ops and backward ops "
        "over a grad and an input with operands of different dtypes",
    )
    # A --warm child process: run the selection from entry N, appending JSON lines to PATH.
    p.add_argument("--probe-out", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--probe-start", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.target is not None and args.target not in target_names():
        p.error(f"unknown target {args.target!r}; choose from {', '.join(target_names())}")
    if args.target is not None and args.doc:
        p.error("--doc rewrites the cpu sweep's section of the docs; use --markdown with --target")
    if not args.verbose:
        _quiet_torch_logs()

    if args.promotion:
        return promotion.main()

    started = time.perf_counter()
    warm_run = None
    if args.from_csv:
        results = []
        for path in args.from_csv:
            with open(path, newline="") as f:
                results += report.read_csv(f)
    elif args.warm:
        warm_run = _cold_then_warm(args)
        results = warm_run.results()
    else:
        try:
            dtypes = [opinfo.DTYPES[d.strip()] for d in args.dtypes.split(",") if d.strip()]
        except KeyError as e:
            p.error(f"unknown dtype {e}; choose from {', '.join(opinfo.DTYPES)}")
        names = [n.strip() for n in args.ops.split(",") if n.strip()] if args.ops else None
        try:
            ops = opinfo.select_ops(opinfo.load_op_db(), names)
        except KeyError as e:
            p.error(str(e.args[0]))
        ops = ops[: args.limit] if args.limit else ops
        expectations = opinfo.load_expectations(args.expectations)
        if args.probe_out:
            with harness.compiling_for(args.target):
                warm.probe_sweep(
                    warm.work_list(ops, dtypes),
                    args.probe_out,
                    start=args.probe_start,
                    progress=_progress(not args.quiet),
                    samples=args.samples,
                    timeout=args.timeout,
                    expectations=expectations,
                )
            return 0
        results = []
        csv_file = open(args.csv, "w", newline="") if args.csv else None  # noqa: SIM115
        writer = report.CsvWriter(csv_file) if csv_file else None
        try:
            sweep = harness.run_sweep(
                ops,
                dtypes,
                samples=args.samples,
                timeout=args.timeout,
                expectations=expectations,
                progress=_progress(not args.quiet),
            )
            with harness.compiling_for(args.target):  # the generator compiles as it is read
                for r in sweep:
                    results.append(r)
                    if writer:
                        writer.write(r)
        finally:
            if csv_file:
                csv_file.close()
    elapsed = time.perf_counter() - started

    summary = report.summarize(results)
    if args.json:
        print(json.dumps([s.as_dict() for s in summary.values()], indent=2))
    else:
        print(report.format_table(summary))
        print(f"\n{len(results)} rows in {elapsed:.0f} s")
    if warm_run is not None and not args.json:
        print("\n" + report.warm_text(warm_run.counts(), warm_run.failures(), _seconds(warm_run)))
    _target_report(args, results)
    warm_flag = " --warm" if args.warm else ""
    if args.csv and warm_run is not None:  # the children's rows, now with the warm column
        with open(args.csv, "w", newline="") as f:
            writer = report.CsvWriter(f)
            for r in results:
                writer.write(r)
    if args.markdown:
        dtypes = ",".join(dict.fromkeys(r.dtype for r in results))
        command = f"python -m tests.conformance.run --dtypes {dtypes}{warm_flag}"
        command += f" --target {args.target}" if args.target else ""
        command += " --markdown coverage.md"
        if args.samples != harness.DEFAULT_SAMPLES:
            command += f" --samples {args.samples}"
        meta = {"commit": _commit(), "torch": torch.__version__, "jax": jax.__version__}
        args.markdown.write_text(report.markdown(results, command=command, meta=meta))
    if args.doc:
        dtypes = ",".join(dict.fromkeys(r.dtype for r in results))
        command = f"python -m tests.conformance.run --dtypes {dtypes}{warm_flag} --doc {DOC_PATH}"
        meta = {"commit": _commit(), "torch": torch.__version__, "jax": jax.__version__}
        section = report.markdown(results, command=command, meta=meta)
        args.doc.write_text(replace_section(args.doc.read_text(), section))
    return 1 if warm_run is not None and warm_run.failures() else 0


def _cold_then_warm(args: argparse.Namespace) -> warm.WarmRun:
    """Run the selection of ``args`` in a cold, then a warm child process (warm.py)."""
    child = ["--dtypes", args.dtypes, "--samples", str(args.samples)]
    child += ["--timeout", str(args.timeout), "--expectations", str(args.expectations)]
    child += ["--ops", args.ops] if args.ops else []
    child += ["--limit", str(args.limit)] if args.limit else []
    child += ["--verbose"] if args.verbose else []
    child += ["--target", args.target] if args.target else []
    progress = _progress(not args.quiet)
    if args.cache_root is not None:
        args.cache_root.mkdir(parents=True, exist_ok=True)
        return warm.run_cold_warm(child, args.cache_root, progress=progress)
    with tempfile.TemporaryDirectory(prefix="conformance-warm-") as tmp:
        return warm.run_cold_warm(child, Path(tmp), progress=progress)


def _target_report(args: argparse.Namespace, results: list[harness.Result]) -> None:
    """The per-rule summary (printed for a trn target), ``--summary-json``, ``--baseline``."""
    summary = report.rule_summary(results, args.target)
    if args.target not in (None, "cpu") and not args.json:
        print("\n" + report.format_rule_summary(summary))
    if args.summary_json:
        args.summary_json.write_text(json.dumps(summary, indent=1) + "\n")
    if args.baseline:
        before = json.loads(args.baseline.read_text())
        changed = report.compare_summaries(before, summary)
        print(f"\n{len(changed)} entries differ from {args.baseline} ({before['target']}):")
        print("\n".join(f"  {line}" for line in changed))


def _seconds(run: warm.WarmRun) -> dict[str, float]:
    return {"cold": run.cold.seconds, "warm": run.warm.seconds}


#: The Markdown file whose generated section ``--doc`` rewrites (between the markers below).
DOC_PATH = "docs/conformance.md"
DOC_START = "<!-- conformance:start (generated by tests/conformance/run.py --doc) -->"
DOC_END = "<!-- conformance:end -->"


def replace_section(doc: str, section: str) -> str:
    """``doc`` with the text between the conformance markers replaced by ``section``."""
    start, end = doc.index(DOC_START), doc.index(DOC_END)
    return doc[: start + len(DOC_START)] + "\n" + section.rstrip() + "\n" + doc[end:]


def _commit() -> str:
    """Short commit of the checkout (``+dirty`` with uncommitted changes), or ``unknown``."""
    root = Path(__file__).resolve().parents[2]
    git = ["git", "-C", str(root)]
    try:
        head = subprocess.run(
            [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        )
        dirty = subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True)
    except OSError:
        return "unknown"
    if head.returncode != 0:
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


if __name__ == "__main__":
    sys.exit(main())
