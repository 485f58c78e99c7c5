"""Where bfloat16/float16 reductions round, as eager's CPU kernels do.

* ``sum``/``nansum``/``prod``/``cumsum``/``cumprod`` with ``dtype=float16`` (or bfloat16) cast
  the input first and then reduce: float32 values 1.0004 and -1.0, 300 times each, sum to 0
  (1.0004 rounds to 1.0 in float16); before, we summed the float32 values (0.12).
* ``scatter_add`` and ``scatter_reduce`` (sum, prod, mean) of bfloat16/float16 accumulate in
  float32 and round once, and a mean divides that rounded sum by its count, also rounded once
  (bfloat16: 301 -> 300); before, 200 times 3.0 added in bfloat16 gave 712 instead of 600, and
  a count added up in bfloat16 stopped at 256.
* ``index_reduce`` accumulates in the tensor's own dtype, as eager's does.
"""

from __future__ import annotations

import pytest
import torch

HALF = [torch.bfloat16, torch.float16]
pytestmark = [
    pytest.mark.filterwarnings("ignore::neuron_compile.compiler.DowncastWarning"),  # indices
    pytest.mark.filterwarnings("ignore:index_reduce\\(\\) is in beta"),
]


def _compiled(fn, *args):
    torch._dynamo.reset()
    return torch.compile(fn, backend="neuron")(*args)


@pytest.mark.parametrize("dtype", HALF)
def test_reductions_with_dtype_cast_their_input_first(dtype: torch.dtype) -> None:
    x = torch.tensor([1.0004, -1.0]).repeat(300)
    i = torch.tensor([2049, -2048] * 5, dtype=torch.int32)  # float16(2049) == 2048

    def fn(x, i):
        return (
            x.sum(dtype=dtype),
            x.nansum(dtype=dtype),
            x[:50].prod(dtype=dtype),
            x.cumsum(0, dtype=dtype),
            x[:50].cumprod(0, dtype=dtype),
            i.sum(dtype=dtype),
            x.reshape(20, 30).sum(1, dtype=dtype),
        )

    expected, actual = fn(x, i), _compiled(fn, x, i)
    assert expected[0] == 0  # the case: summed unrounded it is 0.12
    for a, e in zip(actual, expected, strict=True):
        assert a.dtype == e.dtype
        torch.testing.assert_close(a, e, rtol=0, atol=0)


def _scatters(x, index, src, row_index, rows):
    return (
        x.scatter_add(1, index, src),
        x.scatter_reduce(1, index, src, "sum"),
        x.scatter_reduce(1, index, src, "sum", include_self=False),
        x.scatter_reduce(1, index, src, "mean"),
        x.scatter_reduce(1, index, src, "mean", include_self=False),
        x.scatter_reduce(1, index, (src / 8 + 0.9).to(src.dtype), "prod", include_self=False),
        x.scatter_reduce(1, index, src, "amax"),
        x[0].scatter_add(0, index[0], src[0]),
        x.index_reduce(0, row_index, rows, "mean", include_self=False),
        x.index_reduce(0, row_index, rows, "prod"),
    )


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("pattern", ["one_slot", "random"])
def test_scatter_reductions_accumulate_like_eager(dtype: torch.dtype, pattern: str) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(3, 4, generator=g).to(dtype)
    if pattern == "one_slot":  # 300 equal addends in one position: bfloat16 sums drift
        index = torch.zeros(3, 300, dtype=torch.long)
        src = torch.full((3, 300), 3.0, dtype=dtype)
    else:
        index = torch.randint(0, 4, (3, 300), generator=g)
        src = (torch.rand(3, 300, generator=g) * 3).to(dtype)
    row_index = torch.randint(0, 3, (40,), generator=g)
    rows = (torch.rand(40, 4, generator=g) + 0.5).to(dtype)
    expected = _scatters(x, index, src, row_index, rows)
    actual = _compiled(_scatters, x, index, src, row_index, rows)
    for a, e in zip(actual, expected, strict=True):
        assert a.dtype == e.dtype
        torch.testing.assert_close(a, e, rtol=0, atol=0)
