"""Fixtures: test-only lowerings that emit a defect, and one report over every sample model."""

from __future__ import annotations

import contextlib
import os
import warnings

import pytest
import torch

from neuron_compile.lowering import registry
from neuron_compile.lowering.emit import TensorType
from tests.report import samples


def _invalid_add(ctx, x):
    """Test-only lowering of nctest_report::bad_verify: adds operands of different shapes."""
    wrong = ctx.emit.constant(0.0, TensorType((x.shape[0] + 1,), x.dtype))
    return ctx.emit.op1("add", [x, wrong], x.type)


def _forgets_one(ctx, x):
    """Test-only lowering of nctest_report::plus_one that returns x (eager returns x + 1)."""
    return ctx.emit.unary("negate", ctx.emit.unary("negate", x))


TEST_LOWERINGS = {
    torch.ops.nctest_report.bad_verify.default: _invalid_add,
    torch.ops.nctest_report.plus_one.default: _forgets_one,
}


@contextlib.contextmanager
def defective_lowerings():
    keys = [(op, registry.REFERENCE) for op in TEST_LOWERINGS]
    for (op, target), rule in zip(keys, TEST_LOWERINGS.values(), strict=True):
        registry._LOWERINGS[(op, target)] = registry.Lowering(rule, registry.always, target)
    try:
        yield
    finally:
        for key in keys:
            registry._LOWERINGS.pop(key, None)


def run_defective_samples() -> None:
    """Compile every sample model once; exceptions of the verifier sample are expected."""
    torch.compile(samples.graph_break_print, backend="neuron")(torch.randn(4))
    torch.compile(samples.data_dependent_branch, backend="neuron")(torch.ones(4))
    with torch.no_grad():
        torch.compile(samples.ScanNet(), backend="neuron")(torch.randn(3, 8))
    torch.compile(samples.wide_input, backend="neuron")(torch.randn(4, dtype=torch.float64))
    f = torch.compile(samples.shape_sensitive, backend="neuron")
    f(torch.randn(4, 8))
    f(torch.randn(6, 8))
    torch.compile(samples.wrong_numerics, backend="neuron")(torch.randn(4))
    torch.compile(samples.invalid_module, backend="neuron")(torch.randn(4))


@pytest.fixture(scope="session")
def sample_run(tmp_path_factory):
    """(report, collector, bundle dir): every defect sample under one run-mode collector."""
    import neuron_compile
    from neuron_compile.report import Collector

    saved = os.environ.get("NEURON_COMPILE_CACHE_DIR")
    os.environ["NEURON_COMPILE_CACHE_DIR"] = str(tmp_path_factory.mktemp("report-cache"))
    bundles = tmp_path_factory.mktemp("bundles")
    torch._dynamo.reset()
    neuron_compile.reset_metrics()
    try:
        with defective_lowerings(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Collector("tests/report/samples.py", "run", bundle_dir=str(bundles)) as c:
                try:
                    run_defective_samples()
                except Exception as e:
                    c.note_exception(e)
            report = c.report()
    finally:
        if saved is None:
            os.environ.pop("NEURON_COMPILE_CACHE_DIR", None)
        else:
            os.environ["NEURON_COMPILE_CACHE_DIR"] = saved
        torch._dynamo.reset()
    return report, c, bundles
