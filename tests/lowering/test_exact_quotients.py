"""Divisions by a constant that eager performs element by element stay divisions (``exact_divide``):
XLA rewrites ``x / c`` into ``x * (1 / c)``, an ulp off for up to four quotients in ten. In a mean
that ulp gave a constant row a non-zero variance, which layer_norm magnified (found by fuzzing
edge values against eager)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F


def _compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, backend="neuron")


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: F.layer_norm(x, (1000,)),
        lambda x: F.group_norm(x.view(2, 4, 250), 2),
        lambda x: x.std(dim=1),
        lambda x: torch.var_mean(x, dim=1)[0],
    ],
    ids=["layer_norm", "group_norm", "std", "var_mean"],
)
def test_constant_rows_have_zero_spread(fn) -> None:
    x = torch.full((2, 1000), 30000.0)  # 30000 * (1 / 1000) * 1000 != 30000 in float32
    actual = _compiled(fn)(x)
    assert torch.equal(actual, fn(x))
    assert actual.abs().max().item() == 0.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("decimals", [-2, -1, 1, 2, 3])
def test_round_to_decimals_matches_eager(dtype: torch.dtype, decimals: int) -> None:
    # Eager computes in float32 for bfloat16/float16 and divides exactly.
    g = torch.Generator().manual_seed(decimals + 10)
    x = (torch.randn(20000, generator=g) * 300).to(dtype)
    x = torch.cat([x, torch.tensor([255.0, 394.0, -112.5, -4.75, -4.25], dtype=dtype)])
    actual = _compiled(lambda t: torch.round(t, decimals=decimals))(x)
    expected = torch.round(x, decimals=decimals)
    assert actual.dtype == expected.dtype
    assert torch.equal(actual, expected), f"{(actual != expected).sum().item()} differ"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mode", ["floor", "trunc"])
def test_rounded_division_keeps_the_dtypes_subnormals(dtype: torch.dtype, mode: str) -> None:
    # The float16 rounding step between float32 intermediates flushed float16's subnormals (a
    # reduce_precision); eager keeps them: float16 1e-6 // 1e-6 is 1, not 0.
    g = torch.Generator().manual_seed(0)
    n = 50000
    a = (torch.randn(n, generator=g) * torch.logspace(-7, 3, n)).to(dtype)
    b = (torch.randn(n, generator=g) * torch.logspace(2, -7, n)).to(dtype)
    a = torch.cat([a, torch.tensor([1e-6, 2e-6, 6e-5], dtype=dtype)])
    b = torch.cat([b, torch.tensor([1e-6, 1e-6, 1e-5], dtype=dtype)])
    actual = _compiled(lambda x, y: torch.div(x, y, rounding_mode=mode))(a, b)
    expected = torch.div(a, b, rounding_mode=mode)
    same = (actual == expected) | (actual.isnan() & expected.isnan())
    assert same.all(), f"{(~same).sum().item()} differ"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("exponent", [0.5, -0.5])
def test_square_root_powers_are_eager_sqrt_and_reciprocal_sqrt(dtype, exponent):
    """Eager's pow(x, ±0.5) is sqrt / 1/sqrt for float32, float64 and bfloat16: NaN at -inf and
    -0.0 (or -inf) at -0.0, where IEEE pow gave inf and +0.0 (or 0 and +inf); float16 keeps pow
    in eager and here. Elsewhere within an ulp (eager's vectorized sqrt is not always correctly
    rounded; XLA's is)."""
    special = torch.tensor(
        [-float("inf"), -0.0, 0.0, float("nan"), -1.0, float("inf")], dtype=dtype
    )
    x = torch.cat([special, torch.linspace(0.01, 100.0, 997, dtype=dtype)])
    torch._dynamo.reset()
    actual = torch.compile(lambda t: t**exponent, backend="neuron")(x)
    expected = x**exponent
    assert actual.dtype == expected.dtype
    a, e = actual[: len(special)], expected[: len(special)]
    assert bool(((a == e) | (a.isnan() & e.isnan())).all()), (a.tolist(), e.tolist())
    assert torch.equal(a.signbit() | a.isnan(), e.signbit() | e.isnan())
    torch.testing.assert_close(actual[len(special) :], expected[len(special) :])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("exponent", [3.0, 3, -2.0, -1.0, 1.0, 0.0])
def test_small_integer_powers_are_eager_products(dtype, exponent):
    """Eager's pow(x, 3) is x * x * x and pow(x, -2) is 1 / (x * x), rounded after each step,
    pow(x, -1) is 1 / x, and exponents 1 and 0 copy or fill ones: the same bits here, where
    XLA's libm pow gave the cube correctly rounded (an ulp off eager's in a quarter of these
    float32 elements; GPT-2's GELU spent a third of its forward in powf)."""
    special = torch.tensor([-float("inf"), -0.0, 0.0, float("nan"), 1e-30, -3e12], dtype=dtype)
    g = torch.Generator().manual_seed(3)
    x = torch.cat([special, (torch.randn(20000, generator=g) * 4).to(dtype)])
    torch._dynamo.reset()
    actual = torch.compile(lambda t: t**exponent, backend="neuron")(x)
    expected = x**exponent
    assert actual.dtype == expected.dtype
    same = ((actual == expected) & (actual.signbit() == expected.signbit())) | (
        actual.isnan() & expected.isnan()
    )
    assert same.all(), f"{(~same).sum().item()} differ, at {x[~same][:4].tolist()}"
