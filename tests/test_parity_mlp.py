"""examples/train_mlp.py's MLP: compiled forward, gradients and training match eager."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from train_mlp import MLP, make_data, train

from tests.helpers import train_losses
from tests.parity import (
    assert_grads_close,
    assert_low_precision_grads,
    forward_backward,
    graph_kinds,
    normwise_error,
)

F32_TOL = {"rtol": 1e-4, "atol": 1e-5}


@pytest.fixture
def model() -> MLP:
    torch.manual_seed(0)
    return MLP()


@pytest.fixture
def batch() -> tuple[torch.Tensor, torch.Tensor]:
    return make_data(1, batch=16)[0]


def _ce(y: torch.Tensor):
    return lambda out: F.cross_entropy(out.float(), y)


def test_forward_and_every_gradient_match_eager(model, batch):
    x, y = batch
    out, grads = forward_backward(model, (x,), _ce(y), backend="neuron")
    ref_out, ref_grads = forward_backward(model, (x,), _ce(y), backend=None)
    torch.testing.assert_close(out, ref_out, **F32_TOL)
    assert_grads_close(grads, ref_grads, **F32_TOL)
    assert graph_kinds() == ["forward", "backward"]


def test_input_gradient_matches_eager(model):
    x = torch.randn(8, 32)
    xs = [x.clone().requires_grad_(True) for _ in range(2)]
    torch.compile(copy.deepcopy(model), backend="neuron")(xs[0]).square().mean().backward()
    copy.deepcopy(model)(xs[1]).square().mean().backward()
    torch.testing.assert_close(xs[0].grad, xs[1].grad, **F32_TOL)


def test_twenty_sgd_steps_match_eager(model):
    batches = make_data(20, batch=16, seed=1)

    def loss_fn(m, x, y):
        return F.cross_entropy(m(x), y)

    compiled = train_losses(model, batches, loss_fn, compile_backend="neuron", lr=0.2)
    eager = train_losses(model, batches, loss_fn, compile_backend=None, lr=0.2)
    torch.testing.assert_close(torch.tensor(compiled), torch.tensor(eager), rtol=1e-4, atol=0)
    # The steps changed the model (losses differ from the untrained model's), so agreement over
    # them is not vacuous.
    with torch.no_grad():
        frozen = [loss_fn(model, x, y).item() for x, y in batches]
    assert max(abs(a - b) for a, b in zip(eager[1:], frozen[1:], strict=True)) > 1e-2


def test_twenty_adamw_steps_match_eager(model):
    batches = make_data(20, batch=16, seed=2)
    compiled = train(copy.deepcopy(model), batches, backend="neuron")
    eager = train(copy.deepcopy(model), batches, backend=None)
    torch.testing.assert_close(torch.tensor(compiled), torch.tensor(eager), rtol=1e-4, atol=0)


def test_bfloat16_forward_and_gradients(model, batch):
    x, y = batch
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    out, grads = forward_backward(bf16, (x.bfloat16(),), _ce(y), backend="neuron")
    ref_out, ref_grads = forward_backward(bf16, (x.bfloat16(),), _ce(y), backend=None)
    _, f32_grads = forward_backward(model, (x,), _ce(y), backend=None)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, ref_out, rtol=2e-2, atol=2e-2)
    assert_low_precision_grads(grads, ref_grads, f32_grads)


def test_eval_mode_dropout_matches_eager():
    # Dropout with p > 0 is only compiled in eval mode, where it is the identity.
    torch.manual_seed(0)
    model = MLP(dropout=0.5).eval()
    x = torch.randn(8, 32)
    with torch.no_grad():
        out = torch.compile(model, backend="neuron")(x)
    torch.testing.assert_close(out, model(x), **F32_TOL)


def test_no_grad_compiles_one_inference_graph(model):
    x = torch.randn(4, 32)
    compiled = torch.compile(model, backend="neuron")
    with torch.no_grad():
        out = compiled(x)
        out2 = compiled(x)
    assert graph_kinds() == ["inference"]
    assert neuron_calls() == [2]
    assert not out.requires_grad
    torch.testing.assert_close(out2, model(x), **F32_TOL)


def test_backward_graph_is_compiled_lazily(model):
    x = torch.randn(4, 32)
    out = torch.compile(model, backend="neuron")(x)
    assert graph_kinds() == ["forward"]
    out.sum().backward()
    assert graph_kinds() == ["forward", "backward"]
    assert all(p.grad is not None for p in model.parameters())


def test_bfloat16_output_is_close_to_float32(model):
    # Guards against a bf16 path that matches eager bf16 only because both are equally wrong.
    x = torch.randn(16, 32)
    with torch.no_grad():
        out = torch.compile(copy.deepcopy(model).bfloat16(), backend="neuron")(x.bfloat16())
    assert normwise_error(out, model(x).detach()) < 2e-2


def neuron_calls() -> list[int]:
    import neuron_compile

    return [r.calls for r in neuron_compile.metrics()]
