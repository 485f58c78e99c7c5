"""Integer matmul/conv/pooling and the quantization ops compiled with ``backend="neuron"`` vs
eager: bit-exact values, dtypes and masks, no fallback (``fallback="error"``). Integer products
wrap around like eager's; integer average pooling truncates; quantization rounds half to even and
follows eager's NaN/inf handling; fake_quantize's straight-through gradient matches. On trn
targets an integer dot/convolution is still rejected by legality (NCC_EVRF035)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import pytest
import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers quantized_decomposed)
import torch.nn.functional as F

from neuron_compile import errors
from neuron_compile.compiler import DowncastWarning
from neuron_compile.fallback import FallbackWarning
from tests.test_backend import _root_cause

aten = torch.ops.aten
qd = torch.ops.quantized_decomposed
SMALL_INTS = [torch.int8, torch.uint8, torch.int32]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _full_range(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    """Values over the whole range of ``dtype``: products and sums wrap around."""
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, shape, dtype=torch.int64).to(dtype)


def _small(*shape: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    return torch.randint(0 if dtype == torch.uint8 else -9, 10, shape, dtype=dtype)


def _same(actual: Any, expected: Any, rtol: float = 0.0) -> None:
    """Equal values (NaN equal to NaN), dtypes and shapes, for tensors or tuples of them."""
    if isinstance(expected, (tuple, list)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected, strict=True):
            _same(a, e, rtol)
        return
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=0, equal_nan=True)


def _all(
    table: dict[str, tuple[Callable[..., Any], list[tuple[int, ...]]]], make: Callable[..., Any]
):
    """One function computing every entry of ``table`` (one compile for many ops) and its
    inputs, made by ``make(*shape)``."""
    inputs = [[make(*shape) for shape in shapes] for _, shapes in table.values()]

    def fn(*flat: torch.Tensor) -> tuple[Any, ...]:
        it = iter(flat)
        return tuple(op(*(next(it) for _ in shapes)) for op, shapes in table.values())

    return fn, [t for group in inputs for t in group]


def _check(fn: Callable[..., Any], *args: Any, rtol: float = 0.0) -> None:
    torch._dynamo.reset()
    wide = any(isinstance(a, torch.Tensor) and a.dtype == torch.int64 for a in args)
    # int64 operands run as int32 (the 64-bit policy these tests measure): said once per model
    expect = pytest.warns(DowncastWarning, match="int64 -> int32") if wide else nullcontext()
    with expect:
        out = torch.compile(fn, backend="neuron", options={"fallback": "error"})(*args)
    _same(out, fn(*args), rtol)


# ---- integer matmul ---------------------------------------------------------------------------
MATMULS = {
    "mm": (torch.mm, [(5, 7), (7, 3)]),
    "bmm": (torch.bmm, [(2, 5, 7), (2, 7, 3)]),
    "addmm": (lambda b, x, y: torch.addmm(b, x, y, beta=3, alpha=-2), [(5, 3), (5, 7), (7, 3)]),
    "addmm-beta0": (lambda b, x, y: torch.addmm(b, x, y, beta=0), [(5, 3), (5, 7), (7, 3)]),
    "baddbmm": (
        lambda b, x, y: torch.baddbmm(b, x, y, alpha=3),
        [(2, 5, 3), (2, 5, 7), (2, 7, 3)],
    ),
    "addmv": (lambda b, m, v: torch.addmv(b, m, v, beta=2), [(5,), (5, 7), (7,)]),
    "addbmm": (lambda b, x, y: torch.addbmm(b, x, y, alpha=2), [(5, 3), (2, 5, 7), (2, 7, 3)]),
    "dot": (torch.dot, [(9,), (9,)]),
    "matmul": (torch.matmul, [(2, 3, 5, 7), (7, 4)]),
    "bilinear": (F.bilinear, [(2, 3), (2, 4), (5, 3, 4), (5,)]),
}


def test_integer_matmul_wraps_like_eager():
    # every small integer dtype over its full range (uint8 with alpha=-2: eager casts the scalar
    # to 254), and int64 (run as int32) with small values; one graph
    fns, inputs = [], []
    for make in [*(functools.partial(_full_range, dtype=d) for d in SMALL_INTS), _small]:
        fn, args = _all(MATMULS, make)
        fns.append((fn, len(args)))
        inputs += args

    def every(*flat):
        it = iter(flat)
        return [fn(*(next(it) for _ in range(n))) for fn, n in fns]

    _check(every, *inputs)


def test_aten_int_mm_int8_into_int32():
    a, b = _full_range(32, 64, dtype=torch.int8), _full_range(64, 16, dtype=torch.int8)
    _check(torch._int_mm, a, b)


# ---- integer convolution and pooling ---------------------------------------------------------
CONVS = {
    "conv1d": (lambda x, w: F.conv1d(x, w, stride=2, padding=1), [(2, 4, 9), (3, 4, 3)]),
    "conv2d-grouped-bias": (
        lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1, groups=2),
        [(2, 4, 7, 7), (6, 2, 3, 3), (6,)],
    ),
    "conv2d-dilated-unbatched": (
        lambda x, w: F.conv2d(x, w, dilation=2, padding=2),
        [(2, 6, 6), (3, 2, 3, 3)],
    ),
    "conv3d": (lambda x, w: F.conv3d(x, w, padding=1), [(1, 2, 4, 4, 4), (3, 2, 3, 3, 3)]),
    "conv_transpose2d": (
        lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1),
        [(2, 4, 5, 5), (4, 3, 3, 3), (3,)],
    ),
    "conv_transpose1d-grouped": (
        lambda x, w: F.conv_transpose1d(x, w, stride=3, groups=2),
        [(1, 4, 6), (4, 2, 4)],
    ),
}


def test_integer_convolution():
    fn, inputs = _all(CONVS, _small)
    # int32 over its full range: the products and sums wrap like eager's
    x, w = _full_range(1, 3, 6, 6, dtype=torch.int32), _full_range(2, 3, 3, 3, dtype=torch.int32)
    _check(lambda x, w, *a: (F.conv2d(x, w, padding=1), fn(*a)), x, w, *inputs)


POOLS = {
    "max2d": lambda x: F.max_pool2d(x, 3, 2, 1, ceil_mode=True, return_indices=True),
    "max2d-dilated-indices": lambda x: F.max_pool2d(x, 2, 1, 0, 2, return_indices=True),
    "max3d": lambda x: F.max_pool3d(x.unsqueeze(2).expand(-1, -1, 3, -1, -1), 2, 1, 1),
}


def test_integer_pooling():
    # negative sums: eager's integer average truncates toward zero, not floor
    x = torch.randint(-50, 50, (2, 3, 7, 8))
    x[0, 0, :3, :3] = 7  # ties for max pooling's first-index rule
    pools = POOLS
    narrow = [_full_range(1, 2, 6, 6, dtype=d) for d in (torch.int32, torch.int8, torch.uint8)]

    def fn(x, *narrow):
        outs = [f(x) for f in pools.values()]
        return outs + [F.max_pool2d(n, 2, return_indices=True) for n in narrow]

    _check(fn, x, *narrow)


def test_integer_average_pooling_runs_on_the_cpu():
    # eager sums int64 windows in int64: 9 values of 10**9 would wrap in int64-as-int32
    def fn(x):
        return F.avg_pool2d(x, 3) + 1

    x = torch.full((1, 1, 3, 3), 10**9, dtype=torch.int64)
    torch._dynamo.reset()
    with pytest.warns(FallbackWarning, match="avg_pool2d"):
        assert torch.equal(torch.compile(fn, backend="neuron")(x), fn(x))
    torch._dynamo.reset()
    with pytest.raises(Exception, match="NC101"):
        torch.compile(fn, backend="neuron", options={"fallback": "error"})(x)


# ---- trn targets still reject an integer dot --------------------------------------------------
def test_trn_target_rejects_integer_dot_cpu_computes_it(monkeypatch):
    def fn(a, b, x, w):
        return torch.mm(a, b), F.conv2d(x, w)

    from neuron_compile.trainium import neff

    inputs = (_small(4, 4), _small(4, 4), _small(1, 2, 5, 5), _small(3, 2, 3, 3))

    monkeypatch.setenv("NEURON_COMPILE_NEURONX_CC", "/nonexistent/neuronx-cc")
    neff._said.clear()
    with pytest.raises(Exception) as info:
        torch.compile(fn, backend="neuron", options={"target": "trn2"})(*inputs)
    err = _root_cause(info.value)
    assert isinstance(err, errors.IntegerDatapathViolation), repr(info.value)
    assert err.code == "NC504" and err.ncc_code == "NCC_EVRF035"
    found = " ".join(err.violations)  # the convolution is listed too
    assert "%mm is an integer matmul" in found and "%convolution is an integer" in found
    _check(fn, *inputs)  # the default cpu target runs it, exactly


# ---- quantize / dequantize --------------------------------------------------------------------
def _qinput(*shape: int) -> torch.Tensor:
    """Random values plus exact rounding ties (k + 0.5 steps of 0.25) and NaN/inf/huge values."""
    x = torch.randn(*shape) * 4
    flat = x.view(-1)
    flat[:8] = torch.tensor([0.125, -0.125, 0.375, -0.375, 31.875, 1e30, -1e30, 0.0])
    return x


SPECIALS = torch.tensor([float("nan"), float("inf"), -float("inf"), 3e9, -3e9])
QRANGES = [(torch.int8, -128, 127), (torch.uint8, 0, 255), (torch.int16, -3000, 3000)]


def _quantize_per_tensor_all(qdtype: torch.dtype, lo: int, hi: int) -> tuple[Callable, list]:
    zp = 3 if lo < 0 else 100
    s, z = torch.tensor(0.25), torch.tensor(zp)

    def fn(x, s, z, a, b):
        q = qd.quantize_per_tensor(x, 0.3, zp, lo, hi, qdtype)
        return (
            q,
            qd.quantize_per_tensor(x.bfloat16(), 0.1, zp, lo, hi, qdtype),
            qd.quantize_per_tensor.tensor(x, s, z, lo, hi, qdtype),
            qd.quantize_per_tensor.tensor2(x, s, z, a, b, qdtype),
            qd.dequantize_per_tensor(q, 0.3, zp, lo, hi, qdtype),
            qd.dequantize_per_tensor(q, 0.3, zp, lo, hi, qdtype, out_dtype=torch.bfloat16),
            qd.dequantize_per_tensor.tensor(q, s, z, lo, hi, qdtype),
        )

    return fn, [s, z, torch.tensor(lo), torch.tensor(hi)]


def test_quantize_dequantize_per_tensor():
    x = torch.cat([_qinput(6, 16), SPECIALS.expand(6, -1)], 1)  # NaN/inf: eager's casts
    parts = [_quantize_per_tensor_all(*r) for r in QRANGES]
    flat = [t for _, params in parts for t in params]
    _check(
        lambda x, *p: [fn(x, *p[4 * i : 4 * i + 4]) for i, (fn, _) in enumerate(parts)], x, *flat
    )


def test_quantize_dequantize_per_channel():
    x = _qinput(4, 5, 6)

    def fn(x, *params):
        outs = []
        for axis, s, z in zip((0, 1, -1), params[::2], params[1::2], strict=True):
            q = qd.quantize_per_channel(x, s, z, axis, -128, 127, torch.int8)
            outs += [
                q,
                qd.dequantize_per_channel(q, s, z, axis, -128, 127, torch.int8),
                qd.dequantize_per_channel(q, s, None, axis, -128, 127, torch.int8),
            ]
        return outs

    params = []
    for n in (4, 5, 6):
        params += [torch.rand(n) + 0.05, torch.randint(-4, 4, (n,))]
    _check(fn, x, *params)


# ---- fake quantize ----------------------------------------------------------------------------
def _fq_input(dtype: torch.dtype) -> torch.Tensor:
    x = torch.cat([_qinput(63), SPECIALS, torch.tensor([5.0e7, -5.0e7])])
    return x.reshape(5, 14).to(dtype)


def test_fake_quantize_per_tensor():
    def fn(x, s, z, on, off):
        qparams = aten._fake_quantize_per_tensor_affine_cachemask_tensor_qparams
        return (
            aten.fake_quantize_per_tensor_affine_cachemask(x, 0.25, 3, -128, 127),
            torch.fake_quantize_per_tensor_affine(x, 0.1, 100, 0, 255),
            torch.fake_quantize_per_tensor_affine(x, s, z, 0, 255),
            qparams(x, s.reshape(1), z.reshape(1).int(), on, 0, 255),
            qparams(x, s.reshape(1), z.reshape(1).int(), off, 0, 255),  # passes x through
        )

    args = (torch.tensor(0.1), torch.tensor(7), torch.tensor([1]), torch.tensor([0]))
    x = _fq_input(torch.float32)
    _check(lambda x, *a: (fn(x, *a), fn(x.bfloat16(), *a)), x, *args)


def test_fake_quantize_per_channel():
    def fn(x, s0, z0, s1, z1):
        return (
            aten.fake_quantize_per_channel_affine_cachemask(x, s0, z0, 0, -8, 7),
            aten.fake_quantize_per_channel_affine_cachemask(x, s1, z1, 1, -8, 7),
            torch.fake_quantize_per_channel_affine(x, s1, z1 + 4, 1, 0, 255),
        )

    params = []
    for n in (5, 14):
        params += [torch.rand(n) + 0.05, torch.randint(-4, 4, (n,), dtype=torch.int32)]
    x = _fq_input(torch.float32)
    _check(lambda x, *p: (fn(x, *p), fn(x.bfloat16(), *p)), x, *params)


def test_fake_quantize_straight_through_gradient():
    x = _qinput(4, 8)
    s, z = torch.rand(8) + 0.05, torch.randint(-4, 4, (8,), dtype=torch.int32)

    def fn(x):
        a = torch.fake_quantize_per_tensor_affine(x, 0.05, 0, -20, 20)
        b = torch.fake_quantize_per_channel_affine(x, s, z, 1, -8, 7)
        return a * b

    ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    torch._dynamo.reset()
    out = torch.compile(fn, backend="neuron", options={"fallback": "error"})(ours)
    ref = fn(theirs)
    cotangent = torch.randn_like(ref)
    out.backward(cotangent)
    ref.backward(cotangent)
    _same(out, ref)
    _same(ours.grad, theirs.grad)
    assert (theirs.grad == 0).any()  # some inputs were clamped: the mask matters


def test_fake_quantize_backward_op_is_grad_times_mask():
    g, mask = torch.randn(3, 4), torch.rand(3, 4) > 0.5
    _check(aten.fake_quantize_per_tensor_affine_cachemask_backward, g, mask)


@pytest.mark.parametrize(
    "fn, args",
    [
        (  # a float zero point: eager rounds (q - zero_point) * scale from double
            lambda x, s, z: torch.fake_quantize_per_channel_affine(x, s, z, 1, 0, 255),
            lambda: (torch.randn(3, 4), torch.rand(4) + 0.1, torch.rand(4) * 3),
        ),
        (  # int32's quant range is wider than float32's exact integers
            lambda x: torch.fake_quantize_per_tensor_affine(x, 0.1, 0, -(2**31), 2**31 - 1),
            lambda: (torch.randn(3, 4),),
        ),
        (  # eager's float -> int32 cast turns NaN and 2**31 into INT32_MIN
            lambda x: qd.quantize_per_tensor(x, 1.0, 0, -(2**31), 2**31 - 1, torch.int32),
            lambda: (torch.tensor([1e10, float("nan"), 3.0]),),
        ),
    ],
    ids=["float-zero-point", "int32-range", "quantize-to-int32"],
)
def test_inexact_quantization_falls_back(fn, args):
    inputs = args()
    torch._dynamo.reset()
    with pytest.raises(Exception, match="NC101"):
        torch.compile(fn, backend="neuron", options={"fallback": "error"})(*inputs)
    torch._dynamo.reset()
    with pytest.warns(FallbackWarning, match="runs 1 op"):
        _same(torch.compile(fn, backend="neuron")(*inputs), fn(*inputs))
