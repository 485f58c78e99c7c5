"""Python integers outside a tensor's integer dtype wrap as eager casts them (uint8 ``x + -1``
adds 255, ``x == 256`` compares with 0) instead of failing the module's verifier (NC103), and
``abs`` of an unsigned tensor is the identity (``stablehlo.abs`` takes signed types only). Found
by fuzzing edge values against eager."""

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
