"""Integer ``pow`` matches eager bit for bit. Negative exponents follow ATen's ``powi``: 1 for
base 1, -1 or 1 by parity for base -1, 0 for every other base (XLA CPU's classic emitters gave 0
for base -1; found by the OpInfo sweep's ``__rpow__`` entries). Large exponents wrap like eager:
XLA's integer power squares only six times and read uint8 exponents >= 128 as negative, so
``2 ** 64`` gave 1 and ``3 ** 200`` gave 0 in uint8."""

from __future__ import annotations

import pytest
import torch


# int64 runs narrowed to int32 (the default 64-bit policy), with its one DowncastWarning.
@pytest.mark.filterwarnings("ignore::neuron_compile.compiler.DowncastWarning")
@pytest.mark.parametrize("dtype", [torch.int16, torch.int32, torch.int64])
def test_negative_exponents_match_eager(dtype: torch.dtype) -> None:
    base = torch.tensor([-3, -2, -1, 0, 1, 2, 3], dtype=dtype).view(-1, 1)
    exp = torch.tensor([-5, -2, -1, 0, 1, 2, 3], dtype=dtype).view(1, -1)
    torch._dynamo.reset()
    actual = torch.compile(torch.pow, backend="neuron")(base, exp)
    expected = torch.pow(base, exp)
    assert actual.dtype == expected.dtype
    assert torch.equal(actual, expected)
    assert expected[2].tolist() == [-1, 1, -1, 1, -1, 1, -1]  # the case that differed


def test_scalar_base_of_minus_one() -> None:
    exp = torch.tensor([-5, -4, -1, 0, 3], dtype=torch.int32)
    torch._dynamo.reset()
    actual = torch.compile(lambda e: (-1) ** e, backend="neuron")(exp)
    assert torch.equal(actual, (-1) ** exp)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32])
def test_every_small_base_and_exponent_wraps_like_eager(dtype: torch.dtype) -> None:
    values = torch.arange(256, dtype=torch.int32).to(dtype)  # int8 wraps to -128..127
    base, exp = values.view(-1, 1), values.view(1, -1)
    if dtype.is_signed:
        exp = exp.abs()  # int8's -128 stays negative: covered by the negative-exponent test
    torch._dynamo.reset()
    actual = torch.compile(torch.pow, backend="neuron")(base, exp)
    expected = torch.pow(base, exp)
    assert actual.dtype == expected.dtype
    mismatched = (actual != expected).nonzero().tolist()
    assert mismatched == [], f"{len(mismatched)} wrong, e.g. (base, exp) {mismatched[:5]}"


@pytest.mark.parametrize("exponent", [3, 64, 200, 255])
def test_scalar_exponents_and_bases_wrap_like_eager(exponent: int) -> None:
    values = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    torch._dynamo.reset()
    power = torch.compile(lambda x: x**exponent, backend="neuron")(values)
    assert torch.equal(power, values**exponent)
    torch._dynamo.reset()
    exponential = torch.compile(lambda x: exponent**x, backend="neuron")(values)
    assert torch.equal(exponential, exponent**values)


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int32])
def test_a_negative_scalar_exponent_of_integers_raises_as_eager(dtype: torch.dtype) -> None:
    # Eager refuses ``int_tensor ** -1``; compiled returned [1, -1, 0, 0]. The op runs eagerly.
    x = torch.tensor([1, 0, 2], dtype=torch.int32).to(dtype)
    with pytest.raises(RuntimeError, match="Integers to negative integer powers"):
        x**-1
    torch._dynamo.reset()
    with pytest.raises(RuntimeError, match="Integers to negative integer powers"):
        with pytest.warns(Warning):  # the FallbackWarning of the op that runs eagerly
            torch.compile(lambda x: x**-1, backend="neuron")(x)
