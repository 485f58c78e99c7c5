"""Random ops: dropout in training and rand_like in inference. Compiled graphs draw their seed
from torch's generator on every call, so torch.manual_seed makes cold and warm runs equal bit
for bit, while the bits differ from eager's. Eager references are rebuilt from the compiled
mask; two calls without reseeding must differ (a warm start must not freeze the seed)."""

from __future__ import annotations

import copy

import torch

P = 0.3


class Dropped(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(6, 32)
        self.drop = torch.nn.Dropout(P)
        self.b = torch.nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dropped = self.drop(self.a(x))
        return self.b(torch.relu(dropped)), dropped


def _with_mask(model: Dropped, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """The eager model with the compiled run's dropout mask."""
    dropped = torch.where(keep, model.a(x) / (1 - P), 0.0)
    return model.b(torch.relu(dropped))


def noisy(x: torch.Tensor) -> torch.Tensor:
    return x + torch.rand_like(x)


def run(out) -> None:
    model = Dropped()
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend="neuron")
    x = torch.randn(8, 6)
    masks = []
    for step in range(2):
        torch.manual_seed(100 + step)
        y, dropped = compiled(x)
        y.square().sum().backward()
        keep = dropped != 0
        masks.append(keep)
        want = _with_mask(eager, x, keep)
        want.square().sum().backward()
        out.check(f"y{step}", y, want)
        out.check(f"keep{step}", keep, keep)  # the mask itself, for cold == warm
        for (name, p), q in zip(model.named_parameters(), eager.parameters(), strict=True):
            out.check(f"grad{step}.{name}", p.grad, q.grad)
            p.grad = q.grad = None
    kept = torch.stack(masks).float().mean()
    out.check("kept_fraction_plausible", (kept - (1 - P)).abs() < 0.1, torch.tensor(True))
    out.check("masks_differ", (masks[0] != masks[1]).any(), torch.tensor(True))

    compiled_noisy = torch.compile(noisy, backend="neuron")
    z = torch.zeros(64)
    with torch.no_grad():
        torch.manual_seed(7)
        first = compiled_noisy(z)
        second = compiled_noisy(z)  # the same graph, the next seed
    out.check("rand0", first, first)
    out.check("rand1", second, second)
    in_range = ((first >= 0) & (first < 1)).all() & ((second >= 0) & (second < 1)).all()
    out.check("rand_in_range", in_range, torch.tensor(True))
    out.check("rand_calls_differ", (first != second).any(), torch.tensor(True))
