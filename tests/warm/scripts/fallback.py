"""A graph with CPU-fallback regions: a custom op no backend lowers (trainable, between two
compiled regions) and torch.bincount (a data-dependent size) on a side output. AOTAutogradCache never stores
such graphs (their regions run the FX graph); our disk cache still serves the compiled regions."""

from __future__ import annotations

import copy

import torch

from tests.custom_ops import cpu_scan


class Scanned(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 12)
        self.b = torch.nn.Linear(12, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.relu(self.a(x))
        hist = torch.bincount(h.detach().argmax(1), minlength=12)
        return self.b(torch.tanh(cpu_scan(h))), hist


def run(out) -> None:
    model = Scanned()
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend="neuron")
    x = torch.randn(5, 8)
    for step in range(2):
        y, hist = compiled(x)
        y.sum().backward()
        want, want_hist = eager(x)
        want.sum().backward()
        out.check(f"y{step}", y, want)
        out.check(f"hist{step}", hist, want_hist)
        for (name, p), q in zip(model.named_parameters(), eager.parameters(), strict=True):
            out.check(f"grad{step}.{name}", p.grad, q.grad, tol=1e-4)
            p.grad = q.grad = None
    with torch.no_grad():
        y, hist = compiled(x)
        want, want_hist = eager(x)
    out.check("inference", y, want)
    out.check("inference.hist", hist, want_hist)
