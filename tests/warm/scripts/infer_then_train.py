"""Inference (no_grad) first, then two SGD training steps: an inference graph, then a recompile
for grad mode giving a forward/backward pair."""

from __future__ import annotations

import copy

import torch


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.nn.functional.gelu(self.a(x)))


def run(out) -> None:
    model = Mlp()
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend="neuron")
    x = torch.randn(5, 8)
    with torch.no_grad():
        out.check("inference", compiled(x), eager(x))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    eager_opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    for step in range(2):  # the second step runs on weights the first one updated
        mean = lambda y: y.square().mean()  # noqa: E731
        out.train_step(f"step{step}", model, compiled, eager, x, mean, keep_grads=True)
        opt.step()
        eager_opt.step()
        opt.zero_grad()
        eager_opt.zero_grad()
