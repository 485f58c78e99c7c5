"""A scalar (a Python number or a 0-d tensor) combined with a bfloat16/float16 tensor is read as
eager's kernels read it: rounded to the tensor's dtype first for add, sub, comparisons, pow
(TensorIterator casts it to the common dtype), unrounded for mul and div (they read the
original scalar in float32). Before, ``x + 0.1`` in bfloat16 added float32's 0.1: 1 ulp off for 1-17 % of values,
and ``x == 0.1`` was False where eager says True. Checked over every normal finite value of
each dtype (subnormals: XLA CPU flushes them, docs/semantics.md)."""

from __future__ import annotations

import pytest
import torch

OPS = {
    "add": lambda a, s: a + s,
    "sub": lambda a, s: a - s,
    "rsub": lambda a, s: s - a,
    "add_alpha": lambda a, s: torch.add(a, a, alpha=s),
    "eq": lambda a, s: a == s,
    "lt": lambda a, s: a < s,
    "pow": lambda a, s: torch.pow(a.abs(), s),
    "rpow": lambda a, s: s ** a.clamp(-5, 5),
    "mul": lambda a, s: a * s,
    "div": lambda a, s: a / s,
    "floor_div": lambda a, s: torch.div(a, s, rounding_mode="floor"),
    "trunc_div": lambda a, s: torch.div(a, s, rounding_mode="trunc"),
}


def _normal_values(dtype: torch.dtype) -> torch.Tensor:
    x = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype)
    return x[torch.isfinite(x) & ((x.float().abs() >= torch.finfo(dtype).tiny) | (x == 0))]


def _same(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Equal, both NaN, or eager's result is subnormal or the smallest normal (a float32
    subnormal rounded up: XLA CPU flushed it first)."""
    if not expected.dtype.is_floating_point:
        return actual == expected
    subnormal = (expected.float().abs() <= torch.finfo(dtype).tiny) & (expected != 0)
    return (actual == expected) | (actual.isnan() & expected.isnan()) | subnormal


# A 0-d int64 runs as int32 (the default 64-bit policy), with its one DowncastWarning.
@pytest.mark.filterwarnings("ignore::neuron_compile.compiler.DowncastWarning")
@pytest.mark.parametrize(
    "scalar",
    [0.1, 2.7, 1003, torch.tensor(0.1), torch.tensor(1003)],
    ids=["float", "float2", "int", "0d_float32", "0d_int64"],
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", list(OPS))
def test_scalars_are_read_as_eager_reads_them(name: str, dtype: torch.dtype, scalar) -> None:
    op = OPS[name]
    x = _normal_values(dtype)
    torch._dynamo.reset()
    actual = torch.compile(lambda t: op(t, scalar), backend="neuron")(x)
    expected = op(x, scalar)
    assert actual.dtype == expected.dtype
    wrong = (~_same(actual, expected, dtype)).nonzero().flatten()
    assert wrong.numel() == 0, f"{wrong.numel()} differ, e.g. x={x[wrong[:3]].tolist()}"


def test_equality_with_the_rounded_scalar() -> None:
    x = torch.tensor([0.10009765625], dtype=torch.bfloat16)  # bfloat16(0.1)
    torch._dynamo.reset()
    assert torch.compile(lambda t: t == 0.1, backend="neuron")(x).item() is True


@pytest.mark.parametrize(
    "weight", [0.1, 0.7, torch.tensor(0.1), torch.tensor(0.7)], ids=["0.1", "0.7", "0d", "0d_big"]
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_lerp_weights_are_read_as_eager_reads_them(dtype: torch.dtype, weight) -> None:
    # A 0-d float32 weight is cast to the operands' dtype first; the result is computed in
    # float32 from the end nearer the weight and rounded once (decompositions/lerp.py).
    if dtype == torch.float32:
        x = torch.randn(100003, generator=torch.Generator().manual_seed(0)) * 100
    else:
        x = _normal_values(dtype)
    end = x.flip(0) * 0.37
    torch._dynamo.reset()
    actual = torch.compile(torch.lerp, backend="neuron")(x, end, weight)
    expected = torch.lerp(x, end, weight)
    assert actual.dtype == expected.dtype
    wrong = (~_same(actual, expected, dtype)).sum().item()
    assert wrong == 0, f"{wrong} differ"


INT_OPS = {
    "eq": lambda i, h: i == h,
    "lt": lambda i, h: i < h,
    "sub": lambda i, h: i - h,
    "add_alpha": lambda i, h: torch.add(h, i, alpha=3),
    "div": lambda i, h: i / h,
    "floor_div": lambda i, h: i // h,
    "atan2": lambda i, h: torch.atan2(i, h),
    "addcdiv": lambda i, h: torch.addcdiv(h, i, h),
    "addcmul": lambda i, h: torch.addcmul(h, i, h),
    "mul_0d": lambda i, h: i * h[:1].reshape(()),
    "pow_0d_base": lambda i, h: torch.tensor(-1.0, dtype=h.dtype) ** i,
    "logaddexp": lambda i, h: torch.logaddexp(i, h),  # PyTorch's decomposition, promoted
    "logaddexp2": lambda i, h: torch.logaddexp2(h, i),
}


@pytest.mark.filterwarnings("ignore::neuron_compile.compiler.DowncastWarning")  # int64 input
@pytest.mark.parametrize("int_dtype", [torch.int16, torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", list(INT_OPS))
def test_integer_tensors_are_rounded_to_a_half_common_dtype(name, dtype, int_dtype) -> None:
    """Eager casts an integer tensor to the common bfloat16/float16 dtype before computing; it
    went to float32 directly: int32 257 == bfloat16 256 was False (eager: True), 257 - 256 gave 1
    (eager: 0), an int beyond float16's range times a float16 0-d gave a number (eager: inf)."""
    i = torch.arange(-70000, 70000, 97)
    i = torch.cat([i, torch.tensor([257, 2049, 4097, 65519, 65521, -65521])])
    i = i.clamp(torch.iinfo(int_dtype).min, torch.iinfo(int_dtype).max).to(int_dtype)
    h = i.to(dtype).where(i % 3 != 0, torch.tensor(0.75, dtype=dtype))  # equal when rounded
    op = INT_OPS[name]
    torch._dynamo.reset()
    actual = torch.compile(op, backend="neuron")(i, h)
    expected = op(i, h)
    assert actual.dtype == expected.dtype
    wrong = (~_same(actual, expected, dtype)).nonzero().flatten()
    assert wrong.numel() == 0, f"{wrong.numel()} differ, e.g. i={i[wrong[:3]].tolist()}"
