"""trn legality of convolution forms (NC510: NCC_EVRF010 input with kernel dilation, NCC_EVRF011
a window stride with input dilation) and the trn forms that keep every torch convolution legal.

The rule is checked on hand-written modules and on the reference forms (which break EVRF010 for
grad_input and transposed convolutions with stride and dilation > 1); the trn forms are checked
legal for every convolution form, byte-identical to the reference where it was legal, bit-exact
against the cpu target and close to eager, through the lowering and through torch.compile.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx
from torch.testing import FileCheck

import neuron_compile
import neuron_compile.trainium.legality as legality_mod
from neuron_compile import artifact, errors, targets
from neuron_compile.lowering import lower_graph
from neuron_compile.lowering.lower_graph import LoweredGraph
from neuron_compile.lowering.stablehlo.conv import conv_transpose_lhs
from neuron_compile.runtime.xla_cpu import XlaCpuExecutable
from neuron_compile.targets import get_target
from neuron_compile.trainium import lowering_conv
from neuron_compile.trainium.legality import find_violations
from neuron_compile.trainium.legality_base import hlo_ops
from tests.test_backend import _root_cause

TRN2, TRN3 = get_target("trn2"), get_target("trn3")
aten = torch.ops.aten
EVRF010 = ("NC510", "NCC_EVRF010")
EVRF011 = ("NC510", "NCC_EVRF011")


def _codes(gm, lowered, target=TRN2):
    return [(v.error.code, v.ncc_code) for v in find_violations(gm, lowered, target)]


def _text(body: str) -> LoweredGraph:
    return LoweredGraph(text=body, inputs=[], outputs=[], num_results=0)


# ---- the rule on hand-written modules --------------------------------------------------------


def _conv_module(lhs_dilation, rhs_dilation, strides) -> str:
    """A verified module of one 2-D convolution of a 1x1x4x4 input with a 1x1x3x3 kernel,
    padded by 2, with the given per-dim input dilation, kernel dilation and window strides."""
    out = [
        ((4 - 1) * ld + 1 + 4 - ((3 - 1) * rd + 1)) // s + 1
        for ld, rd, s in zip(lhs_dilation, rhs_dilation, strides, strict=True)
    ]

    def ints(values):
        return ", ".join(str(v) for v in values)

    result = f"tensor<1x1x{out[0]}x{out[1]}xf32>"
    text = f"""module @neuron_graph {{
  func.func public @main(%arg0: tensor<1x1x4x4xf32>, %arg1: tensor<1x1x3x3xf32>) -> {result} {{
    %0 = "stablehlo.convolution"(%arg0, %arg1) {{dimension_numbers = #stablehlo.conv<[b, f, 0, \
1]x[o, i, 0, 1]->[b, f, 0, 1]>, window_strides = array<i64: {ints(strides)}>, padding = dense<2> \
: tensor<2x2xi64>, lhs_dilation = array<i64: {ints(lhs_dilation)}>, rhs_dilation = array<i64: \
{ints(rhs_dilation)}>, feature_group_count = 1 : i64, batch_group_count = 1 : i64}} : \
(tensor<1x1x4x4xf32>, tensor<1x1x3x3xf32>) -> {result}
    return %0 : {result}
  }}
}}
"""
    artifact.verify(text)
    return text


@pytest.mark.parametrize(
    "lhs, rhs, strides, codes",
    [
        ((2, 2), (2, 2), (1, 1), [EVRF010]),
        ((2, 2), (1, 1), (2, 2), [EVRF011]),
        ((2, 2), (2, 2), (2, 2), [EVRF010, EVRF011]),
        ((2, 1), (1, 2), (1, 1), [EVRF010]),  # rejected per convolution, not per dim
        ((1, 2), (1, 1), (2, 1), [EVRF011]),
        ((1, 1), (2, 2), (2, 2), []),  # grad_weight's form: stride and kernel dilation
        ((2, 2), (1, 1), (1, 1), []),  # a transposed convolution without dilation
        ((1, 1), (1, 1), (1, 1), []),
    ],
)
def test_hand_written_convolution_evrf010_evrf011(lhs, rhs, strides, codes):
    gm = make_fx(lambda x: x + 1, tracing_mode="fake")(torch.ones(4))
    text = _conv_module(lhs, rhs, strides)
    assert _codes(gm, _text(text)) == codes
    assert _codes(gm, _text(artifact.pretty(text))) == codes  # the `window = {...}` form too
    assert _codes(gm, _text(text), TRN3) == codes
    found = find_violations(gm, _text(text), TRN2)
    assert all(v.node is None and "lhs_dilation [" in v.message for v in found)


# ---- the reference forms vs the trn forms: minimal FX graphs ---------------------------------


def _conv_backward_graph(stride: int, dilation: int):
    """grad_input and grad_weight of a 2-D convolution: the reference dilates grad_output by
    the stride (lhs_dilation) under the forward dilation (rhs_dilation)."""
    x, w = torch.randn(2, 4, 9, 9), torch.randn(4, 4, 3, 3)
    params = ([stride] * 2, [1, 1], [dilation] * 2, False, [0, 0], 1)
    go = torch.randn_like(aten.convolution(x, w, None, *params))

    def backward(x, w, go):
        return aten.convolution_backward(go, x, w, [4], *params, [True, True, True])

    return make_fx(backward, tracing_mode="fake")(x, w, go)


def _conv_transpose_graph(stride: int, dilation: int):
    def up(x, w):
        return F.conv_transpose2d(x, w, stride=stride, dilation=dilation, output_padding=1)

    return make_fx(up, tracing_mode="fake")(torch.randn(1, 4, 5, 5), torch.randn(4, 2, 3, 3))


@pytest.mark.parametrize("graph", [_conv_backward_graph, _conv_transpose_graph])
def test_stride_and_dilation_2_evrf010_in_the_reference_form_legal_in_the_trn_form(graph):
    gm = graph(2, 2)
    reference = lower_graph(gm)  # what the cpu target runs
    found = find_violations(gm, reference, TRN2)
    assert [(v.error.code, v.ncc_code) for v in found] == [EVRF010]
    convolution = next(n for n in gm.graph.nodes if n.op == "call_function")
    assert found[0].node is convolution and f"%{convolution.name}" in found[0].message
    trn = lower_graph(gm, target=TRN2)
    assert _codes(gm, trn) == []
    spread = [op for op in hlo_ops(trn.text) if op.name == "stablehlo.pad"]
    assert [op.ints("interior_padding") for op in spread] == [(0, 0, 1, 1)]
    assert trn.node_at_line(spread[0].line) is convolution


@pytest.mark.parametrize("graph", [_conv_backward_graph, _conv_transpose_graph])
@pytest.mark.parametrize("stride, dilation", [(2, 1), (1, 2), (1, 1)])
def test_stride_or_dilation_alone_is_legal_and_the_trn_module_is_the_reference(
    graph, stride, dilation
):
    gm = graph(stride, dilation)
    reference = lower_graph(gm)
    assert _codes(gm, reference) == []
    assert lower_graph(gm, target=TRN2).text == reference.text


def test_cpu_target_keeps_the_reference_forms():
    """The cpu target still emits lhs_dilation (the stride) with rhs_dilation (the dilation) for
    grad_input, and grad_weight's stride-as-dilation form, with no pad."""
    text = lower_graph(_conv_backward_graph(2, 2)).text
    FileCheck().check("stablehlo.reverse").check('"stablehlo.convolution"').check_same(
        "[b, f, 0, 1]x[i, o, 0, 1]->[b, f, 0, 1]"
    ).check_same("window_strides = array<i64: 1, 1>, padding = dense<[[3, 3], [3, 3]]>").check_same(
        "lhs_dilation = array<i64: 2, 2>, rhs_dilation = array<i64: 2, 2>"
    ).check('"stablehlo.convolution"').check_same(
        "[f, b, 0, 1]x[i, o, 0, 1]->[f, b, 0, 1]"
    ).check_same("window_strides = array<i64: 2, 2>, padding = dense<[[1, 1], [1, 1]]>").check_same(
        "lhs_dilation = array<i64: 1, 1>, rhs_dilation = array<i64: 2, 2>"
    ).run(text)
    FileCheck().check_not("stablehlo.pad").run(text)
    text = lower_graph(_conv_transpose_graph(2, 2)).text
    FileCheck().check('"stablehlo.convolution"').check_same(
        "padding = dense<[[4, 5], [4, 5]]>"
    ).check_same("lhs_dilation = array<i64: 2, 2>, rhs_dilation = array<i64: 2, 2>").run(text)
    FileCheck().check_not("stablehlo.pad").run(text)


# ---- every convolution form: legal on trn, same numbers as the cpu target and eager ----------

_SPATIAL = {1: (9,), 2: (7, 6), 3: (5, 4, 5)}
_KERNEL = {1: (3,), 2: (3, 2), 3: (2, 2, 3)}


def _form_cases():
    """(nd, transposed, stride, dilation, groups, output_padding, padding): each dimensionality,
    regular and transposed, grouped or not, under stride and dilation alone and together (also
    on different dims, and stride 3); padding 3 makes conv_transpose_lhs pad negatively."""
    for nd, transposed, (stride, dilation), groups in itertools.product(
        (1, 2, 3), (False, True), ((1, 1), (2, 1), (1, 2), (2, 2), ("mixed",) * 2), (1, 2)
    ):
        if stride == "mixed":  # stride on one dim, dilation on another: still EVRF010
            if nd == 1:
                continue
            stride, dilation = [2] + [1] * (nd - 1), [1] * (nd - 1) + [2]
        else:
            stride, dilation = [stride] * nd, [dilation] * nd
        output_padding = [1 if transposed and s > 1 else 0 for s in stride]
        yield nd, transposed, stride, dilation, groups, output_padding, 1
    for transposed in (False, True):
        yield 2, transposed, [2, 2], [2, 2], 2, [int(transposed)] * 2, 3
        yield 2, transposed, [3, 3], [2, 2], 1, [2 * int(transposed)] * 2, 1


def _form_graph(nd, transposed, stride, dilation, groups, output_padding, padding):
    """Forward and full backward (grad_input, grad_weight, grad_bias) of one convolution."""
    cin, cout = 4, 6
    x = torch.randn(2, cin, *_SPATIAL[nd])
    shape = (cin, cout // groups) if transposed else (cout, cin // groups)
    w = torch.randn(*shape, *_KERNEL[nd])
    b = torch.randn(cout)
    params = (stride, [padding] * nd, dilation, transposed, output_padding, groups)
    go = torch.randn_like(aten.convolution(x, w, b, *params))

    def forward_backward(x, w, b, go):
        y = aten.convolution(x, w, b, *params)
        return y, *aten.convolution_backward(go, x, w, [cout], *params, [True, True, True])

    gm = make_fx(forward_backward, tracing_mode="fake")(x, w, b, go)
    return gm, (x, w, b, go), forward_backward(x, w, b, go)


def _run(lowered: LoweredGraph, args) -> list[torch.Tensor]:
    exe = XlaCpuExecutable(artifact.serialize(lowered.text, "portable"))
    results = exe(list(args), [None] * len(args))
    assert all(o.kind == "result" for o in lowered.outputs)
    return [results[o.index] for o in lowered.outputs]


@pytest.mark.parametrize("case", list(_form_cases()), ids=str)
def test_every_convolution_form_is_legal_on_trn_and_equal_to_the_cpu_target(case):
    nd, transposed, stride, dilation, groups, output_padding, padding = case
    torch.manual_seed(0)
    gm, args, eager = _form_graph(*case)
    reference, trn = lower_graph(gm), lower_graph(gm, target=TRN2)
    both_dilate = max(stride) > 1 and max(dilation) > 1
    # One convolution is conv_transpose_lhs: the forward if transposed, else grad_input.
    assert _codes(gm, reference) == ([EVRF010] if both_dilate else [])
    assert _codes(gm, trn) == [] and _codes(gm, trn, TRN3) == []
    if not both_dilate:  # the same module: the same executable and numbers as the cpu target
        assert trn.text == reference.text
        return
    on_cpu, on_trn = _run(reference, args), _run(trn, args)
    for got, want, expected in zip(on_trn, on_cpu, eager, strict=True):
        assert torch.equal(got, want)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)


# ---- through torch.compile: forward and backward of nn modules --------------------------------

_MODULES = {
    "conv1d": (lambda: nn.Conv1d(4, 6, 3, stride=2, dilation=2, padding=1), (2, 4, 17)),
    "conv2d_groups": (
        lambda: nn.Conv2d(4, 6, 3, stride=2, dilation=2, padding=2, groups=2),
        (2, 4, 11, 10),
    ),
    "conv2d_per_dim": (
        lambda: nn.Conv2d(4, 6, (3, 2), stride=(2, 1), dilation=(1, 3), padding=(1, 2)),
        (2, 4, 11, 10),
    ),
    "conv3d": (
        lambda: nn.Conv3d(2, 4, 2, stride=(2, 3, 2), dilation=(2, 1, 2), padding=1),
        (1, 2, 7, 8, 6),
    ),
    "conv_transpose1d": (
        lambda: nn.ConvTranspose1d(4, 2, 3, stride=3, dilation=2, padding=2, output_padding=2),
        (2, 4, 7),
    ),
    "conv_transpose2d": (
        lambda: nn.ConvTranspose2d(
            4, 6, 3, stride=2, dilation=2, padding=1, output_padding=1, groups=2
        ),
        (2, 4, 5, 6),
    ),
    "conv_transpose3d": (
        lambda: nn.ConvTranspose3d(2, 2, 2, stride=2, dilation=3, output_padding=1),
        (1, 2, 3, 4, 3),
    ),
}


def _step(model: nn.Module, x: torch.Tensor, target: str | None) -> list[torch.Tensor]:
    """Output, grad of the input and grads of the parameters of one weighted-sum backward."""
    torch._dynamo.reset()
    model.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_()
    fn = (
        model
        if target is None
        else torch.compile(model, backend="neuron", options={"target": target})
    )
    y = fn(x)
    (y * torch.linspace(-1, 1, y.numel()).view(y.shape)).sum().backward()
    return [y.detach(), x.grad, *(p.grad for p in model.parameters())]


def _reference_step(model: nn.Module, x: torch.Tensor, tmp_path) -> list[torch.Tensor]:
    """``_step`` on XLA CPU with the reference forms only: the cpu target lowers grouped
    convolutions with forms of its own (``neuron_compile/cpu/lowering.py``), which sum in another
    order. Its own cache directory and a reset on both sides keep these executables, compiled
    from the same graphs under the same keys, from serving any other compile."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(targets, "CPU", targets.Target())
        patch.setenv("NEURON_COMPILE_CACHE_DIR", str(tmp_path / "reference"))
        targets.get_target.cache_clear()
        neuron_compile.reset()
        try:
            return _step(model, x, "cpu")
        finally:
            neuron_compile.reset()
            targets.get_target.cache_clear()


@pytest.mark.parametrize("name", list(_MODULES))
def test_trn2_forward_backward_is_legal_bit_exact_to_cpu_and_close_to_eager(
    name, monkeypatch, no_neuronx_cc, tmp_path
):
    make, shape = _MODULES[name]
    torch.manual_seed(0)
    model, x = make(), torch.randn(shape)
    checked = []
    real_check = legality_mod.check_legality

    def spy(gm, lowered, target, **kw):
        checked.append((gm, lowered, target))
        real_check(gm, lowered, target, **kw)

    eager, cpu = _step(model, x, None), _reference_step(model, x, tmp_path)
    monkeypatch.setattr(legality_mod, "check_legality", spy)
    trn2 = _step(model, x, "trn2")
    assert len(checked) == 2  # the forward and the backward graph
    assert all(find_violations(gm, lowered, target) == [] for gm, lowered, target in checked)
    assert any("stablehlo.pad" in lowered.text for _, lowered, _ in checked)  # the rewrite ran
    for got, want, expected in zip(trn2, cpu, eager, strict=True):
        assert torch.equal(got, want)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)


# ---- the error through torch.compile -----------------------------------------------------------


def _upsample(x, w):
    return F.conv_transpose2d(x, w, stride=2, dilation=2).relu()  # the user's line


def _downsample(x, w):
    return F.conv2d(x, w, stride=2, dilation=2).relu()  # the user's line


@pytest.mark.parametrize(
    "fn, weight, node",
    [
        (_upsample, (2, 3, 3, 3), "convolution"),  # the forward graph is rejected
        (_downsample, (3, 2, 3, 3), "convolution_backward"),  # the backward graph is rejected
    ],
)
def test_error_through_torch_compile_names_nc510_the_node_and_the_user_line(
    fn, weight, node, monkeypatch, no_neuronx_cc
):
    """A lowering that bypasses the trn form (here: the reference conv_transpose_lhs put back)
    is stopped before neuronx-cc with our code, the NCC code, the FX node and the user's line."""
    monkeypatch.setattr(lowering_conv, "conv_transpose_lhs_undilated", conv_transpose_lhs)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="neuron", options={"target": "trn2"})
    x = torch.randn(1, 2, 9, 9, requires_grad=True)
    w = torch.randn(weight, requires_grad=True)
    with pytest.raises(Exception) as info:
        compiled(x, w).sum().backward()
    err = _root_cause(info.value)
    assert isinstance(err, errors.ConvolutionFormViolation), repr(info.value)
    assert err.code == "NC510" and err.ncc_code == "NCC_EVRF010" and err.target == "trn2"
    assert err.rule == "convolution_form" and err.node_name == node
    assert err.where.startswith(f"{__file__}:") and err.where.endswith(f"in {fn.__name__}")
    assert err.source is not None and err.source.endswith("dilation=2).relu()  # the user's line")
    assert "stablehlo.pad" in err.hint and "pre-empts NCC_EVRF010" in str(err)
