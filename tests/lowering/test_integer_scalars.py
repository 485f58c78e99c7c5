"""Python integers outside a tensor's integer dtype wrap as eager casts them (uint8 ``x + -1``
adds 255, ``x == 256`` compares with 0) instead of failing the module's verifier (NC103), and
``abs`` of an unsigned tensor is the identity (``stablehlo.abs`` takes signed types only).
Floats converted to int8/int16/uint8 anywhere (``copy_`` into a uint8 tensor, a reduction's
``dtype=``) wrap through int32 as eager's casts do, not saturate. Found by fuzzing edge values
against eager."""

from __future__ import annotations

import pytest
import torch

CASES = {
    "add_negative": lambda x: x + -1,
    "greater_than_negative": lambda x: x > -1,
    "equal_out_of_range": lambda x: x == 256,
    "mask_wider_than_dtype": lambda x: x & 0x1FF,
    "remainder_by_negative": lambda x: torch.remainder(x, -3),
    "fmod_by_negative": lambda x: torch.fmod(x, -3),
    "full_like_negative": lambda x: torch.full_like(x, -1),
    "where_negative": lambda x: torch.where(x > 0, x, -1),
    "add_above_range": lambda x: x + 300,
    "abs": lambda x: x.abs(),
}


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8])
@pytest.mark.parametrize("name", list(CASES))
def test_out_of_range_scalars_wrap_like_eager(name: str, dtype: torch.dtype) -> None:
    fn = CASES[name]
    x = torch.arange(256, dtype=torch.int32).to(dtype)  # every value of the dtype
    torch._dynamo.reset()
    actual = torch.compile(fn, backend="neuron")(x)
    expected = fn(x)
    assert actual.dtype == expected.dtype
    assert torch.equal(actual, expected)


def _narrowing_casts(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    u = torch.zeros(x.shape, dtype=torch.uint8)
    u.copy_(x)
    i = torch.zeros(x.shape, dtype=torch.int8)
    i[:] = x
    return (
        u,
        i,
        x.to(torch.uint8),
        x.half().to(torch.int16),
        x.sum(dtype=torch.uint8),
        x.cumsum(0, dtype=torch.int8),
        x.bfloat16().cumprod(0, dtype=torch.uint8),
    )


def test_floats_wrap_into_narrow_integers_like_eager() -> None:
    x = torch.tensor([-3.7, -1.0, 300.0, -129.0, 40000.0, 0.5, 255.9])
    torch._dynamo.reset()
    actual = torch.compile(_narrowing_casts, backend="neuron")(x)
    for got, expected in zip(actual, _narrowing_casts(x), strict=True):
        assert got.dtype == expected.dtype
        assert torch.equal(got, expected), (got, expected)
