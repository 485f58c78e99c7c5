"""Collect a ``Report`` while user code runs under the backend.

``with Collector(target, mode) as c: run(); report = c.report()`` gathers:

- graph breaks from Dynamo's ``graph_breaks`` artifact log (``torch._logging``): the only
  channel that carries the user's ``file:line`` and the break's reason class, logged once per
  break as Dynamo decides it (``counters["graph_break"]`` has the reason but no location, and
  ``torch._dynamo.explain`` re-runs the model);
- per graph: ``neuron_compile.metrics()`` records (stage seconds, cache source and miss
  explanation, fallback ops, downcasts, recompile flag);
- fallback locations from the partitioner's ``SplitReason``s, recompiles with what changed
  (``recompiles()``), compile errors with their code, node and user line, the FX code, input specs
  and StableHLO of the failing graph (for failure bundles);
- in run mode, each compiled Dynamo frame's outputs compared with the same FX graph run eagerly
  (first call of each frame).

It subscribes to the compile events (``neuron_compile.events``) for the duration and patches
nothing. Of the events' replaceable fields it sets ``FrameStarted.cfg`` (a check estimates device
time for the first installed non-cpu target unless the user turned the estimate off) and, in run mode, ``FrameCompiled.compiled``
(the comparing wrapper); it never changes results.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

from .. import events
from ..dump import dump_root
from ..errors import NeuronCompileError, user_frame
from ..targets import get_target, target_names
from .bundle import Failure, stage, write_bundle
from .model import CATEGORY_CODES, Finding, GraphEntry, Location, Report
from .ranks import process_rank

log = logging.getLogger(__name__)

_GB_LOGGERS = (
    "torch._dynamo.symbolic_convert.__graph_breaks",
    "torch._dynamo.convert_frame.__graph_breaks",
)
_GB_RE = re.compile(
    r"Graph break(?: \(user stack suppressed due to duplicate graph break\))? in user code at "
    r"(?P<file>.+?):(?P<line>\d+)\nGraph Break Reason: (?P<reason>.*)",
    re.S,
)
_FILE_LINE_RE = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
_GB_ID_RE = re.compile(r"/gb/(gb\d+)\.html")
_RANDOM_OPS = ("dropout", "rand", "bernoulli", "normal", "multinomial", "randint")


@dataclass
class GraphBreak:
    file: str
    line: int
    reason_class: str
    explanation: str
    gb_id: str | None
    count: int = 1


def parse_graph_break(message: str) -> GraphBreak | None:
    """One Dynamo ``graph_breaks`` log message -> ``GraphBreak`` (None if not a break)."""
    m = _GB_RE.match(message)
    if m:
        reason = m["reason"]
        # "Encountered graph break when attempting to trace CALL: ...:\n\n<gb_type>\n  ..."
        if reason.startswith("Encountered graph break") and "\n\n" in reason:
            reason = reason.split("\n\n", 1)[1]
        lines = [ln.strip() for ln in reason.splitlines() if ln.strip()]
        explanation = next(
            (ln.removeprefix("Explanation:").strip() for ln in lines if ln.startswith("Expl")), ""
        )
        gb = _GB_ID_RE.search(reason)
        return GraphBreak(
            m["file"],
            int(m["line"]),
            lines[0] if lines else "graph break",
            explanation,
            gb.group(1) if gb else None,
        )
    if message.startswith("Graph break: torch.compile cannot properly resume"):
        frames = _FILE_LINE_RE.findall(message)
        if frames:
            path, line, _ = frames[-1]
            return GraphBreak(path, int(line), "frame skipped", message.splitlines()[1], None)
    return None


class _BreakHandler(logging.Handler):
    def __init__(self, sink: list[GraphBreak]) -> None:
        super().__init__(logging.DEBUG)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        try:
            gb = parse_graph_break(record.getMessage())
        except Exception:  # never let a report bug break the user's compile
            return
        if gb is not None:
            self.sink.append(gb)


def _mode_switch(event: str) -> bool:
    """A recompile for train <-> eval / no_grad only (``grad mode=False (was True)``, plus inputs
    such as BatchNorm's counters that eval mode no longer reads): a second program by design,
    listed in the graphs but not a finding. Shape, dtype and value changes are findings."""
    changes = event.split(": ", 1)[-1].split(", ")
    return any(c.startswith("grad mode=") for c in changes) and all(
        c.startswith("grad mode=") or (c.startswith("input ") and c.endswith(" gone"))
        for c in changes
    )


def _wide_input_location(gm: fx.GraphModule, inputs: Any) -> Location | None:
    """The user line of the first op consuming a float64 tensor input of a Dynamo graph."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for ph, value in zip(placeholders, inputs, strict=False):
        dtype = getattr(value, "dtype", None)
        if dtype in (torch.float64, torch.complex128):
            for user in ph.users:
                loc = Location.parse(user_frame(user))
                if loc is not None:
                    return loc
    return None


def _specs(gm: fx.GraphModule) -> list[dict[str, Any]]:
    """Input specs of an AOTAutograd graph: name, shape, dtype (never values)."""
    out = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            out.append(
                {"name": node.name, "shape": [int(d) for d in val.shape], "dtype": str(val.dtype)}
            )
        else:
            out.append({"name": node.name, "shape": None, "dtype": type(val).__name__})
    return out


@dataclass
class _Frame:
    location: Location | None
    wide_location: Location | None
    recompile_event: str | None
    subject: str | None = None
    graphs: list[str] = field(default_factory=list)


def _prefix(name: str) -> str:
    """``Model_3_forward_0`` -> ``Model_3``: forward and backward graphs of one frame share it."""
    return re.sub(r"_(forward|backward|inference)_\d+$", "", name)


def _flatten(out: Any) -> list[Any]:
    from torch.utils._pytree import tree_flatten

    return tree_flatten(out)[0]


class _Comparing:
    """Run mode: the compiled frame, checked once against the same Dynamo graph run eagerly."""

    def __init__(self, collector: Collector, compiled: Any, gm: fx.GraphModule, frame: _Frame):
        self.collector, self.compiled, self.gm, self.frame = collector, compiled, gm, frame
        self.checked = False

    def __call__(self, *args: Any) -> Any:
        if self.checked:
            return self.compiled(*args)
        self.checked = True
        ref_args = [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args]
        out = self.compiled(*args)
        try:
            with torch.no_grad():
                ref = self.gm(*ref_args)
            self.collector._compare(self.frame, self.gm, _flatten(out), _flatten(ref))
        except Exception as e:  # the eager reference itself failed: not our finding
            log.debug("run mode: eager reference failed: %s", e)
        return out


class Collector:
    """Context manager collecting one ``Report``; see the module docstring."""

    def __init__(
        self,
        target: str = "",
        mode: str = "compile",
        *,
        bundle_dir: str | None = None,
        rtol: float = 1e-4,
        atol: float = 1e-4,
    ) -> None:
        if mode not in ("compile", "run"):
            raise ValueError(f"mode must be 'compile' or 'run', not {mode!r}")
        self.target, self.mode, self.bundle_dir = target, mode, bundle_dir
        self.rtol, self.atol = rtol, atol
        self.breaks: list[GraphBreak] = []
        self.failures: list[Failure] = []
        self.frames: dict[str, _Frame] = {}  # graph-name prefix -> frame
        self.recompile_findings: list[Finding] = []
        self.mismatches: list[Finding] = []
        self.numerics: dict[str, str] = {}
        self.reasons: dict[str, list[Any]] = {}  # graph -> SplitReasons
        self.artifacts: dict[str, dict[str, str]] = {}
        self.crash: str | None = None
        self._records: list[Any] = []
        self._eager: list[Any] = []  # frames.EagerFrame records seen while collecting
        self._eager_before: list[Any] = []  # ... and those recorded before it started
        self._seen: set[int] = set()
        self._cache: dict[str, Any] = {}
        self._texts: dict[str, str] = {}  # graph -> StableHLO of its last lowered region
        self._undo: list[Any] = []
        self._t0 = 0.0

    # ---- hooks -----------------------------------------------------------------------------
    def __enter__(self) -> Collector:
        from ..frames import eager_frames

        self._t0 = time.perf_counter()
        self._eager_before = eager_frames()
        handler = _BreakHandler(self.breaks)
        for name in _GB_LOGGERS:
            lg = logging.getLogger(name)
            saved = (lg.level, lg.propagate)
            # Quiet unless the user asked for TORCH_LOGS=graph_breaks themselves.
            lg.propagate = lg.propagate and lg.isEnabledFor(logging.DEBUG)
            lg.setLevel(logging.DEBUG)
            lg.addHandler(handler)
            self._undo.append(lambda lg=lg, saved=saved: self._restore_logger(lg, handler, saved))
        for kind, on in (
            (events.FrameStarted, self._frame_started),
            (events.FrameCompiled, self._frame_compiled),
            (events.GraphLowered, self._graph_lowered),
            (events.GraphCompiled, self._graph_compiled),
            (events.GraphFailed, self._graph_failed),
        ):
            self._undo.append(events.subscribe(on, kind))
        return self

    def __exit__(self, *exc: Any) -> None:
        self.snapshot()
        while self._undo:
            self._undo.pop()()

    @staticmethod
    def _restore_logger(lg: logging.Logger, handler: logging.Handler, saved: tuple) -> None:
        lg.removeHandler(handler)
        lg.setLevel(saved[0])
        lg.propagate = saved[1]

    def _frame_started(self, ev: events.FrameStarted) -> None:
        from ..shapes import recompiles

        # A check reports estimated device time (the first installed target with a cost model:
        # trn2) even for a cpu compile, unless the user turned the estimate off.
        if ev.cfg.estimate == "off" and ev.cfg.estimate_defaulted:
            modelled = [name for name in target_names() if name != "cpu"]
            if modelled:
                ev.cfg = dataclasses.replace(ev.cfg, estimate=modelled[0])
        change = None
        if ev.recompile:
            changes = recompiles()
            change = changes[-1] if changes else None
        where = _wide_input_location(ev.gm, ev.example_inputs)
        self.frames[ev.name] = _Frame(Location.parse(ev.where), where, change, ev.model)

    def _frame_compiled(self, ev: events.FrameCompiled) -> None:
        frame = self.frames.get(ev.name)
        if frame is None:
            return
        change = frame.recompile_event
        if change is not None and not _mode_switch(change):
            self.recompile_findings.append(
                Finding(
                    "recompile",
                    CATEGORY_CODES["recompile"],
                    f"recompiled {change}",
                    graph=frame.graphs[0] if frame.graphs else None,
                    location=frame.location,
                    details={"changed": change.split(": ", 1)[-1], "subject": frame.subject},
                )
            )
        if self.mode == "run":
            ev.compiled = _Comparing(self, ev.compiled, ev.gm, frame)

    def _graph_lowered(self, ev: events.GraphLowered) -> None:
        self._texts[ev.graph] = ev.lowered.text

    def _graph_compiled(self, ev: events.GraphCompiled) -> None:
        from ..fallback import FallbackRunner

        self._texts.pop(ev.name, None)
        frame = self.frames.get(_prefix(ev.name))
        if frame is not None:
            frame.graphs.append(ev.name)
        if isinstance(ev.runner, FallbackRunner):
            self.reasons[ev.name] = list(ev.runner.reasons)
        root = dump_root(ev.cfg) if getattr(ev.cfg, "dump_dir", None) else None
        if root is not None:
            self.artifacts.setdefault(ev.name, {})["dump"] = str(root / ev.name)

    def _graph_failed(self, ev: events.GraphFailed) -> None:
        frame = self.frames.get(_prefix(ev.name))
        if frame is not None:
            frame.graphs.append(ev.name)
        self.failures.append(
            Failure(
                ev.error,
                ev.name,
                ev.kind,
                fx_code=ev.gm.graph.python_code("self").src,  # current even if passes ran
                inputs=_specs(ev.gm),
                stablehlo=self._texts.pop(ev.name, None),
                flags={k: str(v) for k, v in vars(ev.cfg).items()},
                location=Location.parse(getattr(ev.error, "where", None))
                or (frame.location if frame else None),
            )
        )

    # ---- run mode --------------------------------------------------------------------------
    def _compare(self, frame: _Frame, gm: fx.GraphModule, out: list, ref: list) -> None:
        graph = frame.graphs[0] if frame.graphs else None
        worst = None
        for i, (a, b) in enumerate(zip(out, ref, strict=False)):
            if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
                continue
            a, b = a.detach().float(), b.detach().float()
            if a.shape != b.shape or not torch.allclose(
                a, b, rtol=self.rtol, atol=self.atol, equal_nan=True
            ):
                err = (a - b).abs().max().item() if a.shape == b.shape else float("inf")
                worst = worst if worst and worst[1] >= err else (i, err)
        if graph is not None:
            random = any(
                any(r in str(getattr(n.target, "__name__", n.target)) for r in _RANDOM_OPS)
                for n in gm.graph.nodes
                if n.op in ("call_function", "call_method", "call_module")
            )
            status = "matched" if worst is None else ("random" if random else "mismatch")
            self.numerics[graph] = status
            if status != "mismatch":
                return
        if worst is None:
            return
        self.mismatches.append(
            Finding(
                "mismatch",
                CATEGORY_CODES["mismatch"],
                f"output {worst[0]} differs from eager by up to {worst[1]:.3g} "
                f"(rtol {self.rtol}, atol {self.atol})",
                graph=graph,
                location=frame.location,
                details={"output": worst[0], "max_abs_error": worst[1]},
            )
        )

    # ---- results ---------------------------------------------------------------------------
    def snapshot(self) -> None:
        """Keep the graph records compiled so far (call before anything resets metrics)."""
        from ..frames import eager_frames
        from ..metrics import metrics

        current = metrics()
        for rec in current:
            if id(rec) not in self._seen:
                self._seen.add(id(rec))
                self._records.append(rec)
        known = self._eager + self._eager_before  # held, so identities stay unique
        self._eager += [f for f in eager_frames() if not any(f is k for k in known)]
        for k, v in (current.cache or {}).items():
            if isinstance(v, int | float) and not isinstance(v, bool):
                self._cache[k] = self._cache.get(k, 0) + v

    def note_exception(self, exc: BaseException, *, crash: bool = True) -> bool:
        """Record the target's exception; True if it is (or wraps) a compile error. Other
        exceptions mark the report as crashed (``crash=True``) or are ignored (a test failing
        for its own reasons under the pytest plugin)."""
        seen = {id(f.error) for f in self.failures}
        chain, e = [], exc
        while e is not None and e not in chain:
            chain.append(e)
            e = getattr(e, "inner_exception", None) or e.__cause__ or e.__context__
        for e in chain:
            if id(e) in seen:
                return True
        for e in chain:
            if isinstance(e, NeuronCompileError):
                self.failures.append(
                    Failure(e, getattr(e, "graph_name", None) or "<frame>", "unknown")
                )
                self.failures[-1].location = Location.parse(getattr(e, "where", None))
                return True
        if crash:
            self.crash = (f"{type(exc).__name__}: {exc}".splitlines() or [""])[0]
        return False

    def report(self) -> Report:
        from ..dump import versions

        self.snapshot()
        rank, world_size = process_rank()
        rep = Report(
            target=self.target,
            mode=self.mode,
            versions=versions(),
            created=time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()),
            duration_s=round(time.perf_counter() - self._t0, 3),
            crash=self.crash,
            cache=dict(self._cache),
            world_size=world_size,
        )
        for rec in self._records:
            frame = self.frames.get(_prefix(rec.name))
            rep.graphs.append(self._graph_entry(rec, frame))
            rep.findings += self._record_findings(rec, frame)
        rep.findings += self._eager_findings()
        rep.findings += self._break_findings()
        rep.findings += self.recompile_findings + self.mismatches
        for i, failure in enumerate(self.failures):
            finding = self._failure_finding(failure)
            if self.bundle_dir:
                finding.bundle = str(write_bundle(failure, self.bundle_dir, index=i))
            rep.findings.append(finding)
            if failure.graph not in {g.name for g in rep.graphs}:
                rep.graphs.append(
                    GraphEntry(
                        failure.graph,
                        failure.kind if failure.kind != "unknown" else "unknown",
                        status="failed",
                        location=failure.location,
                        artifacts={"bundle": finding.bundle} if finding.bundle else {},
                        ranks=[rank],
                    )
                )
        # Findings are this process's (graph findings: the rank that compiled the graph).
        graph_ranks = {g.name: g.ranks for g in rep.graphs}
        for f in rep.findings:
            f.ranks = list(graph_ranks.get(f.graph or "", [rank]))
        return rep

    def _graph_entry(self, rec: Any, frame: _Frame | None) -> GraphEntry:
        return GraphEntry(
            name=rec.name,
            kind=rec.kind,
            node_count=rec.node_count,
            seconds={
                "capture": rec.capture_s,
                "passes": rec.passes_s,
                "lowering": rec.lowering_s,
                "verify": rec.verify_s,
                "executor_compile": rec.executor_compile_s,
                "backend": rec.backend_s,
            },
            cache={"source": rec.cache_source, "key": rec.cache_key, "miss": list(rec.cache_miss)},
            regions=rec.regions,
            calls=rec.calls,
            recompile=rec.recompile,
            fallback_ops=dict(rec.fallback_ops),
            downcasts=list(rec.downcasts),
            artifacts=dict(self.artifacts.get(rec.name, {})),
            location=frame.location if frame else None,
            numerics=self.numerics.get(rec.name),
            est_device_s=getattr(rec, "est_device_s", None),
            est_target=getattr(rec, "est_target", ""),
            ranks=[getattr(rec, "rank", 0)],
        )

    def _record_findings(self, rec: Any, frame: _Frame | None) -> list[Finding]:
        out = []
        reasons = self.reasons.get(rec.name, [])
        for op, count in rec.fallback_ops.items():
            first = next((r for r in reasons if r.op == op), None)
            out.append(
                Finding(
                    "fallback",
                    CATEGORY_CODES["fallback"],
                    f"{op} runs eagerly on the CPU ({count} node(s) in {rec.kind} graph)"
                    + (f": {first.reason}" if first else ""),
                    graph=rec.name,
                    location=Location.parse(first.where) if first else None,
                    count=count,
                    details={"op": op, "source": first.source if first else None},
                )
            )
        # NOTE: int64 -> int32 (token ids, labels, indices) is exact within +-2**31 and happens in
        # nearly every model; it stays in the graph's ``downcasts`` but is not a finding, or
        # ``--fail-on downcast`` could never pass. float64 -> float32 loses precision: a finding.
        lossy = [d for d in rec.downcasts if "float64" in d or "complex128" in d]
        if lossy:
            out.append(
                Finding(
                    "downcast",
                    CATEGORY_CODES["downcast"],
                    f"float64 inputs run as float32: {'; '.join(lossy)}",
                    graph=rec.name,
                    location=(frame.wide_location or frame.location) if frame else None,
                    count=len(lossy),
                    details={"inputs": lossy},
                )
            )
        return out

    def _eager_findings(self) -> list[Finding]:
        """One ``eager-frame`` finding per frame Dynamo ran eagerly, at the user line where
        Dynamo gave up (else the frame's first line)."""
        out = []
        for ef in self._eager:
            where = Location.parse(ef.failed_at) or Location(ef.file, ef.line)
            if where.file == ef.file:
                where.function = ef.function
            out.append(
                Finding(
                    "eager-frame",
                    CATEGORY_CODES["eager-frame"],
                    f"{ef.function} ({ef.file}:{ef.line}) never reached the backend, Dynamo "
                    f"ran it eagerly: {ef.reason}" + (f"; fix: {ef.fix}" if ef.fix else ""),
                    location=where,
                    details={
                        "subject": ef.function,
                        "function": ef.function,
                        "first_line": ef.line,
                        "reason": ef.reason,
                        "fix": ef.fix,
                    },
                )
            )
        return out

    def _break_findings(self) -> list[Finding]:
        merged: dict[tuple, GraphBreak] = {}
        for gb in self.breaks:
            key = (gb.file, gb.line, gb.reason_class)
            if key in merged:
                merged[key].count += 1
            else:
                merged[key] = GraphBreak(**{**vars(gb), "count": 1})
        return [
            Finding(
                "graph-break",
                CATEGORY_CODES["graph-break"],
                f"graph break: {gb.reason_class}"
                + (f" ({gb.explanation})" if gb.explanation else ""),
                location=Location(gb.file, gb.line),
                count=gb.count,
                details={"reason_class": gb.reason_class, "gb_id": gb.gb_id},
            )
            for gb in merged.values()
        ]

    @staticmethod
    def _failure_finding(f: Failure) -> Finding:
        e = f.error
        code = getattr(e, "code", None) or "NC000"
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        details = {
            "error_type": type(e).__name__,
            "stage": stage(e, f),
            "node": getattr(e, "node_name", None),
            "op": getattr(e, "op", None),
            "reason": getattr(e, "reason", None),
            "hint": getattr(e, "hint", None),
        }
        reason = getattr(e, "reason", None)
        return Finding(
            "compile-error",
            code if re.fullmatch(r"NC\d{3}", code) else "NC000",
            first + (f": {reason}" if reason and reason not in first else ""),
            graph=f.graph,
            location=f.location,
            details={k: v for k, v in details.items() if v is not None},
            ncc=get_target(f.flags.get("target", "cpu")).diagnostics(
                "\n".join(str(getattr(e, k, "") or "") for k in ("log_tail", "log")) + f"\n{e}"
            ),
        )


@contextlib.contextmanager
def collect(target: str = "", mode: str = "compile", **kw: Any):
    """``with collect() as c: ...`` then ``c.report()``."""
    with Collector(target, mode, **kw) as c:
        yield c
