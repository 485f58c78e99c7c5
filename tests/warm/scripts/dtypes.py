"""Outputs of several dtypes from one training graph (bfloat16 weights and activations, an
int64 argmax, a bool mask) and a float16 inference: the dtypes a warm start rebuilds from the
cache entry must be the ones a cold compile produced."""

from __future__ import annotations

import copy

import torch


class Mixed(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(6, 10)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = self.a(x)
        return h, h.argmax(-1), h > 0


def half(x: torch.Tensor) -> torch.Tensor:
    return (x * x).to(torch.float16) + 1


def run(out) -> None:
    model = Mixed().to(torch.bfloat16)
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend="neuron")
    x = torch.randn(4, 6, dtype=torch.bfloat16)
    h, idx, pos = compiled(x)
    h.float().square().sum().backward()
    want_h, want_idx, want_pos = eager(x)
    want_h.float().square().sum().backward()
    out.check("h", h, want_h, tol=0.1)
    # argmax and sign follow h, which may differ from eager by a bf16 rounding: compared with
    # the compiled h itself (eager's own argmax of it), and with cold bit for bit.
    out.check("argmax", idx, h.argmax(-1))
    out.check("positive", pos, h > 0)
    for (name, p), q in zip(model.named_parameters(), eager.parameters(), strict=True):
        out.check(f"grad.{name}", p.grad, q.grad, tol=0.25)
    x16 = torch.randn(7)
    with torch.no_grad():
        out.check("half", torch.compile(half, backend="neuron")(x16), half(x16), tol=1e-3)
