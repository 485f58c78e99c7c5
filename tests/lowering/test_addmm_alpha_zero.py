"""``alpha=0`` in float32 ``addmm``, ``addmv`` and ``addbmm``: eager's GEMM never reads the
matrices, so NaN or inf in them does not reach the result; ``baddbmm`` and half-precision
products do propagate it, in eager and here alike. Before, all of them propagated it."""

from __future__ import annotations

import pytest
import torch

NAN = float("nan")


def _operands(dtype: torch.dtype):
    m = torch.ones(2, 2, dtype=dtype)
    a = torch.tensor([[NAN, 1.0], [1.0, float("inf")]], dtype=dtype)
    return m, a, torch.ones(2, 2, dtype=dtype)


CALLS = {
    "addmm": lambda m, a, b, **k: torch.addmm(m, a, b, **k),
    "addmv": lambda m, a, b, **k: torch.addmv(m[0], a, b[0], **k),
    "addbmm": lambda m, a, b, **k: torch.addbmm(m, a[None], b[None], **k),
    "baddbmm": lambda m, a, b, **k: torch.baddbmm(m[None], a[None], b[None], **k),
}


@pytest.mark.parametrize("beta", [1.0, 0.5, 0.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("op", list(CALLS))
def test_alpha_zero_matches_eager(op: str, dtype: torch.dtype, beta: float) -> None:
    def f(m, a, b):
        return CALLS[op](m, a, b, alpha=0, beta=beta)

    expected = f(*_operands(dtype))
    actual = torch.compile(f, backend="neuron")(*_operands(dtype))
    torch.testing.assert_close(actual, expected, equal_nan=True)
    if dtype == torch.float32 and op != "baddbmm":
        assert not actual.isnan().any()
