"""Regression tests for issue 17's wrong-answer and crash reproductions (one test per bug)."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch

from neuron_compile.compiler import DowncastWarning

aten = torch.ops.aten


def _compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, backend="neuron", dynamic=False, fullgraph=True)


def _narrowed(*inputs):
    """int64 inputs used in arithmetic run as int32 (the 64-bit policy): its warning, expected."""
    if any(t.dtype == torch.int64 for t in inputs):
        return pytest.warns(DowncastWarning, match="int64 -> int32")
    return nullcontext()


def _assert_same(actual, expected):
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    torch.testing.assert_close(actual, expected)


# ---- reproduction 2: a backward op over a grad and an input of different dtypes ---------------
@pytest.mark.parametrize(
    "grad_dtype, x_dtype",
    [(torch.int64, torch.float32), (torch.bfloat16, torch.float32), (torch.float32, torch.int64)],
)
def test_threshold_backward_promotes_grad_and_input_like_eager(grad_dtype, x_dtype):
    # PyTorch's decomposition is where(x <= t, 0, grad): it returned the grad's int64 where
    # eager's TensorIterator kernel promotes both operands (float32).
    def fn(g, x):
        return aten.threshold_backward(g, x, 0.5)

    g = torch.randint(-3, 4, (4, 5)).to(grad_dtype)
    x = torch.randn(4, 5).to(x_dtype) if x_dtype.is_floating_point else torch.arange(20).view(4, 5)
    with _narrowed(g, x):
        got = _compiled(fn)(g, x)
    _assert_same(got, fn(g, x))


def test_threshold_backward_zero_dim_grad_takes_the_input_dtype():
    # A 0-d float32 grad does not widen a bfloat16 input (eager: bfloat16).
    def fn(g, x):
        return aten.threshold_backward(g, x, 0.0)

    g, x = torch.tensor(1.5), torch.randn(4, 5).bfloat16()
    _assert_same(_compiled(fn)(g, x), fn(g, x))


def test_loss_backward_returns_the_input_dtype():
    # mse_loss_backward writes into zeros_like(input): float32 grad, bfloat16 input -> bfloat16.
    def fn(g, x, t):
        return aten.mse_loss_backward(g, x, t, 1), aten.mish_backward(g, x)

    g, x, t = torch.randn(3, 4), torch.randn(3, 4).bfloat16(), torch.randn(3, 4)
    for actual, expected in zip(_compiled(fn)(g, x, t), fn(g, x, t), strict=True):
        _assert_same(actual, expected)


def test_gelu_backward_computes_in_the_promoted_dtype():
    # The decomposition squared a bfloat16 input in bfloat16; eager promotes it to float32 first.
    def fn(g, x):
        return aten.gelu_backward(g, x)

    g, x = torch.randn(64), torch.randn(64).bfloat16()
    reference = fn(g.double(), x.double()).float()
    _assert_same(_compiled(fn)(g, x), reference)


def test_same_dtype_backward_graph_is_unchanged():
    # The promoting wrapper adds no converts when the operands already agree.
    from torch.fx.experimental.proxy_tensor import make_fx

    from neuron_compile.capture import decomposition_table

    g, x = torch.randn(3), torch.randn(3)
    gm = make_fx(lambda g, x: aten.threshold_backward(g, x, 0.5), decomposition_table())(g, x)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert (
        aten._to_copy.default not in targets
        and torch.ops.prims.convert_element_type.default not in targets
    )


# ---- reproduction 3: zero-size results (NC102 "a neuron-compile bug") ------------------------
def test_trilinear_with_a_dim_every_input_expands():
    # Eager's _trilinear gives a dimension all three inputs expand size 0 (not 1).
    def fn(a):
        return aten._trilinear(a, a, a, [0], [0], [0], [2], 0)

    a = torch.rand(2, 3, 6)
    _assert_same(_compiled(fn)(a), fn(a))


def test_unfold_of_a_zero_dim_tensor_with_size_zero():
    def fn(t):
        return t.unfold(0, 0, 1)

    t = torch.rand(())
    _assert_same(_compiled(fn)(t), fn(t))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_empty_results_lower_to_an_empty_constant(dtype):
    def fn(x):
        return x[:, 2:2] * 2, x.unfold(1, 0, 1), x.sum(1)[:0]

    x = torch.ones(3, 4, dtype=dtype)
    with _narrowed(x):
        got = _compiled(fn)(x)
    for actual, expected in zip(got, fn(x), strict=True):
        _assert_same(actual, expected)


# ---- found by the mixed-dtype samples (tests/conformance/promotion.py) -----------------------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("mode", ["trunc", "floor"])
def test_div_with_rounding_by_a_scalar_divisor(dtype, mode):
    # A broadcast scalar divisor: eager's kernel divides in float32 by the divisor's float32
    # value without rounding the quotient first (bf16 x / 0.1 truncated was off by one); and
    # XLA's x / c -> x * (1 / c) rewrite moved f32 quotients across integers (x / -0.3).
    def fn(x, t):
        return (
            torch.div(x, 0.1, rounding_mode=mode),
            torch.div(x, -0.3, rounding_mode=mode),
            torch.div(x, t, rounding_mode=mode),
        )

    g = torch.Generator().manual_seed(0)
    x = (torch.randn(4096, generator=g) * 100).to(dtype)
    t = torch.tensor(-0.3)
    for actual, expected in zip(_compiled(fn)(x, t), fn(x, t), strict=True):
        assert actual.dtype == expected.dtype
        assert torch.equal(actual, expected)


def test_put_backward_takes_the_grad_at_a_zero_dim_index():
    # PyTorch's `take` decomposition indexes with Python's [] and turned the 0-d index into
    # .item(): tracing put's backward failed with GuardOnDataDependentSymNode.
    def fn(x, i, v):
        return torch.put(x, i, v, accumulate=True) * 2.0

    x, v = torch.randn((), requires_grad=True), torch.randn((), requires_grad=True)
    x2, v2 = (t.detach().clone().requires_grad_() for t in (x, v))
    i = torch.tensor(0)
    with _narrowed(i):  # put's backward does arithmetic on the index
        out = torch.compile(fn, backend="neuron", fullgraph=True, options={"fallback": "error"})(
            x, i, v
        )
    expected = fn(x2, i, v2)
    _assert_same(out, expected)
    grads = torch.autograd.grad(out, (x, v))
    for g, e in zip(grads, torch.autograd.grad(expected, (x2, v2)), strict=True):
        _assert_same(g, e)
