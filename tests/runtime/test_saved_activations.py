"""Saved activations stay on the device between a forward and its backward (saved.py)."""

from __future__ import annotations

import warnings

import pytest
import torch

from neuron_compile.runtime import xla_cpu

from ..custom_ops import CPU_SCAN  # noqa: F401  (registers nctest::cpu_scan)


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.GELU()
    )


@pytest.fixture
def exports(monkeypatch):
    """Counts executor arrays converted to torch tensors (the double wraps the real exporter)."""
    real_one, real_many = xla_cpu._exporters()
    count = [0]

    def one(array):
        count[0] += 1
        return real_one(array)

    def many(arrays):
        count[0] += len(arrays)
        return real_many(arrays)

    monkeypatch.setattr(xla_cpu, "_exporters", lambda: (one, many))
    return count


def _grads(model):
    return [p.grad.clone() for p in model.parameters()]


def _train_step(model, x, compiled=True):
    run = torch.compile(model, backend="neuron") if compiled else model
    out = run(x)
    out.square().mean().backward()
    return out


def test_forward_hands_only_user_outputs_to_torch(exports):
    model, ref = _mlp(), _mlp()
    x = torch.randn(4, 8)
    run = torch.compile(model, backend="neuron")
    out = run(x)
    assert exports[0] == 1  # the output; tanh/gelu inputs etc. stay on the device
    out.square().mean().backward()
    _train_step(ref, x, compiled=False)
    for g, r in zip(_grads(model), _grads(ref), strict=True):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)


def test_saved_tensor_hooks_see_real_tensors_and_grads_match():
    model, ref = _mlp(), _mlp()
    x = torch.randn(4, 8)
    torch.compile(model, backend="neuron")(x)  # compile outside the hooks
    packed = []

    def pack(t):
        packed.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _train_step(model, x)
    _train_step(ref, x, compiled=False)
    assert packed and all(shape != (0,) for shape in packed)  # no device tokens leak out
    for g, r in zip(_grads(model), _grads(ref), strict=True):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)


def test_save_on_cpu_trains_like_eager():
    model, ref = _mlp(), _mlp()
    x = torch.randn(4, 8)
    with torch.autograd.graph.save_on_cpu():
        _train_step(model, x)
    _train_step(ref, x, compiled=False)
    for g, r in zip(_grads(model), _grads(ref), strict=True):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)


def test_in_place_edit_of_a_saved_output_still_trips_autograd():
    """exp saves its own output; it is also returned, so it stays a real tensor."""

    def f(x):
        return torch.exp(x)

    for fn in (f, torch.compile(f, backend="neuron")):
        x = torch.randn(5, requires_grad=True)
        y = fn(x)
        y.add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()


class _TanhWithCpuBackward(torch.autograd.Function):
    """Forward lowers; backward runs an op with no lowering, so only the backward falls back."""

    @staticmethod
    def forward(ctx, x):
        y = torch.tanh(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return (
            torch.ops.nctest.cpu_scan(grad * (1 - y * y)) / 2
            - torch.cumsum(grad * (1 - y * y), 0) / 2
            + grad * (1 - y * y)
        )


def test_backward_that_falls_back_reads_resident_activations():
    def f(x, w):
        return _TanhWithCpuBackward.apply(x @ w).sum(0)

    x = torch.randn(6, 4)
    w1 = torch.randn(4, 3, requires_grad=True)
    w2 = w1.detach().clone().requires_grad_()
    with pytest.warns(UserWarning, match="eagerly on the CPU"):
        torch.compile(f, backend="neuron")(x, w1).sum().backward()
    f(x, w2).sum().backward()
    torch.testing.assert_close(w1.grad, w2.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["solve", "logdet"])
def test_backward_that_falls_back_gets_saved_64_bit_activations_in_eagers_dtype(op):
    """The forward computes float64 narrowed; its saved LU reached the backward's eager
    ``lu_solve`` as float32 beside a float64 gradient, which raised a dtype mismatch."""
    a = torch.eye(3, dtype=torch.float64) * 2 + 0.1
    b = torch.ones(3, 2, dtype=torch.float64)

    def f(x):
        return torch.linalg.solve(x, b) if op == "solve" else torch.logdet(x)

    compiled, eager = a.clone().requires_grad_(), a.clone().requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DowncastWarning, FallbackWarning
        torch.compile(f, backend="neuron")(compiled).sum().backward()
    f(eager).sum().backward()
    assert compiled.grad.dtype == torch.float64
    torch.testing.assert_close(compiled.grad, eager.grad, rtol=1e-5, atol=1e-5)


def test_retain_graph_runs_backward_twice_from_the_same_tokens():
    model, ref = _mlp(), _mlp()
    x = torch.randn(4, 8)
    for m, compiled in ((model, True), (ref, False)):
        run = torch.compile(m, backend="neuron") if compiled else m
        loss = run(x).square().mean()
        loss.backward(retain_graph=True)
        loss.backward()
    for g, r in zip(_grads(model), _grads(ref), strict=True):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)
