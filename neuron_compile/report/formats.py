"""Render one ``Report`` as JSON, JUnit XML, Markdown, SARIF 2.1.0 or a terminal summary.

Every renderer takes the gating categories (``fail_on``): a finding in them is a JUnit
``<failure>``, a SARIF ``error`` and marked ``gated`` in Markdown; other findings are reported but
do not fail anything.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from collections.abc import Iterable
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

from .model import CATEGORIES, Finding, Location, Report, format_ranks

FORMATS = ("json", "junit", "markdown", "sarif", "terminal")
#: file names ``write_all`` uses in an output directory
FILE_NAMES = {
    "json": "report.json",
    "junit": "report.junit.xml",
    "markdown": "report.md",
    "sarif": "report.sarif",
}

#: SARIF rules: code -> (name, short description)
RULES = {
    "NC000": ("InternalError", "neuron-compile raised an unexpected exception"),
    "NC101": ("CpuFallback", "an op without a lowering runs eagerly on the CPU"),
    "NC102": ("LoweringError", "a lowering rule failed (a neuron-compile bug)"),
    "NC103": ("VerifierError", "the StableHLO verifier rejected the emitted module"),
    "NC104": ("Downcast64Bit", "64-bit inputs run as 32-bit"),
    "NC201": ("DynamicShape", "dynamic shapes were requested; Trainium needs static shapes"),
    "NC202": ("Recompile", "a new static compile of an already compiled frame"),
    "NC301": ("ExecutorError", "the XLA CPU executor failed to compile or run a graph"),
    "NC401": ("CacheMiss", "strict cache mode and the graph is not cached"),
    "NC402": ("CachedCompileFailure", "this graph failed to compile before"),
    "NC501": ("StaticShapeViolation", "trn legality: a symbolic dim (NCC_EMOD025)"),
    "NC502": ("DtypeViolation", "trn legality: a dtype the target lacks"),
    "NC503": ("Int64Violation", "trn legality: a 64-bit value reaching neuronx-cc"),
    "NC504": ("IntegerDatapathViolation", "trn legality: integer dot/conv/scatter-add"),
    "NC505": ("CustomCallViolation", "trn legality: custom-call target not accepted"),
    "NC506": ("IndexRangeViolation", "trn legality: static gather/scatter index out of range"),
    "NC507": ("HbmViolation", "trn legality: estimated HBM footprint over one core"),
    "NC508": ("GraphSizeViolation", "trn legality: graph over the instruction limit"),
    "NC509": ("RngAlgorithmViolation", "trn legality: RngBitGenerator not RNG_DEFAULT"),
    "NC510": ("ConvolutionFormViolation", "trn legality: convolution dilation combination"),
    "NC511": ("ReduceWindowViolation", "trn legality: dilated or variadic reduce-window"),
    "NC512": ("OpDtypeViolation", "trn legality: op on a dtype its engine lacks"),
    "NC513": ("KernelArtifactViolation", "trn legality: NKI kernel artifact missing"),
    "NC514": ("CollectiveViolation", "trn legality: a collective or replica groups not taken"),
    "NC521": ("NeuronxCcNotFound", "a trn target needs neuronx-cc"),
    "NC522": ("NeuronxCcError", "neuronx-cc failed (NCC_ code triaged in the report)"),
    "NC523": ("NeuronxCcTimeout", "neuronx-cc timed out"),
    "NC531": ("NeuronRuntimeError", "the Neuron runtime failed to load or run a NEFF"),
    "NC601": ("GraphBreak", "Dynamo broke the graph: each break is a separate device program"),
    "NC602": ("NumericsMismatch", "compiled outputs differ from eager (run mode)"),
    "NC603": ("EagerFrame", "Dynamo skipped a compiled frame: it never reached the backend"),
}


def _where(f: Finding, root: str | None = None) -> str:
    return f"{f.location.relpath(root)}:{f.location.line}" if f.location else "-"


def _gated(f: Finding, fail_on: Iterable[str]) -> bool:
    return f.category in set(fail_on)


# ---- JSON --------------------------------------------------------------------------------------
def render_json(report: Report, fail_on: Iterable[str] = ()) -> str:
    return json.dumps(report.to_dict(), indent=2, default=str) + "\n"


# ---- JUnit -------------------------------------------------------------------------------------
def _testcase(name: str, classname: str, seconds: float, findings: list[Finding], fail_on) -> str:
    gated = [f for f in findings if _gated(f, fail_on)]
    head = f"    <testcase name={quoteattr(_token(name))} classname={quoteattr(classname)} " + (
        f'time="{seconds:.3f}"'
    )
    if not gated:
        return head + "/>"
    first = gated[0]
    body = "\n".join(
        f"[{f.code}] {f.category} at {_where(f)}: {f.message}"
        + (f" (x{f.count})" if f.count > 1 else "")
        + (f"\n  bundle: {f.bundle}" if f.bundle else "")
        for f in gated
    )
    message = f"[{first.code}] {_where(first)}: {first.message}"
    return (
        f"{head}>\n      <failure message={quoteattr(message)} type={quoteattr(first.code)}>"
        f"{escape(body)}</failure>\n    </testcase>"
    )


def _token(s: str) -> str:
    return " ".join(s.split())


def render_junit(report: Report, fail_on: Iterable[str] = ("compile-error",)) -> str:
    """One ``<testcase>`` per graph (its findings as one ``<failure>``), one per graph-less finding
    (graph breaks, frame-level errors); validates against the Ant JUnit schema."""
    fail_on = set(fail_on)
    classname = "neuron_compile.check." + (
        "".join(c if c.isalnum() else "_" for c in report.target).strip("_") or "target"
    )
    cases = []
    for g in report.graphs:
        cases.append(
            _testcase(
                g.name + report.ranks_label(g.ranks),
                classname,
                g.seconds.get("backend", 0.0),
                report.findings_for(g.name),
                fail_on,
            )
        )
    names = {g.name for g in report.graphs}
    for f in report.findings:
        if f.graph is None or f.graph not in names:
            name = f"{f.category} {_where(f)}{report.ranks_label(f.ranks)}"
            cases.append(_testcase(name, classname, 0.0, [f], fail_on))
    failures = sum("<failure" in c for c in cases)
    props = {
        "schema_version": report.schema_version,
        "mode": report.mode,
        "world_size": report.world_size,
        "fail_on": ",".join(sorted(fail_on)),
        **_est_props(report),
        **{f"version.{k}": v for k, v in report.versions.items()},
    }
    prop_xml = "\n".join(
        f"      <property name={quoteattr(k)} value={quoteattr(str(v))}/>" for k, v in props.items()
    )
    stamp = report.created or "1970-01-01T00:00:00"
    suite = (
        f"  <testsuite name={quoteattr('neuron-compile check ' + report.target)} "
        f'package="neuron-compile" id="0" timestamp="{stamp}" '
        f'hostname={quoteattr(socket.gethostname() or "localhost")} tests="{len(cases)}" '
        f'failures="{failures}" errors="{1 if report.crash else 0}" skipped="0" '
        f'time="{report.duration_s:.3f}">\n'
        f"    <properties>\n{prop_xml}\n    </properties>\n"
        + "\n".join(cases)
        + f"\n    <system-out>{escape(render_terminal(report, fail_on))}</system-out>\n"
        f"    <system-err>{escape(report.crash or '')}</system-err>\n  </testsuite>"
    )
    return f'<?xml version="1.0" encoding="UTF-8"?>\n<testsuites>\n{suite}\n</testsuites>\n'


# ---- Markdown ----------------------------------------------------------------------------------
def _md(s: object) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def render_markdown(report: Report, fail_on: Iterable[str] = ("compile-error",)) -> str:
    """A summary for ``$GITHUB_STEP_SUMMARY`` or a PR comment."""
    fail_on = set(fail_on)
    counts = report.counts()
    gated = sum(f.count for f in report.findings if _gated(f, fail_on))
    verdict = (
        "crashed"
        if report.crash
        else (f"{gated} gated finding(s)" if gated else "no gated findings")
    )
    mark = "x" if (gated or report.crash) else "white_check_mark"
    out = [
        f"## :{mark}: neuron-compile check `{_md(report.target)}`: {verdict}",
        "",
        f"{report.mode} mode · {_graph_summary(report)} · "
        + (f"{report.world_size} ranks · " if report.world_size > 1 else "")
        + f"{report.duration_s:.1f} s · fail on: {', '.join(sorted(fail_on)) or 'nothing'}",
        "",
        "| finding | count | gates CI |",
        "|---|---:|---|",
    ]
    out += [f"| {c} | {counts[c]} | {'yes' if c in fail_on else 'no'} |" for c in CATEGORIES]
    total = report.est_device_s_total()
    if total is not None:
        out += [
            "",
            f"Estimated device time ({report.est_target()} roofline, one call of every "
            f"graph): {_us(total)}",
        ]
    if report.crash:
        out += ["", f"**The target crashed** (not a compile error): `{_md(report.crash)}`"]
    if report.findings:
        out += [
            "",
            "### Findings",
            "",
            "| | code | where | graph | message |",
            "|---|---|---|---|---|",
        ]
        for f in report.findings:
            icon = ":x:" if _gated(f, fail_on) else ":warning:"
            msg = _md(f.message) + (f" (x{f.count})" if f.count > 1 else "")
            msg += report.ranks_label(f.ranks)
            if f.bundle:
                msg += f" — bundle `{_md(f.bundle)}`"
            for n in f.ncc:
                msg += f" — `{n.code}` {n.bucket}: {_md(n.action)}"
            out.append(f"| {icon} | {f.code} | `{_where(f)}` | {_md(f.graph or '')} | {msg} |")
    if report.graphs:
        ranked = report.world_size > 1  # a ranks column: each distinct graph once, its ranks
        out += [
            "",
            "<details><summary>Graphs</summary>",
            "",
            "| graph | kind | status | nodes | lowering s | verify s | XLA s | cache | regions "
            "| calls | est. device | notes |" + (" ranks |" if ranked else ""),
            "|---|---|---|---:|---:|---:|---:|---|---:|---:|---:|---|" + ("---|" if ranked else ""),
        ]
        for g in report.graphs:
            s = g.seconds
            miss = "; ".join(g.cache.get("miss", []))
            cache = g.cache.get("source", "") + (f" ({_md(miss)})" if miss else "")
            out.append(
                f"| {_md(g.name)} | {g.kind} | {g.status} | {g.node_count} | "
                f"{s.get('lowering', 0):.3f} | {s.get('verify', 0):.3f} | "
                f"{s.get('executor_compile', 0):.3f} | {cache} | {g.regions} | {g.calls} | "
                f"{_us(g.est_device_s)} | {_md(_notes(g))} |"
                + (f" {format_ranks(g.ranks)} |" if ranked else "")
            )
        out += ["", "</details>"]
    return "\n".join(out) + "\n"


def _us(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e6:.2f} µs"


def _est_props(report: Report) -> dict[str, str]:
    """JUnit suite properties: total and per-graph estimated device seconds (if estimated)."""
    total = report.est_device_s_total()
    if total is None:
        return {}
    props = {"est_target": report.est_target(), "est_device_s_total": f"{total:.9g}"}
    for g in report.graphs:
        if g.est_device_s is not None:
            props[f"est_device_s.{g.name}"] = f"{g.est_device_s:.9g}"
    return props


def _notes(g) -> str:
    notes = ["recompile"] if g.recompile else []
    if g.downcasts:
        notes.append(f"{len(g.downcasts)} 64-bit input(s) narrowed")
    if g.numerics:
        notes.append(f"numerics {g.numerics}")
    if g.artifacts.get("dump"):
        notes.append(f"dump {g.artifacts['dump']}")
    return "; ".join(notes)


# ---- SARIF -------------------------------------------------------------------------------------
def _artifact(loc: Location, root: str) -> dict:
    rel = loc.relpath(root)
    if rel != loc.file or not os.path.isabs(loc.file):
        return {"uri": rel, "uriBaseId": "%SRCROOT%"}
    return {"uri": Path(loc.file).resolve().as_uri()}


def render_sarif(report: Report, fail_on: Iterable[str] = ("compile-error",)) -> str:
    """SARIF 2.1.0: one result per finding on the user's line, so GitHub code scanning annotates
    it. Paths under the working directory are relative to ``%SRCROOT%`` (the repository)."""
    fail_on = set(fail_on)
    root = os.getcwd()
    codes = sorted({f.code for f in report.findings})
    rules = [
        {
            "id": code,
            "name": RULES.get(code, ("NeuronCompile", ""))[0],
            "shortDescription": {"text": RULES.get(code, ("", code))[1] or code},
            "helpUri": "https://github.com/neuron-compile/neuron-compile#errors",
        }
        for code in codes
    ]
    results = []
    for f in report.findings:
        result: dict = {
            "ruleId": f.code,
            "ruleIndex": codes.index(f.code),
            "level": "error" if _gated(f, fail_on) else "warning",
            "message": {
                "text": f"[{f.code}] {f.message}"
                + (f" (x{f.count})" if f.count > 1 else "")
                + (f" [graph {f.graph}]" if f.graph else "")
                + report.ranks_label(f.ranks)
            },
            "partialFingerprints": {
                "neuronCompileFinding/v1": hashlib.sha256(
                    "|".join(f.key(root)).encode()
                ).hexdigest()[:32]
            },
            "properties": {
                "category": f.category,
                "count": f.count,
                "graph": f.graph or "",
                "ranks": list(f.ranks),
            },
        }
        if f.location:
            result["locations"] = [
                {
                    "physicalLocation": {
                        "artifactLocation": _artifact(f.location, root),
                        "region": {"startLine": max(f.location.line, 1)},
                    }
                }
            ]
        results.append(result)
    doc = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "neuron-compile",
                        "version": report.versions.get("neuron_compile", "0"),
                        "informationUri": "https://github.com/neuron-compile/neuron-compile",
                        "rules": rules,
                    }
                },
                "originalUriBaseIds": {"%SRCROOT%": {"uri": Path(root).resolve().as_uri() + "/"}},
                "invocations": [{"executionSuccessful": report.crash is None}],
                "results": results,
            }
        ],
    }
    return json.dumps(doc, indent=2) + "\n"


# ---- terminal ----------------------------------------------------------------------------------
def _graph_summary(report: Report) -> str:
    """``3 graphs: 1 compiled, 2 loaded from the cache, 0 failed``."""
    n = len(report.graphs)
    src = report.graph_sources()
    return (
        f"{n} graph{'' if n == 1 else 's'}: {src['compiled']} compiled, "
        f"{src['cached']} loaded from the cache, {src['failed']} failed"
    )


def render_terminal(report: Report, fail_on: Iterable[str] = ("compile-error",)) -> str:
    fail_on = set(fail_on)
    lines = [
        f"neuron-compile check {report.target} ({report.mode} mode): {_graph_summary(report)}, "
        + (f"{report.world_size} ranks, " if report.world_size > 1 else "")
        + f"{report.duration_s:.1f} s"
    ]
    counts = report.counts()
    lines.append(
        "  "
        + "  ".join(f"{c}={counts[c]}{'*' if c in fail_on else ''}" for c in CATEGORIES)
        + "   (* = --fail-on)"
    )
    for f in report.findings:
        mark = "x" if _gated(f, fail_on) else "!"
        lines.append(
            f"  {mark} {f.code} {f.category:<13} {_where(f):<28} {f.message}"
            + (f" (x{f.count})" if f.count > 1 else "")
            + report.ranks_label(f.ranks)
        )
        if f.bundle:
            lines.append(f"      bundle: {f.bundle} (python {f.bundle}/replay.py)")
        for n in f.ncc:
            lines.append(f"      {n.code} [{n.bucket}] {n.action}")
    total = report.est_device_s_total()
    if total is not None:
        n = sum(g.est_device_s is not None for g in report.graphs)
        lines.append(
            f"  estimated device time ({report.est_target()} roofline, one call each): "
            f"{_us(total)} over {n} graph(s)"
        )
        for g in report.graphs:
            if g.est_device_s is not None:
                lines.append(
                    f"      {_us(g.est_device_s):>14}  {g.name}{report.ranks_label(g.ranks)}"
                )
    if report.crash:
        lines.append(f"  target crashed: {report.crash}")
    return "\n".join(lines) + "\n"


RENDERERS = {
    "json": render_json,
    "junit": render_junit,
    "markdown": render_markdown,
    "sarif": render_sarif,
    "terminal": render_terminal,
}


def write_all(
    report: Report, out_dir: str | os.PathLike, fail_on: Iterable[str]
) -> dict[str, Path]:
    """Write every file format into ``out_dir``; return ``{format: path}``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for fmt, name in FILE_NAMES.items():
        paths[fmt] = out / name
        paths[fmt].write_text(RENDERERS[fmt](report, fail_on))
    return paths
