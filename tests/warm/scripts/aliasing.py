"""Outputs that alias inputs (views, a mutated input returned) and a lifted constant: AOTAutograd
regenerates aliases and copies mutations back in runtime wrappers, which a warm start rebuilds
from the cache entry instead of tracing."""

from __future__ import annotations

import copy

import torch


def views(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
    y.add_(1)
    return x.t(), x[1:], y, x * 2, y.view(-1)


class WithConstant(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.register_buffer("scale", torch.tensor([1.5, 2.0, 0.5, 1.0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x) * self.scale + torch.tensor([0.1, 0.2, 0.3, 0.4])


def _weighted(outs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    return outs[0].sum() + outs[1].sum() * 3 + outs[3].square().sum()


def run(out) -> None:
    compiled = torch.compile(views, backend="neuron")
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    ref_y = y.clone()
    got, want = compiled(x, y), views(x, ref_y)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        out.check(f"views{i}", g, w)
    out.check("mutated_y", y, ref_y)
    # The aliasing itself, not only the values: views of x share its storage, y comes back.
    aliased = [got[0].data_ptr() == x.data_ptr(), got[2] is y, got[4].data_ptr() == y.data_ptr()]
    out.check("aliased", torch.tensor(aliased), torch.tensor([True, True, True]))

    xg = torch.randn(3, 4, requires_grad=True)
    xe = xg.detach().clone().requires_grad_()
    _weighted(compiled(xg, torch.zeros(3, 4))).backward()
    _weighted(views(xe, torch.zeros(3, 4))).backward()
    out.check("views.grad", xg.grad, xe.grad)

    model = WithConstant()
    eager = copy.deepcopy(model)
    z = torch.randn(2, 4)
    loss = torch.compile(model, backend="neuron")(z).sum()
    loss.backward()
    want_loss = eager(z).sum()
    want_loss.backward()
    out.check("constant.loss", loss, want_loss)
    out.check("constant.grad", model.a.weight.grad, eager.a.weight.grad)
