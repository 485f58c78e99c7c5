"""New shapes after a warm hit. dynamic=False: shape A, then shape B (a recompile: warm, a
second hit), then in the warm process only a shape C no process has compiled (a miss after the
hits, traced and stored). dynamic=None: the second shape turns Dynamo's automatic dynamic on and
our ShapeSpecializer compiles one static graph per concrete shape."""

from __future__ import annotations

import copy

import torch


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(10, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.a(x)).sum(0)


def run(out) -> None:
    model = Net()
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend="neuron", dynamic=False)
    out.train_step("A", model, compiled, eager, torch.randn(4, 10))
    out.train_step("B", model, compiled, eager, torch.randn(7, 10))
    out.train_step("A_again", model, compiled, eager, torch.randn(4, 10))

    def head(x: torch.Tensor) -> torch.Tensor:
        return torch.cos(x) @ x.T

    auto = torch.compile(head, backend="neuron")  # dynamic=None: automatic dynamic shapes
    with torch.no_grad():
        for rows in (3, 5, 6):
            x = torch.randn(rows, 4)
            out.check(f"auto{rows}", auto(x), head(x))

    # Last, so that the random inputs drawn above are the same in both processes.
    if out.phase == "warm":  # after the hits, a shape the cold process never compiled
        with out.warm_only():
            out.train_step("C", model, compiled, eager, torch.randn(9, 10))
