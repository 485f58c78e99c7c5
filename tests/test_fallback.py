"""CPU fallback end to end: a model with an unsupported op in the middle trains like eager."""

from __future__ import annotations

import warnings

import pytest
import torch

import neuron_compile
from neuron_compile.compiler import DowncastWarning
from neuron_compile.fallback import FallbackWarning
from tests.custom_ops import CPU_SCAN, cpu_scan


class ScanNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(8, 16)
        self.out = torch.nn.Linear(16, 4)

    def forward(self, x):
        h = torch.relu(self.inp(x))
        h = cpu_scan(h)  # unsupported: runs on the CPU between two compiled regions
        return self.out(torch.tanh(h))


@pytest.fixture(autouse=True)
def _clear():
    neuron_compile.clear_fallback_ops()


def test_fallback_model_matches_eager_forward_and_backward():
    torch.manual_seed(0)
    model, x = ScanNet(), torch.randn(5, 8)
    compiled = torch.compile(model, backend="neuron")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = compiled(x)
        out.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    ref = model(x)
    ref.sum().backward()
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    for got, p in zip(grads, model.parameters(), strict=True):
        torch.testing.assert_close(got, p.grad, rtol=1e-4, atol=1e-5)

    fallback_warnings = [str(w.message) for w in caught if issubclass(w.category, FallbackWarning)]
    assert fallback_warnings, "one warning per graph listing the fallback ops"
    assert CPU_SCAN in fallback_warnings[0] and "test_fallback.py" in fallback_warnings[0]
    assert "ScanNet_" in fallback_warnings[0] and "forward" in fallback_warnings[0]


def test_fallback_report_counts_runtime_executions_and_records_regions():
    model, x = ScanNet(), torch.randn(5, 8)
    compiled = torch.compile(model, backend="neuron")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        for _ in range(3):
            compiled(x)
    assert neuron_compile.get_fallback_ops() == {CPU_SCAN: 3}
    (record,) = neuron_compile.metrics()
    assert record.fallback_ops == {CPU_SCAN: 1}
    assert record.regions == 2 and record.calls == 3
    neuron_compile.clear_fallback_ops()
    assert neuron_compile.get_fallback_ops() == {}


def test_fallback_error_policy_raises_naming_op_and_line():
    compiled = torch.compile(ScanNet(), backend="neuron", options={"fallback": "error"})
    with pytest.raises(Exception) as info:
        compiled(torch.randn(5, 8))
    message = str(info.value)
    assert "NC101" in message and CPU_SCAN in message
    assert "test_fallback.py" in message and "cpu_scan(h)" in message


def test_fully_supported_model_reports_no_fallback():
    torch.compile(torch.nn.Linear(3, 2), backend="neuron")(torch.randn(4, 3))
    assert neuron_compile.get_fallback_ops() == {}
    assert neuron_compile.metrics()[0].fallback_ops == {}


def test_data_dependent_shapes_stay_on_the_cpu():
    """nonzero's output size depends on the data: it and its consumers fall back, the rest compiles."""

    def f(x, w):
        h = torch.relu(x @ w)
        idx = torch.nonzero(h.sum(1) > 0).float()
        return idx * 2 + 1, h.sum()

    x, w = torch.randn(6, 4), torch.randn(4, 4)
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = torch.compile(f, backend="neuron", fullgraph=True)(x, w)
    for a, b in zip(got, f(x, w), strict=True):
        torch.testing.assert_close(a, b)
    messages = [str(w.message) for w in caught if issubclass(w.category, FallbackWarning)]
    assert messages and "aten.nonzero.default" in messages[0]
    (record,) = neuron_compile.metrics()
    assert record.regions >= 1 and "aten.nonzero.default" in record.fallback_ops
    # size plumbing (sym_size, operator.ge, _assert_scalar) runs eagerly but is not reported
    assert all(op.startswith("aten.") and "sym_" not in op for op in record.fallback_ops)


def test_partitioned_graph_warns_about_downcasts_once():
    from neuron_compile.compiler import DowncastWarning

    model = ScanNet().double()
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = torch.compile(model, backend="neuron")(torch.randn(5, 8, dtype=torch.float64))
    assert out.dtype == torch.float64
    downcasts = [w for w in caught if issubclass(w.category, DowncastWarning)]
    assert len(downcasts) == 1, [str(w.message) for w in downcasts]  # one per graph, not per region
    assert neuron_compile.metrics()[0].regions == 2


def test_int64_scalars_beyond_int32_run_on_the_cpu_with_exact_results():
    # int64 runs as int32 (the 64-bit policy); a Python int outside int32 cannot be narrowed, so
    # its op falls back instead of failing verification with an out-of-range constant.
    # (Values past int32 that then feed compiled int64 ops still wrap: the documented policy.)
    def f(t):
        return t.to(torch.int64) * 2**40, torch.full((1,), 2**35, dtype=torch.int64), t * 2

    x = torch.tensor([3], dtype=torch.int32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = torch.compile(f, backend="neuron")(x)
    for a, b in zip(got, f(x), strict=True):
        assert torch.equal(a, b)
    messages = [str(w.message) for w in caught if issubclass(w.category, FallbackWarning)]
    assert messages and "aten.mul.Tensor" in messages[0] and "aten.full.default" in messages[0]
    (record,) = neuron_compile.metrics()
    assert record.regions >= 1  # t * 2 (int32) still compiles


def test_int64_slices_to_the_end_stay_compiled():
    # AOTAutograd writes x[:, 1:] as slice(x, 1, 1, INT64_MAX): a bound, not a value.
    f = torch.compile(lambda ids: ids[:, 1:] + 1, backend="neuron", options={"fallback": "error"})
    ids = torch.arange(12).view(3, 4)
    with pytest.warns(DowncastWarning, match=r"ids \(int64 -> int32\)"):  # ids + 1: arithmetic
        assert torch.equal(f(ids), ids[:, 1:] + 1)


def test_int64_comparison_with_a_value_beyond_int32_runs_on_the_cpu():
    # A bool result, an int64 input: the value 2**40 would still be an int32 constant.
    ids = torch.tensor([2**40, 3])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = torch.compile(lambda t: t == 2**40, backend="neuron")(ids)
    assert torch.equal(got, torch.tensor([True, False]))
    messages = [str(w.message) for w in caught if issubclass(w.category, FallbackWarning)]
    assert messages and "aten.eq.Scalar" in messages[0]


def _eager_and_compiled(fn, *args):
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        return fn(*args), torch.compile(fn, backend="neuron")(*args)


@pytest.mark.parametrize(
    "fn",
    [
        lambda z: z.conj().imag * 1,  # _neg_view from the eager ops, read by a compiled region
        lambda z: torch.imag(torch.conj(z)) + torch.real(z),
        lambda z: torch.fft.ihfft(z.real).imag * 2,
        lambda z: torch.view_as_real(z.conj().resolve_conj()) * 1,  # the clone resolves the bit
    ],
)
def test_lazily_negated_or_conjugated_views_reach_compiled_regions_resolved(fn):
    """Eager complex ops hand the next compiled region views with the neg or conj bit set; their
    values are the resolved ones, not the storage dlpack would export (the sign was flipped)."""
    z = torch.tensor([1 + 2j, 3 - 4j, -0.5 + 0j, 2 + 0.25j], dtype=torch.complex64)
    expected, actual = _eager_and_compiled(fn, z)
    torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "dtype", [torch.complex64, torch.complex128, torch.float8_e4m3fn, torch.uint16]
)
def test_values_without_a_stablehlo_type_run_eagerly(dtype):
    """Indexing (whose rules check only the index tensors) and every other op on a dtype XLA
    cannot hold run on the CPU with eager's values: no rule is ever handed such a value."""
    x = torch.arange(6, dtype=torch.float32).reshape(3, 2).to(dtype)
    i = torch.tensor([2, 0])

    def index_then_put(x, i):
        y = x.clone()
        if x.dtype != torch.uint16:  # eager has no index_put for uint16
            y[i] = x[1]
        return x[i], y

    expected, actual = _eager_and_compiled(index_then_put, x, i)
    for a, e in zip(actual, expected, strict=True):
        assert a.dtype == e.dtype
        assert torch.equal(a.view(torch.uint8), e.view(torch.uint8))
    assert neuron_compile.get_fallback_ops()


def test_assigning_data_of_a_tensor_the_function_reads_compiles_and_matches_eager():
    """`p.data = p.data + x` inside a compiled function crashed in AOTAutograd ("Encountered a
    set_ on a graph input, but the input has other mutations that we cannot keep in the
    graph"); aot_eager and Inductor run it. Now the set_ runs on the CPU, loudly."""

    def run(backend):
        torch._dynamo.reset()
        p, w = torch.ones(3), torch.nn.Parameter(torch.ones(3))

        def inference(x):
            p.data = p.data + x
            return p * 1

        def training(x):
            w.data = w.data + x
            return (w * 3).sum()

        f, g = (torch.compile(k, backend=backend) if backend else k for k in (inference, training))
        outs = []
        for i in range(3):
            x = torch.arange(3.0) + i
            loss = g(x)
            loss.backward()
            outs += [f(x), loss.detach(), w.grad.clone()]
        return [*outs, p, w.detach()]

    expected = run(None)
    with pytest.warns(FallbackWarning, match=r"aten\.set_"):
        actual = run("neuron")
    for a, e in zip(actual, expected, strict=True):
        assert torch.equal(a, e)
