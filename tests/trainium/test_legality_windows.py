"""trn legality of reduce-window (NCC_EVRF017/018/019 -> NC511) and the trn forms of the ops
whose reference lowering breaks it: max pooling with indices and cummax/cummin.

The trn forms run here on the XLA CPU executor (a trn module without custom calls is what XLA
CPU runs for a trn target), so each is compared bit for bit with eager and with the cpu target,
values and indices, on inputs full of ties, signed zeros, -inf and NaN.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree

from neuron_compile import artifact, errors
from neuron_compile.compiler import DowncastWarning
from neuron_compile.lowering import lower_graph
from neuron_compile.lowering import registry as registry_mod
from neuron_compile.lowering.lower_graph import LoweredGraph
from neuron_compile.targets import get_target
from neuron_compile.trainium import TRN_KEY
from neuron_compile.trainium.legality import find_violations
from tests.helpers import trace_aten

aten = torch.ops.aten
TRN2, TRN3 = get_target("trn2"), get_target("trn3")


def _text(body: str) -> LoweredGraph:
    return LoweredGraph(text=body, inputs=[], outputs=[], num_results=0)


def _codes(gm, lowered, target=TRN2):
    return [(v.error.code, v.ncc_code) for v in find_violations(gm, lowered, target)]


def _window_module(attrs: str, inputs: int = 1, out: int = 4) -> str:
    """A verified module with one add reduce-window over ``inputs`` copies of a 4-vector."""
    operands = ", ".join(["%arg0"] * inputs + ["%init"] * inputs)
    scalars = ", ".join(["tensor<f32>"] * inputs)
    types = ", ".join(["tensor<4xf32>"] * inputs + ["tensor<f32>"] * inputs)
    results = ", ".join([f"tensor<{out}xf32>"] * inputs)
    block = ", ".join([f"%a{i}: tensor<f32>" for i in range(inputs)])
    block += ", " + ", ".join([f"%b{i}: tensor<f32>" for i in range(inputs)])
    sums = "\n".join(
        f"      %s{i} = stablehlo.add %a{i}, %b{i} : tensor<f32>" for i in range(inputs)
    )
    returned = ", ".join(f"%s{i}" for i in range(inputs))
    text = f"""module @neuron_graph {{
  func.func public @main(%arg0: tensor<4xf32>) -> (tensor<{out}xf32>) {{
    %init = stablehlo.constant dense<0.0> : tensor<f32>
    %0:{inputs} = "stablehlo.reduce_window"({operands}) ({{
    ^bb0({block}):
{sums}
      stablehlo.return {returned} : {scalars}
    }}) {{{attrs}}} : ({types}) -> ({results})
    return %0#0 : tensor<{out}xf32>
  }}
}}
"""
    artifact.verify(text)
    return text


@pytest.mark.parametrize(
    "attrs, inputs, out, codes",
    [
        # base dilation 2 spreads 4 elements over 7 places; our lowering never emits it
        ("window_dimensions = array<i64: 1>, base_dilations = array<i64: 2>", 1, 7, ["017"]),
        ("window_dimensions = array<i64: 2>, window_dilations = array<i64: 2>", 1, 2, ["018"]),
        ("window_dimensions = array<i64: 2>", 2, 3, ["019"]),
        (
            "window_dimensions = array<i64: 2>, base_dilations = array<i64: 2>, "
            "window_dilations = array<i64: 3>",
            2,
            4,
            ["017", "018", "019"],
        ),
        # explicit all-ones dilations (as our emitter prints them) are legal
        (
            "window_dimensions = array<i64: 2>, base_dilations = array<i64: 1>, "
            "window_dilations = array<i64: 1>",
            1,
            3,
            [],
        ),
    ],
)
def test_reduce_window_codes_on_hand_written_modules(attrs, inputs, out, codes):
    gm = trace_aten(lambda x: x + 1, torch.ones(4))
    text = _window_module(attrs, inputs, out)
    want = [("NC511", f"NCC_EVRF{c}") for c in codes]
    assert _codes(gm, _text(text)) == want
    assert _codes(gm, _text(artifact.pretty(text))) == want  # the pretty-printed form too
    assert _codes(gm, _text(text), TRN3) == want


def test_reference_forms_violate_and_name_their_node():
    """What the cpu target emits (the reference forms) is what the trn forms replace."""

    def dilated(x):
        return F.max_pool2d(x, 2, dilation=(1, 2), return_indices=True)

    gm = trace_aten(dilated, torch.randn(1, 2, 6, 6))
    found = find_violations(gm, lower_graph(gm), TRN2)
    assert [v.ncc_code for v in found] == ["NCC_EVRF018", "NCC_EVRF019"]
    assert all(v.node is not None and v.node.target is aten.max_pool2d_with_indices.default
               for v in found)  # fmt: skip
    assert "window dilation [1, 1, 1, 2]" in found[0].message
    assert "%max_pool2d_with_indices" in found[1].message

    # cummin's reference is two one-operand scans (XLA CPU cannot compile the variadic one past
    # 256 elements): legal as it is; the trn form is the O(N log N) one.
    gm = trace_aten(lambda x: torch.cummin(x, 0), torch.randn(5))
    assert find_violations(gm, lower_graph(gm), TRN2) == []


def test_single_operand_reduce_windows_stay_as_they_are_and_legal():
    """cumsum and average pooling (and its backward) keep their reduce-window on trn."""

    def f(x):
        return x.cumsum(1), F.avg_pool2d(x, 3, 2, 1, ceil_mode=True), x.logcumsumexp(-1)

    gm = trace_aten(f, torch.randn(2, 3, 7, 7))
    lowered = lower_graph(gm, target=TRN2)
    assert lowered.text.count('"stablehlo.reduce_window"') == 3
    assert _codes(gm, lowered) == []


def test_trn_forms_admit_what_the_reference_admits():
    table = registry_mod._LOWERINGS
    for op in (
        aten.max_pool2d_with_indices.default,
        aten.max_pool3d_with_indices.default,
        aten.cummax.default,
        aten.cummin.default,
    ):
        assert table[(op, TRN_KEY)].supports is table[(op, registry_mod.REFERENCE)].supports


def test_cpu_target_keeps_the_reference_forms():
    def f(x):
        return F.max_pool2d(x, 3, 1, 1, dilation=2, return_indices=True), x.cummax(2)

    gm = trace_aten(f, torch.randn(1, 2, 7, 7))
    cpu, trn = lower_graph(gm).text, lower_graph(gm, target=TRN2).text
    assert cpu.count('"stablehlo.reduce_window"') == 3 and "array<i64: 1, 1, 2, 2>" in cpu
    assert "reduce_window" not in trn and '"stablehlo.reduce"' in trn


# ---- numerics: trn forms against eager and the cpu target, bit for bit -----------------------
def _tricky(shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Small integers (many ties), signed zeros, -inf (also along a whole border) and NaN."""
    g = torch.Generator().manual_seed(seed)
    if not dtype.is_floating_point:
        low = 0 if dtype == torch.uint8 else -3
        return torch.randint(low, low + 7, shape, generator=g, dtype=dtype)
    x = torch.randint(-2, 3, shape, generator=g).float()
    flat = x.view(-1)
    flat[1::5] = torch.where(flat[1::5] == 0, -0.0, flat[1::5])
    flat[3::11] = float("-inf")
    flat[::17] = float("nan")
    x[..., :2] = float("-inf")  # windows over padding and -inf only: the real -inf wins
    return x.to(dtype)


def _bits(t: torch.Tensor) -> torch.Tensor:
    ints = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
    return t.view(ints[t.dtype]) if t.dtype in ints else t


def _assert_bit_equal(actual, expected, *, any_nan: bool = False) -> None:
    """Same dtypes, shapes and bits (signed zeros included); with ``any_nan`` a NaN matches
    any NaN (XLA CPU canonicalises bfloat16 NaNs, on either target)."""
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        assert a.dtype == e.dtype and a.shape == e.shape, (a.dtype, e.dtype, a.shape, e.shape)
        if any_nan and a.dtype.is_floating_point:
            assert torch.equal(a.isnan(), e.isnan()), (a, e)
            a, e = (t.nan_to_num(0.0, posinf=float("inf"), neginf=float("-inf")) for t in (a, e))
        assert torch.equal(_bits(a), _bits(e)), (a, e)


def _run(fn, x: torch.Tensor, target: str | None, grad: bool):
    """Outputs of ``fn(x)`` (compiled for ``target``, eager if None), and with ``grad`` the
    gradient of a weighted sum of its first output."""
    run = fn if target is None else torch.compile(fn, backend="neuron", options={"target": target})
    x = x.clone().requires_grad_(grad)
    outs = pytree.tree_leaves(run(x))
    if not grad:
        return [o.detach() for o in outs], None
    weights = torch.linspace(-1, 1, outs[0].numel()).reshape(outs[0].shape).to(outs[0].dtype)
    (outs[0] * weights).sum().backward()
    return [o.detach() for o in outs], x.grad


def _check_against_eager_and_cpu(fn, x: torch.Tensor, grad: bool) -> None:
    gm = trace_aten(fn, x)
    lowered = lower_graph(gm, target=TRN2)
    assert "reduce_window" not in lowered.text
    assert find_violations(gm, lowered, TRN2) == [] and find_violations(gm, lowered, TRN3) == []
    eager, eager_grad = _run(fn, x, None, grad)
    trn, trn_grad = _run(fn, x, "trn2", grad)
    torch._dynamo.reset()
    cpu, cpu_grad = _run(fn, x, "cpu", grad)
    _assert_bit_equal(trn, cpu)
    _assert_bit_equal(trn, eager, any_nan=x.dtype == torch.bfloat16)
    if grad:
        # The backward is one rule for both targets (a scatter-add at the saved indices). It
        # sums overlapping windows' grads in float32 and rounds once, where eager's bfloat16
        # kernel rounds after every add: exact against eager only in float32.
        _assert_bit_equal([trn_grad], [cpu_grad])
        exact = {"rtol": 0, "atol": 0} if x.dtype == torch.float32 else {}
        torch.testing.assert_close(trn_grad, eager_grad, **exact)


POOLS = {
    "1d_k3_s2_p1_d2_ceil_idx": (
        lambda x: F.max_pool1d(x, 3, 2, 1, 2, ceil_mode=True, return_indices=True),
        (2, 3, 17),
    ),
    "1d_k4": (lambda x: F.max_pool1d(x, 4), (2, 3, 18)),
    "2d_k3_s2_p1_idx": (lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), (2, 3, 9, 8)),
    "2d_rect_dilated_ceil_idx": (
        lambda x: F.max_pool2d(x, (3, 2), (2, 1), (1, 0), (2, 1), True, return_indices=True),
        (2, 2, 11, 7),
    ),
    "2d_k2": (lambda x: F.max_pool2d(x, 2), (1, 3, 8, 8)),
    "2d_k1_s2": (lambda x: F.max_pool2d(x, 1, 2, return_indices=True), (1, 2, 5, 5)),
    "3d_k2_s1_p1_d2_idx": (
        lambda x: F.max_pool3d(x, 2, 1, 1, 2, return_indices=True),
        (1, 2, 5, 6, 5),
    ),
    "3d_rect_s2_ceil": (
        lambda x: F.max_pool3d(x, (3, 2, 2), 2, (1, 0, 1), ceil_mode=True),
        (2, 1, 7, 6, 5),
    ),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", list(POOLS))
def test_max_pool_trn_form_is_legal_and_bit_exact(case, dtype):
    fn, shape = POOLS[case]
    _check_against_eager_and_cpu(fn, _tricky(shape, dtype), grad=True)


@pytest.mark.parametrize("dtype", [torch.int32, torch.uint8], ids=str)
def test_max_pool_trn_form_integers(dtype):
    fn = POOLS["2d_k3_s2_p1_idx"][0]
    _check_against_eager_and_cpu(fn, _tricky((2, 3, 9, 8), dtype), grad=False)


@pytest.mark.parametrize("op", [torch.cummax, torch.cummin], ids=lambda op: op.__name__)
@pytest.mark.parametrize(
    "shape, dim, dtype",
    [
        ((3, 13), 1, torch.float32),  # 13: not a power of two
        ((16, 2), 0, torch.float32),
        ((2, 5, 9), -1, torch.bfloat16),
        ((1, 1), 1, torch.float32),  # one element: no round at all
    ],
    ids=str,
)
def test_cummax_cummin_trn_form_is_legal_and_bit_exact(op, shape, dim, dtype):
    _check_against_eager_and_cpu(lambda x: op(x, dim), _tricky(shape, dtype, seed=3), grad=True)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=str)
def test_cummax_cummin_trn_form_integers(dtype):
    x = _tricky((4, 10), dtype, seed=5)
    fn = lambda x: (x.cummax(1), x.cummin(0))  # noqa: E731
    if dtype == torch.int64:  # values, not indices: the 64-bit policy narrows them, and says so
        with pytest.warns(DowncastWarning, match=r"x \(int64 -> int32\)"):
            _check_against_eager_and_cpu(fn, x, grad=False)
    else:
        _check_against_eager_and_cpu(fn, x, grad=False)


# ---- the error through torch.compile ---------------------------------------------------------
def test_reference_form_on_trn_raises_nc511_naming_node_and_line(no_neuronx_cc, monkeypatch):
    """Without its trn form an op lowers by its reference rule: the coded error, not neuronx-cc."""
    from tests.test_backend import _root_cause

    op, codes = aten.max_pool2d_with_indices.default, ["NCC_EVRF018", "NCC_EVRF019"]
    monkeypatch.delitem(registry_mod._LOWERINGS, (op, TRN_KEY))

    def user_fn(x):
        return F.max_pool2d(x.sin(), 2, dilation=2, return_indices=True)

    with pytest.raises(Exception) as info:
        torch.compile(user_fn, backend="neuron", options={"target": "trn2"})(
            torch.randn(1, 2, 6, 6)
        )
    err = _root_cause(info.value)
    assert isinstance(err, errors.ReduceWindowViolation), repr(info.value)
    assert err.code == "NC511" and err.ncc_code == codes[0] and err.rule == "reduce_window"
    assert [v.split(":")[0] for v in err.violations] == codes
    assert err.node_name == "max_pool2d_with_indices"
    assert "test_legality_windows.py" in err.where
    assert "F.max_pool2d(" in err.source
    assert "NC511" in str(err) and "pre-empts " + codes[0] in str(err)
