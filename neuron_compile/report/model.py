"""The report model: one ``Report`` per check run, rendered to every format from this data.

A report has graphs (one per compiled AOTAutograd graph, plus graphs that failed to compile) and
findings (graph breaks, CPU fallbacks, 64-bit downcasts, recompiles, compile errors, numerics
mismatches), each with a stable code and, where known, the user's ``file:line``. ``to_dict`` is
the JSON format, validated by ``schema.REPORT_SCHEMA`` (``SCHEMA_VERSION``).
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from typing import Any

#: Bumped on any incompatible change of the JSON layout (``schema.REPORT_SCHEMA``); the minor
#: number on added optional fields (1.1: estimated device time per graph and in total; 1.2: the
#: ranks of every graph and finding, and the world size; 1.3: the ``eager-frame`` category and
#: ``graph_sources``, how many graphs were compiled, loaded from the cache, or failed).
SCHEMA_VERSION = "1.3"

#: Finding categories, in the order reports list them; ``--fail-on`` takes these names.
CATEGORIES = (
    "compile-error",
    "eager-frame",
    "mismatch",
    "graph-break",
    "fallback",
    "recompile",
    "downcast",
)

#: The code each category's findings carry when the finding is not an exception of ours.
CATEGORY_CODES = {
    "graph-break": "NC601",
    "mismatch": "NC602",
    "eager-frame": "NC603",
    "fallback": "NC101",
    "downcast": "NC104",
    "recompile": "NC202",
}

#: ``GraphRecord.cache_source`` values of a graph loaded from the cache instead of compiled
CACHE_SOURCES = ("memory", "disk", "remote")

_WHERE_RE = re.compile(r"^(?P<file>.+?):(?P<line>\d+)(?: in (?P<function>\S+))?$")


def format_ranks(ranks: list[int]) -> str:
    """``[0, 1, 2, 3, 6]`` -> ``0-3,6``."""
    out: list[str] = []
    for r in sorted(set(ranks)):
        if out and out[-1].split("-")[-1] == str(r - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{r}"
        else:
            out.append(str(r))
    return ",".join(out)


@dataclass
class Location:
    """A user source location. ``file`` is as Python reported it (absolute for scripts)."""

    file: str
    line: int
    function: str | None = None

    @classmethod
    def parse(cls, where: str | None) -> Location | None:
        """``"/path/model.py:20 in forward"`` (``errors.user_frame``) -> Location, else None."""
        if not where or where == "<unknown>":
            return None
        m = _WHERE_RE.match(where.strip())
        if not m:
            return None
        return cls(m["file"], int(m["line"]), m["function"])

    def relpath(self, root: str | None = None) -> str:
        """The file relative to ``root`` (default: the working directory) when under it."""
        root = os.path.abspath(root or os.getcwd())
        path = os.path.abspath(self.file)
        if path.startswith(root + os.sep):
            return os.path.relpath(path, root).replace(os.sep, "/")
        return self.file

    def __str__(self) -> str:
        return f"{self.file}:{self.line}" + (f" in {self.function}" if self.function else "")


@dataclass
class NccDiagnostic:
    """One ``NCC_XXXXNNN`` error of neuronx-cc, triaged (``Target.diagnostics``: ``trainium/triage.py``)."""

    code: str
    message: str
    group: str
    bucket: str
    action: str


@dataclass
class Finding:
    """One thing CI may gate on. ``count`` aggregates identical occurrences."""

    category: str
    code: str
    message: str
    graph: str | None = None
    location: Location | None = None
    count: int = 1
    #: category-specific: ``op`` (fallback), ``reason_class`` (graph break), ``changed``
    #: (recompile), ``inputs`` (downcast), ``error_type`` / ``hint`` / ``stage`` (errors), ...
    details: dict[str, Any] = field(default_factory=dict)
    ncc: list[NccDiagnostic] = field(default_factory=list)
    bundle: str | None = None  # failure bundle directory
    #: torch.distributed ranks that had this finding (``[0]`` without a process group)
    ranks: list[int] = field(default_factory=lambda: [0])

    @property
    def subject(self) -> str:
        """What the finding is about, stable across runs (baseline key)."""
        d = self.details
        return str(
            d.get("op")
            or d.get("reason_class")
            or d.get("subject")
            or re.sub(r"_\d+_(forward|backward|inference)_\d+", r"_\1", self.graph or "")
        )

    def key(self, root: str | None = None) -> tuple[str, str, str, str]:
        """Baseline identity: category, code, file (relative), subject. No line: edits above a
        finding move it without changing it."""
        file = self.location.relpath(root) if self.location else ""
        return (self.category, self.code, file, self.subject)


@dataclass
class GraphEntry:
    """One compiled (or failed) AOTAutograd graph: ``metrics()``'s GraphRecord plus status."""

    name: str
    kind: str
    status: str = "ok"  # ok | failed
    node_count: int = 0
    seconds: dict[str, float] = field(default_factory=dict)  # per stage
    cache: dict[str, Any] = field(default_factory=dict)  # source, key, miss
    regions: int = 1
    calls: int = 0
    recompile: bool = False
    fallback_ops: dict[str, int] = field(default_factory=dict)
    downcasts: list[str] = field(default_factory=list)
    artifacts: dict[str, str] = field(default_factory=dict)  # dump dir, bundle
    location: Location | None = None  # first user line of the Dynamo frame
    numerics: str | None = None  # run mode: matched | mismatch | random | None
    #: roofline device seconds per call on ``est_target`` (``cost_model.estimate_module``)
    est_device_s: float | None = None
    est_target: str = ""
    #: torch.distributed ranks that compiled this graph (one row per cache key across ranks)
    ranks: list[int] = field(default_factory=lambda: [0])


@dataclass
class Report:
    target: str
    mode: str  # compile | run
    graphs: list[GraphEntry] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)
    created: str = ""
    duration_s: float = 0.0
    #: the target's own exception when it was not a compile error (the check could not finish)
    crash: str | None = None
    cache: dict[str, Any] = field(default_factory=dict)
    #: ranks the report covers (``check --nproc-per-node N``: N; 1 without torch.distributed)
    world_size: int = 1
    schema_version: str = SCHEMA_VERSION

    def counts(self) -> dict[str, int]:
        """Occurrences per category (every category present, zeros included)."""
        out = dict.fromkeys(CATEGORIES, 0)
        for f in self.findings:
            out[f.category] = out.get(f.category, 0) + f.count
        return out

    def graph_sources(self) -> dict[str, int]:
        """``{"compiled": n, "cached": n, "failed": n}``: graphs compiled in this run, loaded
        from the compile cache (memory, disk or remote tier), and failed."""
        failed = sum(g.status == "failed" for g in self.graphs)
        cached = sum(
            g.status != "failed" and g.cache.get("source") in CACHE_SOURCES for g in self.graphs
        )
        return {"compiled": len(self.graphs) - failed - cached, "cached": cached, "failed": failed}

    def est_device_s_total(self) -> float | None:
        """Estimated device seconds of one call of every estimated graph, None if none was."""
        ests = [g.est_device_s for g in self.graphs if g.est_device_s is not None]
        return sum(ests) if ests else None

    def est_target(self) -> str:
        """The target(s) the estimates are for (``trn2``; ``trn2,trn3`` if mixed)."""
        return ",".join(sorted({g.est_target for g in self.graphs if g.est_target}))

    def ranks_label(self, ranks: list[int]) -> str:
        """`` [ranks 0-3]`` (`` [rank 1]``) for a report over several ranks, else empty
        (one-rank reports read as they always did)."""
        if self.world_size <= 1:
            return ""
        return f" [rank{'s' if len(set(ranks)) > 1 else ''} {format_ranks(ranks)}]"

    def findings_for(self, graph: str) -> list[Finding]:
        return [f for f in self.findings if f.graph == graph]

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["counts"] = self.counts()
        d["graph_sources"] = self.graph_sources()
        d["est_device_s_total"] = self.est_device_s_total()
        d["est_target"] = self.est_target()
        d["tool"] = {"name": "neuron-compile", "version": self.versions.get("neuron_compile", "")}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Report:
        """Inverse of ``to_dict`` (reads baselines)."""

        def loc(x: dict | None) -> Location | None:
            return Location(**x) if x else None

        findings = [
            Finding(
                **{
                    **f,
                    "location": loc(f.get("location")),
                    "ncc": [NccDiagnostic(**n) for n in f.get("ncc", [])],
                }
            )
            for f in d.get("findings", [])
        ]
        graphs = [GraphEntry(**{**g, "location": loc(g.get("location"))}) for g in d["graphs"]]
        keep = {f.name for f in dataclasses.fields(cls)} - {"graphs", "findings"}
        return cls(graphs=graphs, findings=findings, **{k: v for k, v in d.items() if k in keep})
