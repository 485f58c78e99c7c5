"""CI slice of the OpInfo conformance harness: common ops in float32, plus the classifier itself.

The full sweep is ``python -m tests.conformance.run`` (see ``run.py``); this slice must stay fast
(< 90 s on 2 cores) and deterministic.
"""

from __future__ import annotations

import functools
import time

import pytest
import torch
import torch.nn.functional as F

from tests.conformance import opinfo, report
from tests.conformance.harness import Result, entry_outcome, run_entry

# OpInfo full names (name or name.variant). One entry each, float32, forward + backward.
CI_OPS = (
    "add",
    "mul",
    "sub",
    "div.no_rounding_mode",
    "exp",
    "log",
    "tanh",
    "sigmoid",
    "rsqrt",
    "pow",
    "maximum",
    "nn.functional.relu",
    "nn.functional.gelu",
    "nn.functional.silu",
    "softmax",
    "log_softmax",
    "nn.functional.layer_norm",
    "nn.functional.linear",
    "mm",
    "bmm",
    "addmm",
    "matmul",
    "sum",
    "mean",
    "amax",
    "argmax",
    "var",
    "std",
    "where",
    "clamp",
    "masked_fill",
    "cat",
    "stack",
    "reshape",
    "permute",
    "transpose",
    "expand",
    "squeeze",
    "unsqueeze",
    "nn.functional.embedding",
    "gather",
    "index_select",
    "nn.functional.conv2d",
    "nn.functional.max_pool2d",
    "nn.functional.avg_pool2d",
    "nn.functional.batch_norm",
    "nn.functional.cross_entropy",
)


@functools.cache
def _op_db() -> dict[str, object]:
    return {opinfo.full_name(op): op for op in opinfo.load_op_db()}


@functools.cache
def _expectations() -> tuple[dict[str, str], ...]:
    return tuple(opinfo.load_expectations())


def _describe(results: list[Result]) -> str:
    return "\n".join(
        f"  {r.phase}: {r.outcome} {r.reason} (max abs err {r.max_abs_err})" for r in results
    )


@pytest.mark.parametrize("name", CI_OPS)
def test_opinfo_float32(name):
    op = _op_db()[name]
    results = run_entry(op, torch.float32, expectations=list(_expectations()))
    overall = entry_outcome(results)
    xpass = [r for r in results if r.reason.startswith("XPASS")]
    assert not xpass, f"{name} passes now: remove it from expectations.toml\n{_describe(results)}"
    assert overall.outcome in ("pass", "xfail"), f"{name} float32:\n{_describe(results)}"


def test_ci_slice_names_exist():
    missing = [n for n in CI_OPS if n not in _op_db()]
    assert not missing


def test_expectations_file_is_valid():
    entries = opinfo.load_expectations()
    known = set(_op_db()) | {op.name for op in _op_db().values()}
    for e in entries:
        assert e["op"] in known, f"expectations.toml names unknown OpInfo {e['op']!r}"
        assert e.get("dtype", "*") in ("*", *opinfo.DTYPES)
        assert e.get("phase", "*") in ("*", "forward", "backward")


# --------------------------------------------------------------------------- classifier


def _phase(results: list[Result], phase: str) -> Result:
    return next(r for r in results if r.phase == phase)


def test_a_layout_as_inductors_passes_with_its_note():
    """bf16 ``tensordot``: PyTorch's fake-tensor meta lays one grad out otherwise than eager's
    kernel; Inductor returns the meta's layout, and so do we."""
    from tests.conformance.harness import INDUCTOR_LAYOUT_NOTE

    results = run_entry(_op_db()["tensordot"], torch.bfloat16)
    backward = _phase(results, "backward")
    assert (backward.outcome, backward.reason) == ("pass", INDUCTOR_LAYOUT_NOTE)


def test_a_layout_no_pytorch_backend_shares_is_a_mismatch(monkeypatch):
    """A backend that returned contiguous outputs where eager keeps the input's layout (ours
    before it restrided outputs) is caught: neither aot_eager nor Inductor excuses it."""
    from neuron_compile import compiled_graph

    assemble = compiled_graph._OutputPlan.assemble

    def contiguous_outputs(plan, results, inputs):
        plan.restrides = []
        return assemble(plan, results, inputs)

    monkeypatch.setattr(compiled_graph._OutputPlan, "assemble", contiguous_outputs)
    op = _opinfo("test_permuted_gelu", lambda x: F.gelu(x) * 2.0, _permuted)
    forward = _phase(run_entry(op, torch.float32), "forward")
    assert forward.outcome == "mismatch" and "strides" in forward.reason, forward


def _opinfo(name, fn, sample_fn, **kw):
    opinfo.load_op_db()  # first: registers the expecttest stand-in the imports below need
    from torch.testing._internal.common_dtype import floating_types
    from torch.testing._internal.opinfo.core import OpInfo

    return OpInfo(name, op=fn, dtypes=floating_types(), sample_inputs_func=sample_fn, **kw)


def _one_matrix(op, device, dtype, requires_grad, **kwargs):
    from torch.testing._internal.opinfo.core import SampleInput

    t = torch.randn(4, 4, dtype=dtype, device=device)
    yield SampleInput((t @ t.T).requires_grad_(requires_grad), kwargs={"UPLO": "L"})


def _permuted(op, device, dtype, requires_grad, **kwargs):
    from torch.testing._internal.opinfo.core import SampleInput

    x = torch.randn(2, 64, 32, dtype=dtype, device=device).permute(0, 2, 1)
    yield SampleInput(x.requires_grad_(requires_grad))


def _one_vector(op, device, dtype, requires_grad, **kwargs):
    from torch.testing._internal.opinfo.core import SampleInput

    yield SampleInput(torch.randn(8, dtype=dtype, device=device, requires_grad=requires_grad))


def _wrong_when_compiled(x):
    return x + 1 if torch.compiler.is_compiling() else x.sin()


def test_mismatch_is_recorded_with_error_size():
    op = _opinfo("test_mismatch", _wrong_when_compiled, _one_vector)
    results = run_entry(op, torch.float32)
    fwd = results[0]
    assert (fwd.phase, fwd.outcome) == ("forward", "mismatch")
    assert fwd.max_abs_err is not None and fwd.max_abs_err > 1e-3


def test_unsupported_op_is_recorded_not_raised():
    from tests.custom_ops import cpu_scan  # an op no backend can lower

    op = _opinfo("test_cpu_scan", lambda x, **_: cpu_scan(x), _one_matrix)
    results = run_entry(op, torch.float32)
    overall = entry_outcome(results)
    assert overall.outcome == "fallback", _describe(results)
    assert "cpu_scan" in overall.reason


def test_backend_crash_is_an_error_with_its_type(monkeypatch):
    import neuron_compile.backend as backend

    def boom(*args, **kwargs):
        raise RuntimeError("deliberate failure\nsecond line")

    monkeypatch.setattr(backend, "compile_graph", boom)
    results = run_entry(_opinfo("test_boom", torch.sin, _one_vector), torch.float32)
    assert (results[0].outcome, results[0].reason) == (
        "error",
        "RuntimeError: deliberate failure",
    )


def test_timeout_ends_the_entry_not_the_run():
    def slow_samples(op, device, dtype, requires_grad, **kwargs):
        time.sleep(5)
        yield from _one_vector(op, device, dtype, requires_grad)

    start = time.perf_counter()
    results = run_entry(_opinfo("test_slow", torch.sin, slow_samples), torch.float32, timeout=0.5)
    assert time.perf_counter() - start < 3
    assert results[0].outcome == "error" and "OpTimeout" in results[0].reason


def test_expected_failures_become_xfail_and_random_ops_skip():
    op = _opinfo("test_mismatch", _wrong_when_compiled, _one_vector)
    xfail = [{"op": "test_mismatch", "dtype": "float32", "reason": "deliberately wrong"}]
    results = run_entry(op, torch.float32, expectations=xfail)
    assert results[0].outcome == "xfail"
    assert results[0].reason.startswith("deliberately wrong [mismatch:")
    dropout = _op_db()["nn.functional.dropout"]
    assert run_entry(dropout, torch.float32)[0].outcome == "skip"


def test_summary_counts_entries_and_pass_rate():
    rows = [
        Result("a", "", "float32", "forward", "pass"),
        Result("a", "", "float32", "backward", "mismatch", "grad output 0 differs", 0.5),
        Result("b", "", "float32", "forward", "pass"),
        Result("c", "", "float32", "forward", "skip", "random"),
        Result(
            "d",
            "",
            "float32",
            "forward",
            "fallback",
            "unsupported: aten.x.default: no lowering registered",
        ),
    ]
    s = report.summarize(rows)["float32"]
    assert (s.total, s.attempted, s.counts["pass"], s.counts["mismatch"]) == (4, 3, 1, 1)
    assert s.pass_rate == pytest.approx(1 / 3)
    md = report.markdown(rows, command="x", meta={})
    assert "33.3%" in md and "`aten.x.default` (d)" in md


def test_doc_section_replacement_keeps_the_rest_of_the_doc():
    from tests.conformance.run import DOC_END, DOC_START, replace_section

    doc = f"# title\n{DOC_START}\nstale numbers\n{DOC_END}\n## next\n"
    out = replace_section(doc, "| fresh | table |\n")
    assert out == f"# title\n{DOC_START}\n| fresh | table |\n{DOC_END}\n## next\n"
    assert replace_section(out, "| fresh | table |") == out  # idempotent


def test_the_generated_section_lives_in_docs_conformance_md():
    from tests.conformance.run import DOC_END, DOC_PATH, DOC_START
    from tests.helpers import REPO_ROOT

    doc = (REPO_ROOT / DOC_PATH).read_text()
    assert doc.count(DOC_START) == 1 and doc.count(DOC_END) == 1
    assert doc.index(DOC_START) < doc.index(DOC_END)
    assert DOC_START not in (REPO_ROOT / "README.md").read_text()
