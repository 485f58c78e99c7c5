"""Convolution, pooling and batch norm compiled with ``backend="neuron"`` vs eager, forward and
backward (the backward graphs exercise convolution_backward, the pooling backward ops and the
batch-norm backward, which the cpu target lowers whole)."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import neuron_compile
from tests.parity import graph_kinds

aten = torch.ops.aten
F32 = {"rtol": 1e-4, "atol": 1e-5}
BF16 = {"rtol": 2e-2, "atol": 2e-2}


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _leaves(xs: tuple[torch.Tensor, ...], grad_mask: tuple[bool, ...] | None) -> list[torch.Tensor]:
    mask = grad_mask or (True,) * len(xs)
    return [
        x.detach().clone().requires_grad_(m and x.is_floating_point())
        for x, m in zip(xs, mask, strict=True)
    ]


def check_against_eager(
    fn: Callable[..., Any],
    *inputs: torch.Tensor,
    tol: dict[str, float] = F32,
    grad_mask: tuple[bool, ...] | None = None,
) -> tuple[Any, Any]:
    """Compile ``fn``; compare its output(s) and the gradients of every differentiable input
    (for a cotangent on the first output) with eager. Returns (compiled, eager) outputs."""
    ours, theirs = _leaves(inputs, grad_mask), _leaves(inputs, grad_mask)
    out = torch.compile(fn, backend="neuron")(*ours)
    ref = fn(*theirs)
    first, ref_first = (out[0], ref[0]) if isinstance(ref, tuple) else (out, ref)
    torch.testing.assert_close(first, ref_first, **tol)
    cotangent = torch.randn_like(ref_first)
    first.backward(cotangent)
    ref_first.backward(cotangent)
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        if b.requires_grad:
            torch.testing.assert_close(
                a.grad, b.grad, msg=lambda m, i=i: f"grad of input {i}: {m}", **tol
            )
    assert graph_kinds() == ["forward", "backward"]
    return out, ref


# ---- convolution -----------------------------------------------------------------------------
CONV_CASES = {
    "conv2d-bias": (lambda x, w, b: F.conv2d(x, w, b), [(2, 4, 9, 9), (6, 4, 3, 3), (6,)]),
    "conv2d-stride2-pad1": (
        lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1),
        [(2, 4, 9, 9), (6, 4, 3, 3), (6,)],
    ),
    "conv2d-dilation-asym": (
        lambda x, w: F.conv2d(x, w, stride=(2, 1), padding=(2, 1), dilation=(2, 3)),
        [(2, 4, 11, 10), (5, 4, 3, 2)],
    ),
    "conv2d-groups2": (
        lambda x, w: F.conv2d(x, w, stride=2, padding=1, groups=2),
        [(2, 4, 9, 9), (6, 2, 3, 3)],
    ),
    "conv2d-depthwise-x2": (
        lambda x, w, b: F.conv2d(x, w, b, padding=1, groups=4),
        [(2, 4, 8, 8), (8, 1, 3, 3), (8,)],
    ),
    "conv1d": (
        lambda x, w, b: F.conv1d(x, w, b, stride=2, padding=2, dilation=2),
        [(2, 3, 17), (5, 3, 3), (5,)],
    ),
    "conv3d-groups2": (
        lambda x, w, b: F.conv3d(x, w, b, stride=(1, 2, 2), padding=1, groups=2),
        [(2, 4, 5, 6, 7), (6, 2, 3, 3, 3), (6,)],
    ),
    "conv2d-unbatched": (lambda x, w: F.conv2d(x, w, padding=1), [(4, 6, 6), (3, 4, 3, 3)]),
    "conv2d-pad-exceeds-kernel": (
        lambda x, w: F.conv2d(x, w, padding=3),
        [(1, 2, 5, 5), (3, 2, 2, 2)],
    ),
    "conv-transpose2d": (
        lambda x, w, b: F.conv_transpose2d(
            x, w, b, stride=2, padding=1, output_padding=1, groups=2
        ),
        [(2, 4, 5, 5), (4, 3, 3, 3), (6,)],
    ),
    "conv-transpose2d-dilated": (
        lambda x, w: F.conv_transpose2d(x, w, stride=1, output_padding=1, dilation=2),
        [(2, 4, 5, 5), (4, 3, 3, 3)],
    ),
    "conv-transpose1d": (lambda x, w: F.conv_transpose1d(x, w, stride=3), [(2, 4, 7), (4, 2, 4)]),
}


@pytest.mark.parametrize("name", list(CONV_CASES))
def test_convolution_matches_eager(name):
    fn, shapes = CONV_CASES[name]
    check_against_eager(fn, *[torch.randn(s) for s in shapes])


@pytest.mark.parametrize("name", ["conv2d-groups2", "conv2d-depthwise-x2", "conv-transpose2d"])
def test_convolution_bf16_matches_eager(name):
    fn, shapes = CONV_CASES[name]
    out, _ = check_against_eager(fn, *[torch.randn(s).bfloat16() for s in shapes], tol=BF16)
    assert out.dtype == torch.bfloat16


def test_conv_weight_gradient_only():
    # The input needs no gradient: convolution_backward runs with output_mask [False, True, True].
    fn, shapes = CONV_CASES["conv2d-stride2-pad1"]
    check_against_eager(fn, *[torch.randn(s) for s in shapes], grad_mask=(False, True, True))


def test_convolution_backward_with_masked_outputs_returns_only_requested_grads():
    def grad_weight(g, x, w):
        outs = aten.convolution_backward(
            g, x, w, None, [2, 2], [1, 1], [1, 1], False, [0, 0], 2, [False, True, False]
        )
        assert outs[0] is None and outs[2] is None
        return outs[1]

    args = (torch.randn(2, 6, 5, 5), torch.randn(2, 4, 9, 9), torch.randn(6, 2, 3, 3))
    torch.testing.assert_close(
        torch.compile(grad_weight, backend="neuron")(*args), grad_weight(*args), **F32
    )


# ---- max pooling -----------------------------------------------------------------------------
def _max_pool(**kw: Any) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    return lambda x: F.max_pool2d(x, return_indices=True, **kw)


MAX_POOL_CASES = {
    "k2": ({"kernel_size": 2}, (2, 3, 8, 10)),
    "k3-s2-p1": ({"kernel_size": 3, "stride": 2, "padding": 1}, (2, 3, 9, 10)),
    "ceil-mode": ({"kernel_size": 3, "stride": 2, "ceil_mode": True}, (2, 3, 8, 10)),
    "dilation-ceil": (
        {
            "kernel_size": (3, 2),
            "stride": (1, 2),
            "padding": 1,
            "dilation": (2, 1),
            "ceil_mode": True,
        },
        (2, 3, 9, 9),
    ),
    "unbatched": ({"kernel_size": 2}, (3, 8, 8)),
}


@pytest.mark.parametrize("name", list(MAX_POOL_CASES))
def test_max_pool_values_indices_and_grad_match_eager(name):
    kw, shape = MAX_POOL_CASES[name]
    out, ref = check_against_eager(_max_pool(**kw), torch.randn(shape))
    assert out[1].dtype == torch.int64
    assert torch.equal(out[1], ref[1])


@pytest.mark.parametrize(
    "name, x",
    [
        ("all-equal", torch.ones(2, 2, 6, 6)),
        ("binary", torch.randint(0, 2, (2, 2, 7, 7)).float()),
    ],
)
def test_max_pool_breaks_ties_like_eager(name, x):
    # Overlapping padded windows over equal values: eager picks the first (smallest) index, and the
    # backward must route each gradient to that same element.
    out, ref = check_against_eager(_max_pool(kernel_size=3, stride=1, padding=1), x)
    assert torch.equal(out[1], ref[1])


def test_max_pool_nan_and_all_neg_inf_windows_match_eager():
    x = torch.randn(1, 2, 6, 6)
    x[0, 0, 1, 1] = x[0, 0, 0, 1] = float("nan")
    x[0, 1, :2, :2] = float("-inf")
    fn = _max_pool(kernel_size=2, stride=1, padding=1)
    out, ref = torch.compile(fn, backend="neuron")(x), fn(x)
    torch.testing.assert_close(out[0], ref[0], equal_nan=True)
    assert torch.equal(out[1], ref[1])


def test_max_pool_bf16_matches_eager():
    out, ref = check_against_eager(
        _max_pool(kernel_size=3, stride=2, padding=1), torch.randn(2, 3, 9, 9).bfloat16(), tol=BF16
    )
    assert out[0].dtype == torch.bfloat16
    assert torch.equal(out[0], ref[0])  # a max is exact in any precision
    assert torch.equal(out[1], ref[1])


# ---- average pooling -------------------------------------------------------------------------
AVG_POOL_CASES = {
    "k2": lambda x: F.avg_pool2d(x, 2),
    "k3-s2-p1": lambda x: F.avg_pool2d(x, 3, 2, 1),
    "exclude-pad": lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False),
    "ceil-mode": lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True),
    "ceil-mode-exclude-pad": lambda x: F.avg_pool2d(
        x, 3, 2, 1, ceil_mode=True, count_include_pad=False
    ),
    "divisor-override": lambda x: F.avg_pool2d(
        x, (2, 3), (1, 2), 1, ceil_mode=True, divisor_override=5
    ),
    "adaptive-divisible": lambda x: F.adaptive_avg_pool2d(x, (3, 5)),
    "adaptive-uneven": lambda x: F.adaptive_avg_pool2d(x, (4, 3)),
    "adaptive-1": lambda x: F.adaptive_avg_pool2d(x, 1),
}


@pytest.mark.parametrize("name", list(AVG_POOL_CASES))
def test_avg_pool_matches_eager(name):
    check_against_eager(AVG_POOL_CASES[name], torch.randn(2, 3, 9, 10))


@pytest.mark.parametrize("name", ["ceil-mode-exclude-pad", "adaptive-uneven"])
def test_avg_pool_bf16_matches_eager(name):
    out, _ = check_against_eager(
        AVG_POOL_CASES[name], torch.randn(2, 3, 9, 10).bfloat16(), tol=BF16
    )
    assert out.dtype == torch.bfloat16


def test_avg_pool_unbatched_matches_eager():
    check_against_eager(lambda x: F.avg_pool2d(x, 2, ceil_mode=True), torch.randn(3, 7, 7))


# ---- batch norm ------------------------------------------------------------------------------
def _check_module_steps(
    model: nn.Module, x: torch.Tensor, tol: dict[str, float], steps: int = 2
) -> None:
    """``steps`` forward+backward passes: outputs, input/parameter grads and buffers vs eager."""
    compiled_model = copy.deepcopy(model)
    run = torch.compile(compiled_model, backend="neuron")
    for _ in range(steps):
        a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
        out, ref = run(a), model(b)
        torch.testing.assert_close(out, ref, **tol)
        cotangent = torch.randn_like(ref)
        out.backward(cotangent)
        ref.backward(cotangent)
        torch.testing.assert_close(a.grad, b.grad, **tol)
        for (name, p), q in zip(compiled_model.named_parameters(), model.parameters(), strict=True):
            torch.testing.assert_close(
                p.grad, q.grad, msg=lambda m, n=name: f"grad of {n}: {m}", **tol
            )
        for (name, buf), want in zip(compiled_model.named_buffers(), model.buffers(), strict=True):
            torch.testing.assert_close(buf, want, msg=lambda m, n=name: f"buffer {n}: {m}", **tol)


BN_CASES = {
    "bn2d": (lambda: nn.BatchNorm2d(4, momentum=0.3), (3, 4, 5, 5)),
    "bn2d-no-affine": (lambda: nn.BatchNorm2d(4, affine=False), (3, 4, 5, 5)),
    "bn2d-no-running-stats": (lambda: nn.BatchNorm2d(4, track_running_stats=False), (3, 4, 5, 5)),
    "bn1d-2d-input": (lambda: nn.BatchNorm1d(4), (6, 4)),
    "bn1d-3d-input": (lambda: nn.BatchNorm1d(4), (6, 4, 7)),
    "bn3d": (lambda: nn.BatchNorm3d(4), (2, 4, 3, 4, 5)),
}


@pytest.mark.parametrize("name", list(BN_CASES))
def test_batch_norm_train_matches_eager_including_running_stats(name):
    make, shape = BN_CASES[name]
    model = make().train()
    before = [b.clone() for b in model.buffers()]
    _check_module_steps(model, 2 * torch.randn(shape) + 1, F32)
    # Running stats did move (the comparison above is not between two untouched buffers).
    assert all(not torch.equal(b, a) for b, a in zip(model.buffers(), before, strict=True))


def test_batch_norm_eval_matches_eager():
    model = nn.BatchNorm2d(4)
    model.running_mean.uniform_(-1, 1)
    model.running_var.uniform_(0.5, 2)
    model.weight.data.uniform_(0.5, 1.5)
    _check_module_steps(model.eval(), torch.randn(3, 4, 5, 5), F32)
    with torch.no_grad():
        x = torch.randn(3, 4, 5, 5)
        torch.testing.assert_close(torch.compile(model, backend="neuron")(x), model(x), **F32)


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_batch_norm_bf16_matches_eager(train):
    model = nn.BatchNorm2d(4).bfloat16().train(train)
    _check_module_steps(model, torch.randn(3, 4, 5, 5).bfloat16(), BF16)


KEPT_WHOLE = {
    "batch_norm": (
        aten.native_batch_norm_backward.default,
        lambda: nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()),
        (2, 3, 6, 6),
    ),
    "layer_norm": (
        aten.native_layer_norm_backward.default,
        lambda: nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.GELU()),
        (3, 5, 6),
    ),
}


@pytest.mark.parametrize("name", list(KEPT_WHOLE))
def test_norm_backward_is_lowered_whole_on_cpu_and_decomposed_for_trn(name, tmp_path, monkeypatch):
    # Tracing PyTorch's decomposition of every BatchNorm's backward (~30 ops) cost ResNet-18's
    # first call 0.17 s: the cpu target keeps these ops whole; trn targets still decompose them.
    from neuron_compile.capture import decomposition_table

    op, make, shape = KEPT_WHOLE[name]
    assert op not in decomposition_table("cpu") and op in decomposition_table("trn2")
    monkeypatch.setenv("NEURON_COMPILE_DUMP_DIR", str(tmp_path))
    _check_module_steps(make().train(), 2 * torch.randn(shape) + 1, F32, steps=1)
    forward, backward = neuron_compile.metrics()
    assert backward.kind == "backward" and not backward.fallback_ops
    (graph,) = tmp_path.glob("*_backward_*/graph.fx.py")
    text = graph.read_text()
    assert f"torch.ops.aten.{op.__name__}" in text
    # a training BatchNorm's backward reads the saved batch statistics, not the running ones
    # (capture.dropping_ignored_inputs): they are not saved for it
    ignored = r"native_batch_norm_backward\.default\(\w+, \w+, \w+, None, None, "
    assert name != "batch_norm" or re.search(ignored, text)
