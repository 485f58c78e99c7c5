"""Histograms, hash_tensor and gcd/lcm compiled through the backend vs eager, bit for bit.

``run_lowered`` compiles with ``fallback="error"``, so every case really runs our lowering. Inputs
put elements exactly on bin edges and on the outer edges, where a different float rounding of the
bin index (or of linspace's edges) would move a count to the neighbouring bin.
"""

from __future__ import annotations

import pytest
import torch

from neuron_compile.errors import UnsupportedOpError
from tests.helpers import run_lowered

aten = torch.ops.aten


def _on_edges(n: int, lo: float, hi: float, bins: int, seed: int) -> torch.Tensor:
    """``n`` values in [lo - 1, hi + 1], a third of them exactly on linspace edges."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, generator=g) * (hi - lo + 2) + lo - 1
    edges = torch.linspace(lo, hi, bins + 1)
    x[: n // 3] = edges[torch.randint(0, bins + 1, (n // 3,), generator=g)]
    return x


def _flat(out: object) -> list[torch.Tensor]:
    items = list(out) if isinstance(out, (tuple, list)) else [out]
    flat: list[torch.Tensor] = []
    for item in items:
        flat += list(item) if isinstance(item, (tuple, list)) else [item]
    return flat


def _assert_same(fn, *args: torch.Tensor, exact: bool = True) -> None:
    expected = _flat(fn(*args))
    actual = _flat(run_lowered(fn, *args))
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        assert a.dtype == e.dtype and a.shape == e.shape
        if exact:
            assert torch.equal(a, e), (a, e)
        else:  # density with weights: eager sums the bins in its own order
            torch.testing.assert_close(a, e, rtol=1e-6, atol=0)


_HISTC_RANGES = [(10, 0.0, 10.0), (7, -2.5, 3.1), (100, -10.0, 0.0), (13, 0.0, 0.0)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_histc_matches_eager_on_bin_edges(dtype):
    xs = []
    for bins, lo, hi in _HISTC_RANGES:
        x = _on_edges(90, lo, hi, bins, seed=bins).to(dtype)
        if lo == hi:  # the data's own extrema become the range: put values on its edges too
            x[:30] = torch.linspace(float(x.min()), float(x.max()), 30).to(dtype)
        xs.append(x)

    def fn(*args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(
            torch.histc(a, bins, lo, hi)
            for a, (bins, lo, hi) in zip(args, _HISTC_RANGES, strict=True)
        )

    _assert_same(fn, *xs)


def test_histc_edge_cases():
    def fn(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor):
        return (
            torch.histc(a, 4, 3, 3),  # min == max: the data's range, widened by 1
            torch.histc(b, 4),
            torch.histc(c, 3, 0, 1),  # 0-d
            torch.histc(d, 3, 0, 1),  # empty input
        )

    _assert_same(
        fn, torch.full((5,), 3.0), torch.full((5,), -2.0), torch.tensor(0.5), torch.empty(2, 0)
    )


def test_histc_float16_subnormal_steps_and_overflow():
    # x - min below float16's smallest normal must stay subnormal, not flush to 0 (bin 6, not 0)
    tiny = torch.cat([torch.tensor([-0.009796142578125]), torch.linspace(-0.00985, -0.00552, 20)])
    tiny = tiny.half()
    # range * bins overflows float16: eager's cast of the inf quotient puts those in bin 0
    wide = (torch.linspace(-60.0, 200.0, 40)).half()

    def fn(a: torch.Tensor, b: torch.Tensor):
        return torch.histc(a, 541, -0.009847661, -0.005518773), torch.histc(b, 806)

    _assert_same(fn, tiny, wide)


def test_histc_bf16_with_too_many_bins_is_left_to_eager():
    # bf16 rounding can put the maximum past the last bin for 137 bins; eager then writes into
    # another thread's histogram, which is not reproduced: the op must not lower
    with pytest.raises(UnsupportedOpError, match="rounded bin index"):
        run_lowered(lambda a: torch.histc(a, 137), torch.randn(8).bfloat16())
    _assert_same(lambda a: torch.histc(a, 136), _on_edges(60, -1, 1, 136, 0).bfloat16())


_BIN_COUNTS = (1, 3, 7, 16, 33)


def test_histogram_without_range_matches_eagers_linspace_edges():
    xs = []
    for bins in _BIN_COUNTS:
        x = _on_edges(80, -3.7, 1234.5, bins, seed=bins)
        x[0], x[1] = -3.7, 1234.5  # the extrema are the outer edges
        xs.append(x)

    def fn(*args: torch.Tensor) -> list[torch.Tensor]:
        return [t for a, n in zip(args, _BIN_COUNTS, strict=True) for t in torch.histogram(a, n)]

    _assert_same(fn, *xs)


def test_histogram_with_range_and_weight():
    x, w = _on_edges(50, -1.0, 2.0, 6, seed=1), torch.rand(50)
    _assert_same(lambda a, b: torch.histogram(a, 6, range=(-1.0, 2.0), weight=b), x, w)
    fn = lambda a, b: torch.histogram(a, 6, range=(-1.0, 2.0), weight=b, density=True)  # noqa: E731
    _assert_same(fn, x, w, exact=False)


def test_histogram_with_bin_edges_including_unsorted_ones():
    x = _on_edges(40, -2.0, 2.0, 4, seed=2)
    sorted_edges = torch.tensor([-2.0, -0.5, 0.0, 1.0, 2.0])
    # std::upper_bound's exact steps decide where elements go when the edges are not sorted
    unsorted = torch.tensor([-2.0, 1.0, -0.5, 0.3, 2.0])
    fn = lambda a, b, c: (*torch.histogram(a, b), *torch.histogram(a, c))  # noqa: E731
    _assert_same(fn, x, sorted_edges, unsorted)


def test_histogramdd_bin_counts_and_bin_tensors():
    x = _on_edges(60, -1.0, 1.0, 6, seed=3).reshape(20, 3)
    w = torch.rand(20)
    _assert_same(lambda a: (lambda h: (h[0], *h[1]))(torch.histogramdd(a, [3, 2, 6])), x)
    _assert_same(
        lambda a, b: torch.histogramdd(a, [2, 3, 4], range=[-1, 1, -1, 0, 0, 1], weight=b).hist,
        x,
        w,
    )
    edges = [torch.tensor([-1.0, 0.0, 1.0]), torch.tensor([-1.0, 1.0]), torch.tensor([0.0, 0.5])]
    _assert_same(lambda a, b, c, d: torch.histogramdd(a, [b, c, d]).hist, x, *edges)
    _assert_same(lambda a: torch.histogramdd(a, [2, 3, 1], density=True).hist, x, exact=False)


def test_histogram_through_torch_compile():
    fn = lambda a: torch.histogram(a, 5)  # noqa: E731
    x = _on_edges(30, 0.0, 1.0, 5, seed=4)
    compiled = torch.compile(fn, backend="neuron", options={"fallback": "error"})
    for a, e in zip(compiled(x), fn(x), strict=True):
        assert torch.equal(a, e)


_SPECIAL = [0.0, -0.0, 1e-45, -3e-42, 1.17549435e-38, float("inf"), -float("inf"), float("nan")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_hash_tensor_float_bits_including_subnormals_and_nan(dtype):
    # 3e-6 is subnormal in float16, 1e-39 in bfloat16 and float32
    x = torch.tensor(_SPECIAL + [3e-6, -1e-39, 2.0**-130]).to(dtype)
    signalling = torch.tensor([0x7F800001], dtype=torch.int32).view(torch.float32).to(dtype)
    x = torch.cat([x, signalling]).reshape(2, 6)
    # reducing a dimension of size 1 checks each element's float64 bits on their own
    _assert_same(lambda a: (aten.hash_tensor(a.reshape(1, 12), [0]), aten.hash_tensor(a)), x)


def _hash_dim1(a: torch.Tensor) -> torch.Tensor:
    return aten.hash_tensor(a, [1])


def _hash_keepdim(a: torch.Tensor) -> torch.Tensor:
    return aten.hash_tensor(a, [0, 2], keepdim=True)


def test_hash_tensor_integers_and_dims():
    dtypes = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
    xs = [torch.randint(-100, 100, (3, 4, 5)).to(dt) for dt in dtypes]

    def fn(*args: torch.Tensor) -> list[torch.Tensor]:
        return [f(a) for a in args for f in (_hash_dim1, _hash_keepdim)]

    _assert_same(fn, *xs)


def test_hash_tensor_bool_and_other_modes():
    _assert_same(lambda a: aten.hash_tensor(a, [-1]), torch.rand(4, 5) > 0.5)
    with pytest.raises(UnsupportedOpError, match="mode 1"):
        run_lowered(lambda a: aten.hash_tensor(a, mode=1), torch.randn(3))


def _gcd_operands(dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    info = torch.iinfo(dtype)
    lo, hi = max(info.min, -(2**31)), min(info.max, 2**31 - 1)
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(lo, hi, (120,), generator=g)
    b = torch.randint(lo, hi, (120,), generator=g)
    a[:40] = torch.randint(-30, 30, (40,), generator=g)
    b[:40] = torch.randint(-30, 30, (40,), generator=g)
    a[40:45], b[43:48] = 0, 0
    a[50], b[50] = lo, 6  # |min| wraps in int32 (as eager's int32 does), not in int64
    return a.clamp(lo, hi).to(dtype), b.clamp(lo, hi).to(dtype)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8])
def test_gcd_lcm_signs_zeros_and_extremes(dtype):
    a, b = _gcd_operands(dtype, seed=5)
    if dtype == torch.int64:  # int64 runs as int32: keep lcm's products within int32
        a, b = a.clamp(-(2**15), 2**15), b.clamp(-(2**15), 2**15)
    _assert_same(lambda x, y: (torch.gcd(x, y), torch.lcm(x, y)), a, b)
