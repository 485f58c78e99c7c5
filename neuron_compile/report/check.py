"""``neuron-compile check``: run a script, a ``module:function`` or a pytest selection under the
backend and report graph breaks, fallbacks, downcasts, recompiles, compile errors (and, in run
mode, numerics against eager) in every format; exit non-zero on ``--fail-on`` findings.

Targets:

- ``path/to/script.py [-- ARGS...]``: run as ``__main__`` with ``sys.argv = [script, *ARGS]``;
- ``pkg.module:function [-- ARGS...]``: imported and called with ``ARGS`` (strings). If it returns
  ``(model, example_inputs)``, the model is compiled with ``backend="neuron"`` and called once
  (and, when the output requires grad, its sum is backpropagated so backward graphs compile too);
- ``tests/test_x.py::test_y``, or ``--pytest SELECTION [-- MORE...]``: run by pytest in this process.

``torch.compile(model)`` without a backend uses ``neuron`` during a check (``--keep-default-backend``
turns that off). Exit codes: see ``gate.py``.

``--nproc-per-node N`` runs the target as N torch.distributed ranks under torchrun
(``ranks.py``): each rank checks in its own process and writes its report, and this process
merges them (one row per distinct graph, with its ranks) and gates on the merged report.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import runpy
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def add_check_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``check`` on the CLI's subparsers; ``args.check_run(args)`` runs it."""
    p = sub.add_parser(
        "check",
        help="compile a model on this machine and report graph breaks, fallbacks, downcasts, "
        "recompiles and compile errors (JSON, JUnit, Markdown, SARIF)",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit codes: 0 ok, 1 findings in --fail-on categories (or regressions with "
        "--baseline), 2 usage error, 3 the target crashed for a reason other than compilation",
    )
    p.add_argument("target", nargs="?", help="script.py, module:function, or a pytest node id")
    # Arguments for the target follow ``--`` anywhere on the line; cli.main splits them off
    # before argparse sees them (an nargs="*" positional cannot follow options).
    p.set_defaults(target_args=[])
    p.add_argument("--pytest", action="store_true", help="the target is a pytest selection")
    p.add_argument(
        "--mode",
        choices=("compile", "run"),
        default="compile",
        help="run: also compare every compiled frame's outputs with eager on the CPU",
    )
    p.add_argument(
        "--fail-on",
        default=None,
        metavar="CATS",
        help="comma list of graph-break,fallback,recompile,downcast,compile-error,eager-frame,"
        "mismatch (or all, none); default: compile-error,eager-frame,mismatch",
    )
    p.add_argument("--baseline", metavar="REPORT_JSON", help="fail only on regressions vs it")
    p.add_argument("--out", metavar="DIR", help="write report.{json,junit.xml,md,sarif} here")
    for fmt in ("json", "junit", "markdown", "sarif"):
        p.add_argument(f"--{fmt}", dest=f"{fmt}_path", metavar="PATH", help=f"write {fmt} here")
    p.add_argument("--bundle-dir", metavar="DIR", help="failure bundles (default: OUT/bundles)")
    p.add_argument("--rtol", type=float, default=1e-4, help="run mode tolerance")
    p.add_argument("--atol", type=float, default=1e-4, help="run mode tolerance")
    p.add_argument("--quiet", action="store_true", help="no terminal summary")
    p.add_argument(
        "--keep-default-backend",
        action="store_true",
        help="do not make 'neuron' the default torch.compile backend during the check",
    )
    p.add_argument("--print-schema", action="store_true", help="print the report JSON schema")
    p.add_argument(
        "--nproc-per-node",
        type=int,
        metavar="N",
        help="run the target as N ranks under torchrun (torch.distributed) and report every "
        "rank's graphs, each distinct graph once with its ranks",
    )
    p.set_defaults(check_run=run_check)
    return p


def _load_target(args: argparse.Namespace) -> tuple[str, Callable[[Any], None]]:
    """``(kind, run)``; raises ValueError for a target that does not resolve."""
    target = args.target
    if args.pytest or "::" in target:
        selection = [target, *args.target_args]
        return "pytest", lambda c: _run_pytest(selection, c)
    if target.endswith(".py") or os.path.isfile(target):
        path = Path(target)
        if not path.is_file():
            raise ValueError(f"no such script: {target}")
        return "script", lambda c: _run_script(path, args.target_args)
    if ":" in target:
        module_name, _, fn_name = target.partition(":")
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            fn = getattr(importlib.import_module(module_name), fn_name)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"cannot load {target}: {e}") from e
        return "function", lambda c: _run_function(fn, args.target_args)
    raise ValueError(f"target {target!r} is not a script.py, module:function or pytest node id")


def _run_script(path: Path, argv: list[str]) -> None:
    saved = sys.argv[:], sys.path[:]
    sys.argv = [str(path), *argv]
    sys.path.insert(0, str(path.resolve().parent))
    try:
        runpy.run_path(str(path), run_name="__main__")
    finally:
        sys.argv, sys.path[:] = saved[0], saved[1]


def _run_function(fn: Callable[..., Any], argv: list[str]) -> None:
    import torch

    out = fn(*argv)
    if not (isinstance(out, tuple) and len(out) == 2 and callable(out[0])):
        return
    model, inputs = out
    inputs = inputs if isinstance(inputs, (tuple, list)) else (inputs,)
    result = torch.compile(model, backend="neuron")(*inputs)
    from torch.utils._pytree import tree_flatten

    grads = [t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
    if grads:
        sum(t.float().sum() for t in grads).backward()


class _PytestBridge:
    """Keeps records across the test suite's own ``reset_metrics()`` fixtures."""

    def __init__(self, collector: Any) -> None:
        self.collector = collector
        self.failed = 0

    def pytest_runtest_call(self, item: Any) -> Any:  # plain hook: runs before the test body
        self.collector.snapshot()

    def pytest_runtest_teardown(self, item: Any) -> None:
        self.collector.snapshot()

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.failed:
            self.failed += 1

    def pytest_exception_interact(self, node: Any, call: Any, report: Any) -> None:
        self.collector.note_exception(call.excinfo.value, crash=False)


def _run_pytest(selection: list[str], collector: Any) -> None:
    import pytest

    bridge = _PytestBridge(collector)
    status = pytest.main([*selection, "-q", "-p", "no:cacheprovider"], plugins=[bridge])
    if int(status) not in (0, 1) or (bridge.failed and not collector.failures):
        raise RuntimeError(f"pytest exited with status {int(status)} ({bridge.failed} failed)")


def run_check(args: argparse.Namespace) -> int:
    from . import gate
    from .ranks import ENV_RANK_REPORT_DIR

    if args.print_schema:
        from .schema import REPORT_SCHEMA

        print(json.dumps(REPORT_SCHEMA, indent=2))
        return gate.EXIT_OK
    if not args.target:
        print("neuron-compile check: a target is required", file=sys.stderr)
        return gate.EXIT_USAGE
    try:
        fail_on = gate.parse_fail_on(args.fail_on)
        baseline = gate.load_baseline(args.baseline) if args.baseline else None
        if args.nproc_per_node is not None and args.nproc_per_node < 1:
            raise ValueError("--nproc-per-node must be >= 1")
        kind, run = _load_target(args)
        _check_destinations(args)  # before the target runs, which may take long
    except (ValueError, OSError, KeyError) as e:
        print(f"neuron-compile check: {e}", file=sys.stderr)
        return gate.EXIT_USAGE
    rank_dir = os.environ.get(ENV_RANK_REPORT_DIR)
    if rank_dir:  # one rank of a --nproc-per-node check: its report goes to the parent
        from .ranks import rank_report_path

        rank = int(os.environ.get("RANK", "0"))
        if args.bundle_dir:
            args.bundle_dir = os.path.join(args.bundle_dir, f"rank{rank}")
        report, finished = _check_here(args, run)
        rank_report_path(rank_dir, rank).write_text(json.dumps(report.to_dict(), default=str))
        # The parent gates. A target that stopped early fails this rank, so torchrun stops the
        # others (which could wait for it in a collective forever), as it would without check.
        return gate.EXIT_OK if finished else gate.EXIT_CRASH
    report = _check_ranks(args) if args.nproc_per_node else _check_here(args, run)[0]
    return _emit(report, args, fail_on, baseline)


def _bundle_dir(args: argparse.Namespace) -> str | None:
    return args.bundle_dir or (os.path.join(args.out, "bundles") if args.out else None)


def _check_here(args: argparse.Namespace, run: Callable[[Any], None]) -> tuple[Any, bool]:
    """Run the target in this process under a collector: its report, and whether the target
    ran to its end (no exception, no non-zero exit)."""
    import torch

    from .collect import Collector

    previous_backend = torch.compiler.get_default_backend()
    if not args.keep_default_backend:
        torch.compiler.set_default_backend("neuron")
    label = " ".join([args.target, *args.target_args])
    collector = Collector(
        label, args.mode, bundle_dir=_bundle_dir(args), rtol=args.rtol, atol=args.atol
    )
    finished = False
    with collector:
        try:
            run(collector)
            finished = True
        except SystemExit as e:
            finished = e.code in (0, None)
            if not finished and not collector.failures:
                collector.crash = f"the target exited with status {e.code}"
        except Exception as e:
            collector.note_exception(e)
        finally:
            torch.compiler.set_default_backend(previous_backend)
    return collector.report(), finished


def _check_ranks(args: argparse.Namespace) -> Any:
    """Run the target as ``--nproc-per-node`` ranks, one check per rank; the merged report."""
    import shutil
    import tempfile

    from .model import Report
    from .ranks import ENV_RANK_REPORT_DIR, load_rank_reports, merge_reports, run_ranks

    n = args.nproc_per_node
    argv = ["-m", "neuron_compile", "check", args.target, "--mode", args.mode]
    argv += ["--rtol", repr(args.rtol), "--atol", repr(args.atol)]
    argv += ["--pytest"] * args.pytest + ["--keep-default-backend"] * args.keep_default_backend
    bundle_dir = _bundle_dir(args)
    if bundle_dir:
        argv += ["--bundle-dir", os.path.abspath(bundle_dir)]  # each rank: bundle_dir/rank<k>
    if args.target_args:
        argv += ["--", *args.target_args]
    rank_dir = tempfile.mkdtemp(prefix="nc-check-ranks-")
    try:
        status = run_ranks(n, argv, {ENV_RANK_REPORT_DIR: rank_dir})
        by_rank = load_rank_reports(rank_dir, n)
    finally:
        shutil.rmtree(rank_dir, ignore_errors=True)
    label = " ".join([args.target, *args.target_args])
    report = merge_reports(by_rank, n) if by_rank else Report(label, args.mode, world_size=n)
    missing = [r for r in range(n) if r not in by_rank]
    if missing:
        lost = f"rank(s) {', '.join(map(str, missing))} wrote no report (torchrun status {status})"
        report.crash = f"{report.crash}; {lost}" if report.crash else lost
    return report


_FILE_FORMATS = ("json", "junit", "markdown", "sarif")


def _check_destinations(args: argparse.Namespace) -> None:
    """``ValueError`` for a report path that can never be written (a directory, or a parent
    that cannot be made), found before the target runs rather than after."""
    dirs = [Path(args.out)] if args.out else []
    for fmt in _FILE_FORMATS:
        dest = getattr(args, f"{fmt}_path")
        if dest and Path(dest).is_dir():
            raise ValueError(f"--{fmt} {dest} is a directory: give a file name")
        dirs += [Path(dest).parent] if dest else []
    for d in dirs:
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ValueError(f"cannot create report directory {d}: {e.strerror or e}") from e


def _emit(report: Any, args: argparse.Namespace, fail_on: Any, baseline: Any) -> int:
    """Write the requested formats, print the summary and verdict; the exit code (usage, 2,
    when a report could not be written: the verdict alone must not pass a CI gate)."""
    from . import formats, gate

    paths: dict[str, Path] = {}
    failed: list[str] = []
    if args.out:
        try:
            paths.update(formats.write_all(report, args.out, fail_on))
        except OSError as e:
            failed.append(f"cannot write reports to {args.out}: {e}")
    for fmt in _FILE_FORMATS:
        dest = getattr(args, f"{fmt}_path")
        if dest:
            try:  # its directory exists: _check_destinations made it before the target ran
                Path(dest).write_text(formats.RENDERERS[fmt](report, fail_on))
                paths[fmt] = Path(dest)
            except OSError as e:
                failed.append(f"cannot write the {fmt} report to {dest}: {e}")
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        try:
            with open(summary, "a", encoding="utf-8") as f:
                f.write(formats.render_markdown(report, fail_on))
        except OSError as e:
            failed.append(f"cannot append to GITHUB_STEP_SUMMARY={summary}: {e}")
    code, verdict = gate.exit_code(report, fail_on, baseline)
    if not args.quiet:
        sys.stdout.write(formats.render_terminal(report, fail_on))
        for fmt, path in paths.items():
            print(f"  wrote {fmt}: {path}")
    print(verdict)
    for problem in failed:
        print(f"neuron-compile check: {problem}", file=sys.stderr)
    return gate.EXIT_USAGE if failed else code
