"""pytest plugin (entry point ``pytest11``): ``pytest --neuron-report=out/``.

Records whatever the tests compile with the neuron backend (graph breaks, fallbacks, downcasts,
recompiles, compile errors with failure bundles) and writes ``out/report.{json,junit.xml,md,
sarif}`` at session end. ``--neuron-fail-on=CATS`` also fails the session (exit status 1) on
findings in those categories; without it the report never changes the session's outcome.

Nothing is imported from neuron-compile (or torch) unless ``--neuron-report`` is given.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("neuron-compile", "neuron-compile compile report")
    group.addoption(
        "--neuron-report",
        metavar="DIR",
        default=None,
        help="write a neuron-compile report (JSON, JUnit, Markdown, SARIF) of every graph the "
        "tests compile into DIR",
    )
    group.addoption(
        "--neuron-fail-on",
        metavar="CATS",
        default=None,
        help="fail the session on findings in these categories "
        "(graph-break,fallback,recompile,downcast,compile-error,eager-frame,mismatch; all; "
        "none); the report marks compile-error,eager-frame,mismatch when it is not given",
    )
    group.addoption(
        "--neuron-mode",
        choices=("compile", "run"),
        default="compile",
        help="run: also compare compiled frames' outputs with eager",
    )


def pytest_configure(config: Any) -> None:
    out = config.getoption("--neuron-report", default=None)
    if out:
        config.pluginmanager.register(NeuronReportPlugin(config, out), "neuron-compile-report")


class NeuronReportPlugin:
    """One ``Collector`` over the whole session; snapshots survive per-test metric resets."""

    def __init__(self, config: Any, out: str) -> None:
        from .report.collect import Collector
        from .report.gate import parse_fail_on

        self.out = Path(out)
        spec = config.getoption("--neuron-fail-on")
        self.gate = spec is not None
        self.fail_on = parse_fail_on(spec)  # without --neuron-fail-on: marks, never fails
        target = "pytest " + " ".join(str(a) for a in config.args)
        self.collector = Collector(
            target, config.getoption("--neuron-mode"), bundle_dir=str(self.out / "bundles")
        )
        self.collector.__enter__()
        self.summary: str | None = None
        self.paths: dict[str, Path] = {}

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item: Any) -> Any:
        self.collector.snapshot()  # before: fixtures may have compiled; after: before teardown
        yield
        self.collector.snapshot()

    def pytest_exception_interact(self, node: Any, call: Any, report: Any) -> None:
        self.collector.note_exception(call.excinfo.value, crash=False)

    def pytest_sessionfinish(self, session: Any, exitstatus: int) -> None:
        from .report import formats, gate

        self.collector.__exit__(None, None, None)
        report = self.collector.report()
        self.paths = formats.write_all(report, self.out, self.fail_on)
        self.summary = formats.render_terminal(report, self.fail_on)
        if self.gate:
            code, verdict = gate.exit_code(report, self.fail_on)
            self.summary += verdict + "\n"
            if code and session.exitstatus == 0:
                session.exitstatus = code

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.summary is None:
            return
        terminalreporter.section("neuron-compile report")
        terminalreporter.write(self.summary)
        for fmt, path in self.paths.items():
            terminalreporter.write_line(f"wrote {fmt}: {path}")
