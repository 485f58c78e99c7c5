"""A training step first, then inference under no_grad and under inference_mode: a
forward/backward pair, then recompiles for each grad mode."""

from __future__ import annotations

import copy

import torch


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(6, 12)
        self.b = torch.nn.Linear(12, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.a(x)) * 2)


def run(out) -> None:
    model = Mlp()
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend="neuron")
    x = torch.randn(4, 6)
    loss = compiled(x).sum()
    loss.backward()
    want = eager(x).sum()
    want.backward()
    out.check("loss", loss, want)
    for (name, p), q in zip(model.named_parameters(), eager.parameters(), strict=True):
        out.check(f"grad.{name}", p.grad, q.grad)
    with torch.no_grad():
        out.check("no_grad", compiled(x), eager(x))
    with torch.inference_mode():
        out.check("inference_mode", compiled(x), eager(x))
    # Back to grad mode: the first frame again, now a guard hit (cold) or a second load (warm).
    out.check("again", compiled(x).detach(), eager(x).detach())
