"""Buffers mutated in place: BatchNorm's running statistics over two training steps, then
eval() reading them; and a user tensor mutated in place by a compiled function (an input
mutation AOTAutograd copies back after the graph)."""

from __future__ import annotations

import copy

import torch


class Normed(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(5, 8)
        self.bn = torch.nn.BatchNorm1d(8)
        self.b = torch.nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.bn(self.a(x))))


def ema(state: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    state.mul_(0.9).add_(x.mean(0), alpha=0.1)
    return state.sum()


def run(out) -> None:
    model = Normed()
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend="neuron")
    mean = lambda y: y.square().mean()  # noqa: E731
    for step in range(2):  # gradients accumulate over both steps, as in eager
        x = torch.randn(6, 5)
        out.train_step(f"step{step}", model, compiled, eager, x, mean, keep_grads=True)
    for (name, buf), ref in zip(model.named_buffers(), eager.buffers(), strict=True):
        out.check(f"buffer.{name}", buf, ref)
    compiled.eval()
    eager.eval()
    with torch.no_grad():
        x = torch.randn(6, 5)  # the training batch size: a new one is new_shape.py's case
        out.check("eval", compiled(x), eager(x))
    for (name, buf), ref in zip(model.named_buffers(), eager.buffers(), strict=True):
        out.check(f"buffer_after_eval.{name}", buf, ref)  # eval reads, never writes

    state, ref_state = torch.zeros(5), torch.zeros(5)
    compiled_ema = torch.compile(ema, backend="neuron")
    for step in range(3):
        x = torch.randn(4, 5)
        out.check(f"ema{step}", compiled_ema(state, x), ema(ref_state, x))
        out.check(f"ema_state{step}", state, ref_state)
