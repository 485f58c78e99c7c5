"""Integer ``pow`` with negative exponents follows eager (ATen's ``powi``): 1 for base 1, -1 or 1
by parity for base -1, 0 for every other base. StableHLO leaves a negative integer exponent to
the backend and XLA CPU's classic emitters gave 0 for base -1 (found by the OpInfo sweep's
``__rpow__`` entries)."""

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
