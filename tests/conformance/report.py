"""Summaries of conformance results: per-dtype counts, CSV, text table and the Markdown of docs/conformance.md."""

from __future__ import annotations

import csv
import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import IO, Any

from .harness import OUTCOMES, Result, entry_outcome

CSV_FIELDS = (
    "op",
    "variant",
    "dtype",
    "phase",
    "outcome",
    "reason",
    "max_abs_err",
    "max_rel_err",
    "warm",
)


class CsvWriter:
    """Writes rows as they arrive, so a killed run still leaves every finished entry on disk."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._writer = csv.DictWriter(stream, fieldnames=CSV_FIELDS)
        self._writer.writeheader()

    def write(self, result: Result) -> None:
        self._writer.writerow(result.as_row())
        self._stream.flush()


def read_csv(stream: IO[str]) -> list[Result]:
    rows = []
    for row in csv.DictReader(stream):
        for k in ("max_abs_err", "max_rel_err"):
            row[k] = float(row[k]) if row.get(k) else None
        row.setdefault("warm", "")  # CSVs written before the warm mode existed
        rows.append(Result(**{k: row[k] for k in CSV_FIELDS}))
    return rows


def entries(results: Iterable[Result]) -> dict[tuple[str, str, str], Result]:
    """(op, variant, dtype) -> overall result (forward + backward)."""
    grouped: dict[tuple[str, str, str], list[Result]] = defaultdict(list)
    for r in results:
        grouped[r.entry].append(r)
    return {k: entry_outcome(rs) for k, rs in grouped.items()}


@dataclass
class DtypeSummary:
    dtype: str
    counts: Counter = field(default_factory=Counter)  # outcome -> entries
    phase_counts: dict[str, Counter] = field(default_factory=dict)  # phase -> outcome -> rows
    warm: Counter = field(default_factory=Counter)  # "same" | "differs" -> entries (--warm)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def attempted(self) -> int:
        return self.total - self.counts["skip"]

    @property
    def pass_rate(self) -> float:
        return self.counts["pass"] / self.attempted if self.attempted else 0.0

    def phase_rate(self, phase: str) -> tuple[int, int]:
        c = self.phase_counts.get(phase, Counter())
        return c["pass"], sum(c.values()) - c["skip"]

    def warm_cell(self) -> str:
        """``same/compared`` entries of a warm run, or "" without one."""
        compared = sum(self.warm.values())
        return f"{self.warm['same']}/{compared}" if compared else ""

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"dtype": self.dtype, "entries": self.total}
        d["attempted"] = self.attempted
        # "illegal" (a trn target's legality rules) only where it happens: cpu JSON as before
        d.update({o: self.counts[o] for o in OUTCOMES if o != "illegal" or self.counts[o]})
        d["pass_rate"] = round(self.pass_rate, 4)
        for phase in ("forward", "backward"):
            passed, attempted = self.phase_rate(phase)
            d[f"{phase}_pass"], d[f"{phase}_attempted"] = passed, attempted
        if self.warm:
            d["warm_same"], d["warm_differs"] = self.warm["same"], self.warm["differs"]
        return d


def summarize(results: list[Result]) -> dict[str, DtypeSummary]:
    out: dict[str, DtypeSummary] = {}
    for (_, _, dtype), r in entries(results).items():
        s = out.setdefault(dtype, DtypeSummary(dtype))
        s.counts[r.outcome] += 1
        if r.warm:
            s.warm["same" if r.warm.startswith("same") else "differs"] += 1
    for r in results:
        s = out[r.dtype]
        s.phase_counts.setdefault(r.phase, Counter())[r.outcome] += 1
    return out


_COLUMNS = ("entries", "skip", "attempted", "pass", "fallback", "xfail", "mismatch", "error")


def _columns(summary: dict[str, DtypeSummary]) -> tuple[str, ...]:
    """``_COLUMNS``, with ``illegal`` before ``error`` when a trn run has such entries."""
    if not any(s.counts["illegal"] for s in summary.values()):
        return _COLUMNS
    return (*_COLUMNS[:-1], "illegal", _COLUMNS[-1])


def format_table(summary: dict[str, DtypeSummary]) -> str:
    warm = any(s.warm for s in summary.values())
    columns = _columns(summary)
    head = ["dtype", *columns, "pass rate", "fwd pass", "bwd pass"] + (["warm same"] * warm)
    rows = [head]
    for s in summary.values():
        d = s.as_dict()
        fwd, bwd = s.phase_rate("forward"), s.phase_rate("backward")
        rows.append(
            [s.dtype, *(str(d[c]) for c in columns), f"{100 * s.pass_rate:.1f}%"]
            + [f"{p}/{a}" for p, a in (fwd, bwd)]
            + ([s.warm_cell()] * warm)
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows)


# --------------------------------------------------------------------------- gap grouping

_NUM = re.compile(r"(?<![A-Za-z_\d])\d+(\.\d+)?(e-?\d+)?")
_TENSOR_TYPE = re.compile(r"tensor<[^>]*>")
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")


def _normalize(text: str) -> str:
    return _NUM.sub("N", _TENSOR_TYPE.sub("tensor<...>", text))


def gap_group(r: Result) -> str:
    """A stable label for why an entry is not passing (what to fix), coarse enough to group."""
    reason = r.reason
    if r.outcome == "fallback":
        # "unsupported: op: why; op: why" (NC101) or "fell back: op: why; ..." (partitioner):
        # grouped by the first op that could not be lowered.
        detail = reason.split(": ", 1)[-1].split("; ")[0]
        op, _, why = detail.partition(": ")
        if not why or why.startswith("no lowering"):
            return f"no lowering for {op}"
        return f"{op} rejected: {_normalize(why)}"
    if r.outcome == "mismatch":
        kind = "dtype" if "dtype" in reason else "shape" if "shape" in reason else "values"
        if kind == "dtype":
            return f"{r.phase} {_QUOTED.sub('', reason.split(': ', 1)[-1])}"
        return f"{r.phase} numerical mismatch ({kind})"
    if r.outcome == "xfail":
        return "expected failure: " + reason.split(" [", 1)[0]
    if r.outcome == "illegal":  # "NC511 NCC_EVRF019 reduce_window: ..."
        return reason.split(":", 1)[0]
    return _normalize(reason)[:160]


def gaps(
    results: list[Result], dtype: str, exclude: set[str] = frozenset()
) -> list[tuple[str, str, list[str]]]:
    """``(outcome, group, [op names])`` for non-passing attempted entries, most common first
    (entries named in ``exclude`` left out)."""
    grouped: dict[tuple[str, str], list[str]] = defaultdict(list)
    for (op, variant, dt), r in entries(results).items():
        name = f"{op}.{variant}" if variant else op
        if dt != dtype or r.outcome in ("pass", "skip") or name in exclude:
            continue
        grouped[(r.outcome, gap_group(r))].append(name)
    ordered = sorted(grouped.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    return [(outcome, group, sorted(ops)) for (outcome, group), ops in ordered]


def skips(results: list[Result], dtype: str) -> list[tuple[str, list[str]]]:
    """``(reason group, [op names])`` of skipped entries, most common first."""
    grouped: dict[str, list[str]] = defaultdict(list)
    for (op, variant, dt), r in entries(results).items():
        if dt == dtype and r.outcome == "skip":
            parts = 3 if r.reason.startswith("not captured") else 2
            key = _normalize(": ".join(r.reason.split(": ")[:parts]))[:100]
            grouped[key].append(f"{op}.{variant}" if variant else op)
    return sorted(grouped.items(), key=lambda kv: (-len(kv[1]), kv[0]))


def _ops_list(ops: list[str], limit: int = 12) -> str:
    shown = ", ".join(f"`{o}`" for o in ops[:limit])
    return shown + (f", … (+{len(ops) - limit})" if len(ops) > limit else "")


def warm_text(counts: dict[str, int], failures: list[str], seconds: dict[str, float]) -> str:
    """The warm run's summary (``run.py --warm``): verdicts, cache counters, differences."""
    times = ", ".join(f"{k} {v:.0f} s" for k, v in seconds.items())
    same = [k for k in counts if k.startswith("same")]
    lines = [
        f"Warm start ({times}): "
        + ", ".join(f"{counts[k]} {k}" for k in same)
        + f", {counts['differs']} differ",
    ]
    for mode in ("cold", "warm"):
        lines.append(
            f"  AOTAutogradCache {mode}: "
            + " ".join(f"{k}={counts[f'{mode}_{k}']}" for k in ("saved", "hit", "miss", "bypass"))
        )
    lines += [f"  FAIL {f}" for f in failures]
    return "\n".join(lines)


def _warm_section(results: list[Result]) -> list[str]:
    """Markdown lines on the warm run: what its verdicts mean and every entry that differs."""
    verdicts = {k: r.warm for k, r in entries(results).items() if r.warm}
    if not verdicts:
        return []
    kinds = Counter(v if v.startswith("same") else "differs" for v in verdicts.values())
    lines = [
        "",
        "#### Warm start (the same selection again, in a new process on the same caches)",
        "",
        "An entry is the **same** warm when its outcome, reason, every compiled output and "
        "gradient (bit for bit), dtypes and fallback counts equal the cold run's, every frame "
        "it stored cold was an AOTAutogradCache hit and every graph was read from the "
        "neuron-compile cache (**stored, loaded**). Frames with CPU-fallback regions are never "
        "stored in the AOTAutogradCache (**not stored**); skipped entries compile nothing "
        "(**no graph**).",
        "",
        ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) + ".",
    ]
    lines += [
        f"- **{op}{'.' + variant if variant else ''}** ({dtype}): {v}"
        for (op, variant, dtype), v in verdicts.items()
        if not v.startswith("same")
    ]
    return lines


def markdown(results: list[Result], *, command: str, meta: dict[str, str]) -> str:
    summary = summarize(results)
    warm = any(s.warm for s in summary.values())
    columns = _columns(summary)
    illegal = " illegal |" if "illegal" in columns else ""
    lines = [
        "### OpInfo conformance (generated)",
        "",
        f"Generated by `{command}` — "
        + ", ".join(f"{k} {v}" for k, v in meta.items())
        + ". Do not edit by hand.",
        "",
        "An entry is one (OpInfo, variant, dtype). It **passes** when every sample's forward "
        "outputs and, for differentiable floating-point entries, input gradients match eager "
        "through the StableHLO path (no CPU fallback). Skipped entries (random/uninitialized "
        "outputs, sparse/complex, not captured by Dynamo, eager itself raising) are not "
        "attempted.",
        "",
        "| dtype | entries | skipped | attempted | pass | fallback | xfail | mismatch |"
        + illegal
        + " error | pass rate | forward pass | backward pass |"
        + (" warm same |" if warm else ""),
        "|---|" + "---:|" * (len(columns) + 3 + warm),
    ]
    for s in summary.values():
        d = s.as_dict()
        (fp, fa), (bp, ba) = s.phase_rate("forward"), s.phase_rate("backward")
        cells = [s.dtype, *(str(d[c]) for c in columns), f"**{100 * s.pass_rate:.1f}%**"]
        cells += [f"{fp}/{fa}", f"{bp}/{ba}"] + ([s.warm_cell()] if warm else [])
        lines.append("| " + " | ".join(cells) + " |")
    lines += _warm_section(results)
    first = next(iter(summary), None)
    for dtype in summary:
        # Other dtypes list only their own gaps: entries that do not fail in the first dtype.
        failing_first = (
            set() if dtype == first else {op for _, _, ops in gaps(results, first) for op in ops}
        )
        title = f"Remaining gaps ({dtype})"
        if dtype != first:
            title = f"Gaps specific to {dtype} (entries not failing in {first})"
        lines += ["", f"#### {title}, most common first", ""]
        singles = []
        for outcome, group, ops in gaps(results, dtype, failing_first):
            if len(ops) == 1 and group.startswith("no lowering for "):
                singles.append(f"`{group.removeprefix('no lowering for ')}` ({ops[0]})")
                continue
            lines.append(f"- **{outcome}** — {group} ({len(ops)}): {_ops_list(ops)}")
        if singles:
            lines.append(
                f"- **fallback** — no lowering, one entry each ({len(singles)}): "
                + ", ".join(singles)
            )
        skipped = skips(results, dtype)
        if skipped:
            lines += ["", f"<details><summary>Skipped ({dtype})</summary>", ""]
            lines += [f"- {reason} ({len(ops)}): {_ops_list(ops, 8)}" for reason, ops in skipped]
            lines += ["", "</details>"]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- per legality rule

FALLBACK_NOTE = (
    "A legality rejection never becomes a fallback region: the partition decides which ops run "
    "on the CPU from the reference lowering rules only, so a graph a trn rule rejects fails its "
    "compile (illegal), and each fallback is an op the reference rules do not lower (no rule, "
    "an unsupported dtype, a data-dependent shape)."
)


def entry_label(op: str, variant: str, dtype: str) -> str:
    """``name[dtype]``, the name as ``--ops`` takes it (``op.variant``)."""
    return f"{op}.{variant}[{dtype}]" if variant else f"{op}[{dtype}]"


def rule_summary(results: list[Result], target: str | None = None) -> dict[str, Any]:
    """What ``run.py --summary-json`` writes: per-dtype totals (entries by outcome), one row per
    legality rule (``code`` NC5xx, ``ncc_code``, ``rule``) with the entries it rejects, and every
    entry's outcome and reason, so two runs can be compared (``compare_summaries``).

    An entry counts under the rule its compile raised first; the other neuronx-cc codes that
    graph also violates (``[also ...]`` in the reason) are listed under ``also``."""
    by_entry = entries(results)
    totals: dict[str, dict[str, int]] = {}
    for (_, _, dtype), r in by_entry.items():
        counts = totals.setdefault(dtype, {o: 0 for o in OUTCOMES})
        counts[r.outcome] += 1
    rules: dict[tuple[str, str, str], dict[str, Any]] = {}
    for key, r in by_entry.items():
        if r.outcome != "illegal":
            continue
        head, _, rest = r.reason.partition(": ")
        code, ncc_code, rule = (head.split(" ", 2) + ["?", "?"])[:3]
        row = rules.setdefault(
            (code, ncc_code, rule),
            {"code": code, "ncc_code": ncc_code, "rule": rule, "count": 0, "entries": []},
        )
        row["count"] += 1
        row["entries"].append(entry_label(*key))
        also = re.search(r"\[also ([^\]]*)\]$", rest)
        for extra in also.group(1).split(", ") if also else []:
            row.setdefault("also", {}).setdefault(extra, []).append(entry_label(*key))
    ordered = sorted(rules.values(), key=lambda row: (-row["count"], row["ncc_code"]))
    for row in ordered:
        row["entries"].sort()
    return {
        "target": target or "cpu",
        "totals": totals,
        "rules": ordered,
        "entries": {
            entry_label(*k): {"outcome": r.outcome, "reason": r.reason}
            for k, r in sorted(by_entry.items())
        },
    }


def format_rule_summary(summary: dict[str, Any]) -> str:
    """The per-rule text ``run.py`` prints for a trn target."""
    lines = [f"Legality on {summary['target']} (entries each rule rejects; first violation):"]
    if not summary["rules"]:
        lines.append("  none: no entry was rejected")
    for row in summary["rules"]:
        lines.append(
            f"  {row['ncc_code']:<13} {row['code']} {row['rule']:<18} {row['count']:>4}: "
            + ", ".join(row["entries"])
        )
        for extra, names in sorted(row.get("also", {}).items()):
            lines.append(f"  {'':13} also {extra} ({len(names)}): {', '.join(names)}")
    for dtype, counts in summary["totals"].items():
        shown = ("pass", "illegal", "fallback", "mismatch", "error", "xfail", "skip")
        lines.append(
            f"Totals ({dtype}, {sum(counts.values())} entries): "
            + ", ".join(f"{o} {counts[o]}" for o in shown)
        )
    lines.append(FALLBACK_NOTE)
    return "\n".join(lines)


def compare_summaries(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """``name: before-outcome -> after-outcome (after's reason)`` for every entry both runs
    attempted whose outcome differs (e.g. a cpu run against a trn2 run of the same tree)."""
    lines = []
    for name, now in after["entries"].items():
        then = before["entries"].get(name)
        if then is None or then["outcome"] == now["outcome"]:
            continue
        reason = f" ({now['reason']})" if now["reason"] else ""
        lines.append(f"{name}: {then['outcome']} -> {now['outcome']}{reason}")
    return lines
