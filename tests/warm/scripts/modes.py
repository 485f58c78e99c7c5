"""train() and eval() with grad mode switched under each: four frames of one module, each its
own compile (a recompile in the cold process, a hit in the warm one), then the first mode again
(a guard hit)."""

from __future__ import annotations

import copy

import torch


class Gated(torch.nn.Module):
    """Computes differently in training (a deterministic stand-in for dropout)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(7, 9)
        self.b = torch.nn.Linear(9, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        if self.training:
            h = h * 0.5 + 0.25
        return self.b(h)


def run(out) -> None:
    model = Gated()
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend="neuron")
    x = torch.randn(3, 7)
    out.train_step("train_grad", model, compiled, eager, x)
    compiled.eval()
    eager.eval()
    with torch.no_grad():
        out.check("eval_no_grad", compiled(x), eager(x))
    out.train_step("eval_grad", model, compiled, eager, x)
    compiled.train()
    eager.train()
    with torch.no_grad():
        out.check("train_no_grad", compiled(x), eager(x))
    out.train_step("train_grad_again", model, compiled, eager, x)
