"""Regression tests for lowering bugs found by the model-level parity tests and by fuzzing (one
test per bug)."""

from __future__ import annotations

import pytest
import torch
from torch.testing import FileCheck

from neuron_compile.compiler import DowncastWarning
from tests.helpers import lower_to_text


def _compiled(fn):
    torch._dynamo.reset()  # each case a first compile: a dtype or function change is no recompile
    return torch.compile(fn, backend="neuron", dynamic=False)


def test_arange_without_step_traces_as_start_step():
    # torch.arange(n) reaches the backend as aten.arange.start_step(0, n) with no step argument;
    # the rule used to unpack three numbers and failed on every position-embedding model.
    def fn(x):
        t = x.shape[0]
        return x + torch.arange(t) + torch.arange(2, 2 + t) + torch.arange(0, 2 * t, 2)

    x = torch.randn(5)
    torch.testing.assert_close(_compiled(fn)(x), fn(x))
    FileCheck().check("stablehlo.iota").check_not("custom_call").run(lower_to_text(fn, x))


def test_arange_float_start_and_int_dtype():
    def fn(x):
        t = x.shape[0]
        return x + torch.arange(0.5, t + 0.5) + torch.arange(1, 3 * t + 1, 3, dtype=torch.int32)

    x = torch.randn(4)
    torch.testing.assert_close(_compiled(fn)(x), fn(x))


def test_bf16_leaky_relu_rounds_once_like_eager():
    # The rule multiplied in bf16 by the slope rounded to bf16; eager multiplies in float32 and
    # rounds once: a quarter of the elements differed in their last bit.
    def fn(x):
        return torch.nn.functional.leaky_relu(x, 0.3)

    x = torch.randn(4096).bfloat16()
    assert torch.equal(_compiled(fn)(x), fn(x))


def test_division_by_a_broadcast_divisor_is_true_division():
    # XLA rewrote x / c (a Python number, a 0-d or a broadcast tensor) into x * (1/c): 41% of
    # the quotients by 0.37 were an ulp off eager's true division.
    x, y, s = torch.randn(4096), torch.randn(64), torch.tensor(0.37)
    for fn, args in [
        (lambda x: x / 0.37, (x,)),
        (lambda x, s: x / s, (x, s)),
        (lambda x, y: x.view(64, 64) / y[:, None], (x, y)),
        (lambda x, s: x / s.expand_as(x), (x, s)),
        (lambda x: x / torch.full_like(x, 0.37), (x,)),
        (lambda x, s: x.div(s, rounding_mode=None), (x, s)),
    ]:
        assert torch.equal(_compiled(fn)(*args), fn(*args))


def test_nextafter_and_frexp_of_subnormals_in_every_float_width():
    # XLA's CPU client compares subnormals as zero: nextafter stepped from a subnormal x as if
    # from 0. bf16/f16 step their own 16-bit patterns (c10's nextafter), frexp widens exactly.
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        tiny = torch.finfo(dtype).tiny
        x = torch.tensor([0.0, -0.0, tiny, tiny / 4, -tiny / 2, 1.0, float("inf")]).to(dtype)
        y = torch.tensor([1.0, -1.0, 0.0, 1.0, -1.0, 1.0, 0.0]).to(dtype)
        bits = torch.int32 if dtype == torch.float32 else torch.int16
        got = _compiled(torch.nextafter)(x, y)
        assert torch.equal(got.view(bits), torch.nextafter(x, y).view(bits)), dtype
        mantissa, exponent = _compiled(torch.frexp)(x)
        expected = torch.frexp(x)
        assert torch.equal(mantissa, expected[0]) and torch.equal(exponent, expected[1]), dtype


def test_bf16_matrix_exp_is_the_float32_one_rounded_once():
    a = (torch.randn(3, 4, 4) / 2).bfloat16()
    got = _compiled(torch.linalg.matrix_exp)(a)
    exact = torch.linalg.matrix_exp(a.double())
    assert got.dtype == torch.bfloat16
    # one bf16 rounding of (nearly) the exact exponential
    torch.testing.assert_close(got, exact.bfloat16(), rtol=8e-3, atol=8e-3)


def test_review_findings_of_the_long_tail_lowerings():
    # bool viewed as a wider dtype (was NC102: a plain convert of 1-byte bools)
    x = torch.tensor([True, False, True, True])
    for dtype in (torch.float16, torch.int16, torch.float32):
        got = _compiled(lambda x, d=dtype: (x & True).view(d))(x)
        assert torch.equal(got.view(torch.uint8), (x & True).view(dtype).view(torch.uint8))
    # segment_reduce of zero-element data (was a reshape error while tracing)
    data, lengths = torch.randn(0, 2), torch.tensor([0, 0])
    seg = lambda d, n: torch.segment_reduce(d * 2, "sum", lengths=n)  # noqa: E731
    with pytest.warns(DowncastWarning, match=r"n \(int64 -> int32\)"):  # lengths: counted
        assert torch.equal(_compiled(seg)(data, lengths), seg(data, lengths))
    # float64 matrix_exp compiles again (float64 runs as float32)
    a = torch.randn(3, 3, dtype=torch.float64) / 3
    with pytest.warns(DowncastWarning, match=r"float64 -> float32"):
        got = _compiled(torch.linalg.matrix_exp)(a)
    torch.testing.assert_close(got, torch.linalg.matrix_exp(a))


def test_mode_of_floats_runs_eagerly_so_nan_counts_as_eager_counts_it():
    # Eager's mode counts runs in a sort that leaves NaN unordered ([nan, nan, nan, 1, 0] -> nan
    # at 0, [1, nan, 1, nan, 0] -> 0 at 4); the compiled pairwise count gave NaN no frequency.
    from neuron_compile.fallback import FallbackWarning

    nan = float("nan")
    for values in ([nan, nan, nan, 1.0, 0.0], [1.0, nan, 1.0, nan, 0.0], [2.0, 2.0, 1.0]):
        x = torch.tensor(values)
        with pytest.warns(FallbackWarning, match="aten.mode"):
            actual = _compiled(lambda x: x.mode(0))(x)
        expected = x.mode(0)
        torch.testing.assert_close(actual.values, expected.values, equal_nan=True)
        assert actual.indices.item() == expected.indices.item()
    ints = torch.tensor([[3, 1, 3, 2], [0, 0, 5, 5]], dtype=torch.int32)
    torch.testing.assert_close(_compiled(lambda x: x.mode(1).values)(ints), ints.mode(1).values)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.bool, torch.float32])
def test_any_and_all_keep_eagers_result_dtype(dtype):
    # any/all of uint8 return uint8 in eager; the rules returned bool (NC102).
    x = torch.tensor([[0, 3], [0, 0]]).to(dtype)
    for fn in (lambda x: x.any(1), lambda x: x.all(0), lambda x: x.any(), lambda x: x.all()):
        expected = fn(x)
        actual = _compiled(fn)(x)
        assert actual.dtype == expected.dtype and torch.equal(actual, expected)


@pytest.mark.parametrize("value", [2.5, -3.7, 300, True, 0.1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.uint8])
def test_copy_from_a_python_number_converts_as_eager(value, dtype):
    # x.copy_(2.5) reached the copy rule with a number as its source (NC102).
    def fn(x):
        return x.copy_(value) * 1

    expected = fn(torch.zeros(3, dtype=dtype))
    actual = _compiled(fn)(torch.zeros(3, dtype=dtype))
    assert actual.dtype == expected.dtype and torch.equal(actual, expected)


@pytest.mark.parametrize("eps", [None, 1e-3, 0.25])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.int32])
def test_logit_clamps_and_rounds_as_eagers_kernel(dtype, eps):
    # Eager clamps to [eps, 1 - eps] with bounds in the input's dtype (1 - 1e-3 is 1.0 in
    # bfloat16: inf above it) and computes op by op in that dtype; the reference decomposition
    # computed in float32 (6.906 where eager gives inf; a quarter of half results an ulp off).
    x = torch.cat([torch.linspace(-0.2, 1.2, 997), torch.tensor([0.0, 1.0, float("nan")])])
    x = x.to(dtype)
    fn = lambda x: torch.logit(x, eps=eps)  # noqa: E731
    actual, expected = _compiled(fn)(x), fn(x)
    assert actual.dtype == expected.dtype
    if dtype in (torch.float32, torch.int32):  # XLA's log is within an ulp of eager's
        torch.testing.assert_close(actual, expected, equal_nan=True)
    else:
        assert torch.equal(actual.nan_to_num(), expected.nan_to_num())
        assert torch.equal(actual.isnan(), expected.isnan())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_acosh_below_minus_one_is_nan(dtype):
    # Found by fuzzing: the formula's sqrt((x - 1)(x + 1)) is real again below -1, so acosh(-1e10)
    # was 0 and acosh(-1e20) inf; eager gives NaN everywhere below 1.
    x = torch.tensor([-2.0, -1e4, -1e10, -1e20, -3e38, -float("inf"), 0.5, 1.0, 2.0, 1e30])
    x = x.to(dtype)
    actual, expected = _compiled(torch.acosh)(x), torch.acosh(x)
    assert torch.equal(actual.isnan(), expected.isnan()), actual.tolist()
    torch.testing.assert_close(actual, expected, equal_nan=True)


def test_flip_of_a_zero_dim_tensor_is_the_tensor():
    # Found by fuzzing: the verifier rejected stablehlo.reverse of dimension 0 of a 0-d tensor.
    def fn(x):
        return (x * 2).flip(0), x.flip(-1)

    x = torch.tensor(3.0)
    assert _compiled(fn)(x) == fn(x)


@pytest.mark.parametrize("value", [0.5, -2.7, 3.0])
def test_integer_addcmul_casts_a_float_value_like_eager(value):
    # Found by fuzzing: PyTorch's reference rejects a float value= for integer tensors (a
    # ValueError at compile time); eager's kernel casts it to the integer type.
    def fn(a, b):
        return torch.addcmul(a, a, b, value=value)

    a = torch.tensor([1, 2, 3], dtype=torch.int32)
    b = torch.tensor([4, -5, 6], dtype=torch.int32)
    actual = _compiled(fn)(a, b)
    assert actual.dtype == torch.int32
    assert torch.equal(actual, fn(a, b))


def test_mixed_integer_addcmul_casts_a_float_value_like_eager():
    # The same through the promoting path: int16 self, int32 tensors.
    def fn(a, b):
        return torch.addcmul(a, b, b, value=2.5)

    a = torch.tensor([1, 2, 3], dtype=torch.int16)
    b = torch.tensor([4, -5, 6], dtype=torch.int32)
    actual, expected = _compiled(fn)(a, b), fn(a, b)
    assert actual.dtype == expected.dtype
    assert torch.equal(actual, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_var_and_std_of_huge_deviations_do_not_overflow(dtype):
    # Eager computes var/std of float32 and bf16 in double: deviations beyond 1.8e19 square
    # without overflowing. In float32 the squares (or their sum) were inf: std gave inf where
    # eager gives 3e19, var_mean's mean inf where eager gives 1.5e38.
    def fn(x):
        return (
            torch.std(x, dim=1),
            torch.var(x, dim=1, correction=0),
            torch.std_mean(x, dim=1, keepdim=True),
            torch.var_mean(x, dim=1),
        )

    x = torch.tensor(
        [[3e19, -3e19, 1.0, 0.0], [1e19, 1e19, 1e19, -1e19], [3e38, 3e38, 1.0, 2.0], [1, 2, 3, 4]]
    ).to(dtype)
    actual, expected = _compiled(fn)(x), fn(x)
    assert torch.isfinite(actual[0][:2]).all()  # the rows whose float32 squares overflowed
    torch.testing.assert_close(actual, expected, equal_nan=True)


def test_float32_scans_accumulate_in_float64_on_cpu_like_eager(tmp_path, monkeypatch):
    # Eager's CPU cumsum/cumprod accumulate float32 in double: cumprod([1e30, 1e30, 0, 2]) is
    # [1e30, inf, 0, 0] there (1e60 fits a double), where a float32 scan gave NaN after the inf
    # (inf * 0); and cumsum rounded at every step where eager rounds once per output.
    torch.manual_seed(0)
    x = torch.tensor([1e30, 1e30, 0.0, 2.0, 1e30])
    assert torch.equal(_compiled(lambda x: torch.cumprod(x, 0))(x), torch.cumprod(x, 0))
    y = torch.randn(2, 1000)
    assert torch.equal(_compiled(lambda y: torch.cumsum(y, 1))(y), torch.cumsum(y, 1))
    # trn targets have no float64: their module keeps the float32 scan
    monkeypatch.setenv("NEURON_COMPILE_DUMP_DIR", str(tmp_path))
    torch._dynamo.reset()
    torch.compile(lambda x: torch.cumprod(x, 0), backend="neuron", options={"target": "trn2"})(x)
    (module,) = tmp_path.glob("*/module.stablehlo.mlir")
    assert "stablehlo.multiply" in module.read_text() and "f64" not in module.read_text()
