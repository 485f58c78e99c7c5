"""The trn2 target without a device: graphs pass trn legality and run on their CPU stand-in.
AOTAutogradCache is not used for trn targets by design (their NEFFs are not rebuilt from our FX
index); warm processes must still compute the same results."""

from __future__ import annotations

import copy

import torch


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.norm = torch.nn.LayerNorm(32)
        self.b = torch.nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(torch.nn.functional.silu(self.norm(self.a(x))))


def run(out) -> None:
    model = Block()
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend="neuron", options={"target": "trn2"})
    x = torch.randn(4, 16)
    loss = compiled(x).square().mean()
    loss.backward()
    want = eager(x).square().mean()
    want.backward()
    out.check("loss", loss, want, tol=1e-4)
    for (name, p), q in zip(model.named_parameters(), eager.parameters(), strict=True):
        out.check(f"grad.{name}", p.grad, q.grad, tol=1e-4)
    with torch.no_grad():
        out.check("inference", compiled(x), eager(x), tol=1e-4)
