"""Compile events (neuron_compile/events.py): their order, isolation from failing subscribers,
unsubscribing, the AOT-cache warm path's shared epilogue, and a report collector that patches
nothing."""

from __future__ import annotations

import ast
import logging
import warnings
from pathlib import Path

import pytest
import torch

import neuron_compile
from neuron_compile import backend, compiler, events
from neuron_compile.events import (
    FrameCompiled,
    FrameStarted,
    GraphCompiled,
    GraphFailed,
    GraphLowered,
    RegionCompiled,
)


def _tiny(x):
    return (x.sin() * 2).sum()


def _names(seen):
    return [(type(e).__name__, getattr(e, "graph", None) or e.name) for e in seen]


def test_order_of_events_for_a_tiny_function_with_backward():
    seen: list = []
    x = torch.randn(4, requires_grad=True)
    with events.subscribed(seen.append):
        out = torch.compile(_tiny, backend="neuron")(x)
        in_frame = len(seen)
        out.backward()
    frame = seen[0].name
    fwd, bwd = f"{frame}_forward_0", f"{frame}_backward_0"
    assert _names(seen) == [
        ("FrameStarted", frame),
        ("GraphLowered", fwd),
        ("RegionCompiled", fwd),
        ("GraphCompiled", fwd),
        ("FrameCompiled", frame),
        # the backward compiles at its first call, after the frame
        ("GraphLowered", bwd),
        ("RegionCompiled", bwd),
        ("GraphCompiled", bwd),
    ]
    assert in_frame == 5
    started, compiled = seen[0], seen[3]
    assert isinstance(started, FrameStarted) and started.where and "test_events.py" in started.where
    assert isinstance(compiled, GraphCompiled) and compiled.path == "compile"
    assert "stablehlo" in seen[1].lowered.text and seen[2].artifact
    # metrics() holds exactly the records the GraphCompiled events carried
    records = [e.record for e in seen if isinstance(e, GraphCompiled)]
    assert list(neuron_compile.metrics()) == records
    assert torch.allclose(x.grad, 2 * x.detach().cos())


def test_subscribing_to_some_types_only():
    seen: list = []
    with events.subscribed(seen.append, GraphCompiled, FrameCompiled):
        torch.compile(_tiny, backend="neuron")(torch.randn(3))
    assert [type(e) for e in seen] == [GraphCompiled, FrameCompiled]


def test_a_failing_subscriber_does_not_break_compiling(caplog):
    calls = []

    def broken(event):
        calls.append(event)
        raise RuntimeError("subscriber bug")

    x = torch.randn(5)
    with caplog.at_level(logging.DEBUG, logger="neuron_compile.events"):
        with events.subscribed(broken):
            out = torch.compile(_tiny, backend="neuron")(x)
    assert torch.allclose(out, _tiny(x), atol=1e-6)
    assert len(calls) == 5 and len(neuron_compile.metrics()) == 1  # metrics still subscribed
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "subscriber" in warned[0].getMessage()  # once, not per event


def test_unsubscribe_stops_delivery():
    seen: list = []
    unsubscribe = events.subscribe(seen.append)
    torch.compile(_tiny, backend="neuron")(torch.randn(2))
    assert seen
    unsubscribe()
    unsubscribe()  # idempotent
    count = len(seen)
    torch.compile(lambda x: x.cos() + 1, backend="neuron")(torch.randn(2))
    assert len(seen) == count
    assert len(neuron_compile.metrics()) == 2


def test_graph_failed_carries_the_error_and_the_graph():
    seen: list = []
    f = torch.compile(
        lambda x: torch.poisson(x.abs()), backend="neuron", options={"fallback": "error"}
    )
    with events.subscribed(seen.append, GraphFailed), pytest.raises(Exception) as info:
        f(torch.randn(8))
    (failed,) = seen
    assert getattr(failed.error, "code", None) == "NC101"
    assert failed.name.endswith("_inference_0") or failed.name.endswith("_forward_0")
    assert failed.gm is not None and failed.cfg.fallback == "error"
    # Dynamo wraps the error; the event has the original
    chain, e = [], info.value
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    assert failed.error in chain


def test_aot_cache_warm_path_publishes_graph_compiled_through_the_shared_epilogue(monkeypatch):
    calls = []
    real = compiler.finish_graph

    def spy(runner, record, cfg, started, **kw):
        calls.append(kw.get("path", "compile"))
        return real(runner, record, cfg, started, **kw)

    monkeypatch.setattr(compiler, "finish_graph", spy)

    def fn(x):
        return torch.tanh(x) * 3 + 1

    x = torch.randn(6)
    cold = torch.compile(fn, backend="neuron")(x)
    torch._dynamo.reset()  # a new frame: AOTAutogradCache's entry on disk is a hit
    seen: list = []
    with events.subscribed(seen.append, GraphCompiled, RegionCompiled, GraphLowered):
        warm = torch.compile(fn, backend="neuron")(x)
    assert torch.equal(cold, warm)
    assert calls == ["compile", "aot_cache"]
    kinds = [(type(e).__name__, getattr(e, "path", None)) for e in seen]
    assert kinds == [("RegionCompiled", None), ("GraphCompiled", "aot_cache")]  # nothing lowered
    assert seen[0].gm is None and seen[1].gm is None
    assert neuron_compile.metrics()[-1] is seen[1].record


def test_report_collector_patches_nothing():
    from neuron_compile.report import Collector

    originals = (backend.compile_frame, backend.compile_graph, compiler.lower_graph)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Collector("inline", "run") as c:
            assert (backend.compile_frame, backend.compile_graph, compiler.lower_graph) == originals
            torch.compile(_tiny, backend="neuron")(torch.randn(4))
        report = c.report()
    assert (backend.compile_frame, backend.compile_graph, compiler.lower_graph) == originals
    assert [g.numerics for g in report.graphs] == ["matched"]
    assert [g.est_target for g in report.graphs] == ["trn2"]  # FrameStarted.cfg replaced
    # and nothing of the collector is left subscribed
    assert all(getattr(cb, "__self__", None) is not c for cb, _ in events._subscribers)


def _module_assignments(path: Path) -> list[str]:
    """``setattr(...)`` calls and assignments to attributes of imported modules in ``path``
    (``sys.argv`` excluded: running a script as ``__main__`` is check.py's job)."""
    tree = ast.parse(path.read_text())
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            modules.update((a.asname or a.name).split(".")[0] for a in node.names)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr":
            found.append(f"{path.name}:{node.lineno}: setattr")
        targets = node.targets if isinstance(node, ast.Assign) else []
        targets = [
            t for tgt in targets for t in (tgt.elts if isinstance(tgt, ast.Tuple) else [tgt])
        ]
        for t in targets:
            base = t.value if isinstance(t, ast.Attribute) else None
            if isinstance(base, ast.Name) and base.id in modules and base.id != "sys":
                found.append(f"{path.name}:{node.lineno}: {base.id}.{t.attr} =")
    return found


def test_report_source_assigns_no_attribute_of_another_module():
    report_dir = Path(neuron_compile.__file__).parent / "report"
    found = [hit for p in sorted(report_dir.glob("*.py")) for hit in _module_assignments(p)]
    assert found == []
