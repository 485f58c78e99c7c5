"""Entry points that used to fall back although the ops behind them are covered: the legacy
convolution ops, ``_index_put_impl``, ``prims.*`` called directly, runtime asserts, ``view.dtype``
and ``repeat_interleave`` with ``output_size``.

Each runs through ``torch.compile(backend="neuron")`` with ``fallback="error"`` (or asserts that
nothing fell back) and is compared with eager: values, dtype and shape; differentiable ones also
compare input gradients. The cases that must stay eager check the reason they give.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

import neuron_compile
from neuron_compile.compiler import DowncastWarning
from neuron_compile.errors import UnsupportedOpError
from tests.helpers import run_lowered
from tests.parity import assert_compiled_gradients_match

aten = torch.ops.aten
prims = torch.ops.prims
F32 = {"rtol": 1e-4, "atol": 1e-5}


def _strict(fn: Callable[..., Any]) -> Callable[..., Any]:
    torch._dynamo.reset()
    return torch.compile(fn, backend="neuron", options={"fallback": "error"}, fullgraph=True)


def _assert_same(actual: torch.Tensor, expected: torch.Tensor, **tol: Any) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, **tol)


# ---- 1. legacy convolution entry points ----------------------------------------------------
def test_convolution_legacy_overloads_match_eager_with_gradients():
    x, w, b = torch.randn(2, 3, 9), torch.randn(4, 3, 3), torch.randn(4)

    def fn(x, w, b):
        new = aten._convolution(x, w, b, [2], [1], [1], False, [0], 1, False, False, True, True)
        old = aten._convolution.deprecated(x, w, b, [1], [2], [2], False, [0], 1, True, True, True)
        return new.sum() + old.square().sum()

    assert_compiled_gradients_match(fn, [x, w, b], **F32)


def test_transposed_grouped_convolution_through_legacy_entry_point():
    x, w = torch.randn(1, 4, 5, 5), torch.randn(4, 3, 3, 3)

    def fn(x, w):
        return aten._convolution(x, w, None, [2, 2], [1, 1], [1, 1], True, [1, 1], 2, *[False] * 4)

    assert_compiled_gradients_match(fn, [x, w], **F32)


def test_conv_tbc_is_a_time_batch_channel_conv1d_with_gradients():
    x, w, b = torch.randn(7, 2, 3), torch.randn(3, 3, 5), torch.randn(5)
    assert_compiled_gradients_match(lambda x, w, b: aten.conv_tbc(x, w, b, 2), [x, w, b], **F32)


def test_conv_tbc_without_padding_matches_eager():
    x, w, b = torch.randn(7, 2, 3), torch.randn(3, 3, 5), torch.randn(5)
    fn = lambda x, w, b: aten.conv_tbc(x, w, b)  # noqa: E731
    _assert_same(_strict(fn)(x, w, b), fn(x, w, b), **F32)


def test_conv_tbc_backward_called_directly_matches_eager():
    x, w, b, g = torch.randn(7, 2, 3), torch.randn(3, 3, 5), torch.randn(5), torch.randn(9, 2, 5)
    fn = lambda g, x, w, b: aten.conv_tbc_backward(g, x, w, b, 2)  # noqa: E731
    for got, want in zip(_strict(fn)(g, x, w, b), fn(g, x, w, b), strict=True):
        _assert_same(got, want, **F32)


# ---- 2. _index_put_impl and mixed index kinds ----------------------------------------------
@pytest.mark.parametrize("accumulate, unsafe", [(True, False), (False, True), (False, False)])
def test_index_put_impl_matches_eager(accumulate, unsafe):
    a, v = torch.randn(5, 3), torch.randn(3, 3)
    # Distinct positions without accumulate: duplicates would pick an unspecified writer.
    i = torch.tensor([0, 2, 0]) if accumulate else torch.tensor([4, 2, 0])
    fn = lambda a, i, v: aten._index_put_impl(a, [i], v, accumulate, unsafe)  # noqa: E731
    _assert_same(_strict(fn)(a, i, v), fn(a, i, v))


def test_inplace_index_put_impl_with_a_mask_and_gradients():
    # The gradient of the *values* of a masked put is grad[mask], a data-dependent gather that
    # PyTorch cannot trace (nonzero): only ``a`` is differentiated here.
    a, v = torch.randn(4, 3), torch.randn(5)
    m = torch.tensor([[True, False, True], [False, False, False], [True] * 3, [False] * 3])

    def fn(a):
        out = a * 2
        aten._index_put_impl_(out, [m], v * 3, True, False)
        return out

    assert_compiled_gradients_match(fn, [a], **F32)


def test_mixed_int_and_bool_index_falls_back_with_its_reason():
    a, i, v = torch.randn(5, 3), torch.tensor([0, 2]), torch.randn(2)
    m = torch.tensor([True, False, True])
    fn = lambda a, i, m, v: aten.index_put(a, [i, m], v)  # noqa: E731
    with pytest.raises(UnsupportedOpError, match="boolean mask combined with other index"):
        run_lowered(fn, a, i, m, v)
    # The default (CPU fallback) runs it eagerly and gives eager's answer.
    torch._dynamo.reset()
    neuron_compile.clear_fallback_ops()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = torch.compile(fn, backend="neuron")(a, i, m, v)
    _assert_same(out, fn(a, i, m, v))
    assert "aten.index_put.default" in str(neuron_compile.get_fallback_ops())


# ---- 3. prims called directly --------------------------------------------------------------
PRIM_CASES: dict[str, tuple[Callable[..., Any], tuple[torch.Tensor, ...]]] = {
    "collapse": (lambda y: prims.collapse(y, 1, 2), (torch.randn(2, 3, 4),)),
    "convert_element_type": (
        lambda y: prims.convert_element_type(y * 100, torch.int8),
        (torch.randn(2, 3),),
    ),
    "sum": (lambda y: prims.sum(y, [0, 2]), (torch.randn(2, 3, 4),)),
    "prod": (lambda y: prims.prod(y, [0, 1]), (torch.rand(2, 3) + 0.5,)),
    "amax": (lambda y: prims.amax(y, [1]), (torch.randn(2, 3, 4),)),
    "var": (lambda y: prims.var(y, [1], 0.0), (torch.randn(3, 5),)),
    "where": (lambda c, y: prims.where(c, y, y * 2), (torch.randn(3, 4) > 0, torch.randn(3, 4))),
    "div_int_truncates": (
        lambda a, b: prims.div(a, b),
        (torch.tensor([-7, 7, 5], dtype=torch.int32), torch.tensor([2, -2, 3], dtype=torch.int32)),
    ),
    "maximum_nan": (
        lambda a, b: prims.maximum(a, b),
        (torch.tensor([1.0, float("nan"), 3.0]), torch.tensor([2.0, 0.0, float("nan")])),
    ),
    "cat": (lambda a, b: prims.cat([a, b], 1), (torch.randn(2, 3), torch.randn(2, 1))),
    "reshape_rev": (lambda a: prims.rev(prims.reshape(a, [3, 2]), [0]), (torch.randn(2, 3),)),
    "unary_bf16": (
        lambda a: prims.exp(prims.tanh(a)) + prims.rsqrt(prims.abs(a)),
        (torch.randn(8).bfloat16(),),
    ),
}


@pytest.mark.parametrize("name", sorted(PRIM_CASES))
def test_prims_lower_like_their_eager_kernels(name):
    fn, args = PRIM_CASES[name]
    expected = fn(*args)
    tol = {"rtol": 1.6e-2, "atol": 1e-5} if expected.dtype == torch.bfloat16 else {}
    _assert_same(run_lowered(fn, *args)[0], expected, equal_nan=True, **tol)


def test_prims_through_torch_compile_iota_and_convert():
    def fn(y):
        idx = prims.iota(
            6, start=2, step=3, dtype=torch.int64, device=y.device, requires_grad=False
        )
        return prims.convert_element_type(y, torch.bfloat16), idx * y.sum().long()

    y = torch.randn(2, 3)
    for got, want in zip(_strict(fn)(y), fn(y), strict=True):
        _assert_same(got, want)


@pytest.mark.parametrize(
    "fn, x, returns",
    [
        # meta: the input dtype; kernel: bool.
        (lambda a: prims.signbit(a), torch.randn(3), "torch.bool[3]"),
        # meta: int32 kept; kernel (torch.sum): int64.
        (lambda a: prims.sum(a, [0]), torch.ones(3, 2, dtype=torch.int32), "torch.int64[2]"),
        # meta: nothing reduced; kernel (torch.sum with dims []): every dim.
        (lambda a: prims.sum(a, []), torch.randn(2, 3), "torch.float32[]"),
    ],
)
def test_prim_whose_meta_disagrees_with_its_kernel_is_rejected(fn, x, returns):
    # No compiled answer could have both eager's values and the graph's types.
    with pytest.raises(UnsupportedOpError, match=re.escape(f"its reference returns {returns}")):
        run_lowered(fn, x)


# ---- 4. runtime asserts ----------------------------------------------------------------------
def test_scalar_asserts_that_hold_compile_to_nothing():
    def fn(y):
        aten._assert_scalar(True, "never")
        aten.sym_constrain_range(3, min=0, max=5)
        aten.sym_constrain_range_for_size(4, max=8)
        return y + 1

    y = torch.randn(3)
    _assert_same(_strict(fn)(y), fn(y))


def _graph_with(op: Any, *args: Any, **kwargs: Any) -> torch.fx.GraphModule:
    """``x -> op(*args); x + 1`` (and the token op returns), as an ATen graph (Dynamo would run a false check itself while
    tracing, so a statically false one only reaches the backend in a graph built like this)."""
    g = torch.fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(3)
    check = g.call_function(op, args, kwargs)
    check.meta["val"] = torch.empty(0) if "dep_token" in str(op._schema) else None
    y = g.call_function(aten.add.Tensor, (x, 1))
    y.meta["val"] = torch.empty(3)
    # A functional check's token is an output too, so dead-code elimination keeps the check.
    g.output((y, check) if isinstance(check.meta["val"], torch.Tensor) else (y,))
    return torch.fx.GraphModule(torch.nn.Module(), g)


@pytest.mark.parametrize(
    "op, args, kwargs, message",
    [
        (aten._assert_scalar.default, (False, "x must be positive"), {}, "x must be positive"),
        (aten.sym_constrain_range.default, (7,), {"min": 0, "max": 5}, "Invalid value range"),
        (aten.sym_constrain_range_for_size.default, (-1,), {}, "Invalid value range"),
    ],
)
def test_statically_false_scalar_assert_is_a_coded_error(op, args, kwargs, message):
    from neuron_compile.compiler import compile_graph
    from neuron_compile.config import NeuronConfig

    gm = _graph_with(op, *args, **kwargs)
    with pytest.raises(UnsupportedOpError, match=message) as info:
        compile_graph(
            gm, [torch.randn(3)], name="t", kind="inference", cfg=NeuronConfig(fallback="error")
        )
    assert info.value.code == "NC101" and "false for the static shapes" in info.value.reason


def test_functional_checks_compile_when_they_hold_and_name_eager_message_when_not():
    from neuron_compile.compiler import compile_graph
    from neuron_compile.config import NeuronConfig
    from neuron_compile.partition import why_unsupported

    token = torch.empty(0)
    holds = _graph_with(aten._functional_sym_constrain_range.default, 3, 0, 5, token)
    fails = _graph_with(aten._functional_sym_constrain_range.default, 9, 0, 5, token)
    scalar = _graph_with(aten._functional_assert_scalar.default, False, "boom", token)
    node = lambda gm: next(n for n in gm.graph.nodes if "_functional" in str(n.target))  # noqa: E731
    assert why_unsupported(node(holds)) is None
    assert "Invalid value range for 9 between [0, 5]" in why_unsupported(node(fails))
    assert why_unsupported(node(scalar)).endswith("false for the static shapes: boom")
    x = torch.randn(3)
    cfg = NeuronConfig(fallback="error")
    out, new_token = compile_graph(holds, [x], name="t", kind="inference", cfg=cfg)([x])
    _assert_same(out, x + 1)
    _assert_same(new_token, token)


def test_tensor_assert_stays_checked_on_the_cpu():
    fn = lambda y: (aten._assert_async.msg(y.sum() > 0, "sum must be positive"), y * 2)[1]  # noqa: E731
    with pytest.raises(UnsupportedOpError, match="runtime assert on a tensor value"):
        run_lowered(fn, torch.ones(3))
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = torch.compile(fn, backend="neuron")
        _assert_same(compiled(torch.ones(3)), torch.full((3,), 2.0))
        with pytest.raises(RuntimeError, match="sum must be positive"):
            compiled(-torch.ones(3))


# ---- 5. view.dtype -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "src, dst",
    [
        (torch.float32, torch.int32),
        (torch.int32, torch.float32),
        (torch.float32, torch.bfloat16),
        (torch.float32, torch.uint8),
        (torch.int16, torch.float32),
        (torch.uint8, torch.int32),
        (torch.bfloat16, torch.int16),
        (torch.bool, torch.uint8),
    ],
)
def test_view_dtype_is_a_bitcast_like_eager(src, dst):
    x = (torch.randn(2, 8) * 1000).to(src) if src != torch.bool else torch.randn(2, 8) > 0
    # No arithmetic after the view: float ops may quiet NaNs or flush denormals the bits make.
    fn = lambda x: x.view(dst).clone()  # noqa: E731
    got, want = run_lowered(fn, x)[0], fn(x)
    assert got.dtype == want.dtype and got.shape == want.shape
    # Bit patterns: compare as bytes (a float view may hold NaNs, which are never equal).
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


def test_view_dtype_through_torch_compile():
    x = torch.randn(3, 4)
    fn = lambda x: (x.view(torch.int32) & 0x7FFFFFFF).view(torch.float32)  # noqa: E731
    _assert_same(_strict(fn)(x), x.abs())


@pytest.mark.parametrize("src, dst", [(torch.float64, torch.int64), (torch.float32, torch.int64)])
def test_view_dtype_with_64_bit_types_falls_back(src, dst):
    with pytest.raises(UnsupportedOpError, match="64-bit policy"):
        run_lowered(lambda x: x.view(dst), torch.randn(2, 4).to(src))


def test_view_dtype_to_bool_falls_back():
    with pytest.raises(UnsupportedOpError, match="not valid bools"):
        run_lowered(lambda x: x.view(torch.bool), torch.zeros(3, dtype=torch.uint8))


# ---- 6. repeat_interleave with output_size ---------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_repeat_interleave_with_output_size(dtype):
    r = torch.tensor([1, 0, 3, 2, 0], dtype=dtype)
    fn = lambda r: aten.repeat_interleave.Tensor(r, output_size=6)  # noqa: E731
    if dtype == torch.int64:  # counts, not indices: the 64-bit policy says they run as int32
        with pytest.warns(DowncastWarning, match=r"r \(int64 -> int32\)"):
            _assert_same(_strict(fn)(r), fn(r))
    else:
        _assert_same(_strict(fn)(r), fn(r))


def test_repeat_interleave_of_values_with_output_size_and_gradients():
    r = torch.tensor([2, 0, 1, 3])
    fn = lambda x: x.repeat_interleave(r, dim=0, output_size=6) * 2  # noqa: E731
    with pytest.warns(DowncastWarning, match=r"r \(int64 -> int32\)"):
        assert_compiled_gradients_match(fn, [torch.randn(4, 3)], **F32)


def test_repeat_interleave_without_output_size_is_data_dependent():
    from neuron_compile.lowering import registry

    gm = torch.fx.symbolic_trace(lambda r: aten.repeat_interleave.Tensor(r))
    node = next(n for n in gm.graph.nodes if n.op == "call_function")
    assert "data-dependent" in registry.lookup(node)
