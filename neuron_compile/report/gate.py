"""CI gating: ``--fail-on`` categories, ``--baseline`` regressions, exit codes.

Exit codes of ``neuron-compile check`` (and of the pytest plugin's gate):

| code | meaning |
|---|---|
| 0 | no finding in a ``--fail-on`` category (with ``--baseline``: no regression) |
| 1 | a finding in a ``--fail-on`` category (with ``--baseline``: more of them than the baseline) |
| 2 | usage error: bad arguments, target not found, unreadable baseline |
| 3 | the target raised an exception that is not a compile error: the report is incomplete |
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .model import CATEGORIES, Finding, Report

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2
EXIT_CRASH = 3

#: ``mismatch`` only exists in run mode, so a compile-mode check gates on compile errors and on
#: frames that never reached the backend (``eager-frame``: on Trainium they run on the host CPU).
DEFAULT_FAIL_ON = ("compile-error", "eager-frame", "mismatch")


def parse_fail_on(spec: str | Iterable[str] | None) -> tuple[str, ...]:
    """``"graph-break,fallback"`` -> categories; ``all``, ``none``; unknown names raise."""
    if spec is None:
        return DEFAULT_FAIL_ON
    words = spec.split(",") if isinstance(spec, str) else list(spec)
    words = [w.strip() for w in words if w.strip()]
    if words == ["none"]:
        return ()
    if words == ["all"]:
        return CATEGORIES
    bad = [w for w in words if w not in CATEGORIES]
    if bad:
        raise ValueError(
            f"unknown --fail-on categor{'y' if len(bad) == 1 else 'ies'} {', '.join(bad)}; "
            f"choose from {', '.join(CATEGORIES)}, all, none"
        )
    return tuple(c for c in CATEGORIES if c in words)


def gated(report: Report, fail_on: Iterable[str]) -> list[Finding]:
    cats = set(fail_on)
    return [f for f in report.findings if f.category in cats]


def _tally(findings: Iterable[Finding]) -> Counter:
    out: Counter = Counter()
    for f in findings:
        out[f.key()] += f.count
    return out


@dataclass
class BaselineDiff:
    added: list[tuple[tuple[str, ...], int]] = field(default_factory=list)  # key, extra count
    removed: list[tuple[tuple[str, ...], int]] = field(default_factory=list)

    @property
    def regressed(self) -> bool:
        return bool(self.added)

    def line(self) -> str:
        """One line for CI logs: ``baseline: +1 graph-break (model.py: ...); -1 fallback (...)``."""

        def fmt(sign: str, items: list) -> list[str]:
            return [
                f"{sign}{n} {cat} ({file or '?'}: {subject or code})"
                for (cat, code, file, subject), n in items
            ]

        parts = fmt("+", self.added) + fmt("-", self.removed)
        return "baseline: " + ("; ".join(parts) if parts else "no change")


def load_baseline(path: str | Path) -> Report:
    return Report.from_dict(json.loads(Path(path).read_text()))


def diff(report: Report, baseline: Report, fail_on: Iterable[str]) -> BaselineDiff:
    """Per (category, code, file, subject): count now vs. in the baseline, gated categories only."""
    now, then = _tally(gated(report, fail_on)), _tally(gated(baseline, fail_on))
    out = BaselineDiff()
    for key in sorted(set(now) | set(then)):
        delta = now[key] - then[key]
        if delta > 0:
            out.added.append((key, delta))
        elif delta < 0:
            out.removed.append((key, -delta))
    return out


def exit_code(
    report: Report, fail_on: Iterable[str], baseline: Report | None = None
) -> tuple[int, str]:
    """The exit code and a one-line verdict."""
    if report.crash:
        return EXIT_CRASH, f"FAIL: the target crashed ({report.crash})"
    if baseline is not None:
        d = diff(report, baseline, fail_on)
        return (EXIT_FINDINGS if d.regressed else EXIT_OK), d.line()
    bad = gated(report, fail_on)
    if bad:
        cats = sorted({f.category for f in bad})
        n = sum(f.count for f in bad)
        return EXIT_FINDINGS, f"FAIL: {n} finding(s) in --fail-on categories: {', '.join(cats)}"
    return EXIT_OK, "OK: no finding in --fail-on categories"
