"""Train a small MLP with ``torch.compile(backend="neuron")`` and compare every loss with eager.

Run: ``python examples/train_mlp.py``. On a machine without Trainium the compiled graphs run on
XLA's CPU client, so the losses must match eager PyTorch to float32 rounding.

The task is synthetic 4-class classification: labels come from a fixed random teacher network, so
the student MLP can learn it and the loss visibly falls.
"""

from __future__ import annotations

import copy
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    """Linear -> ReLU -> Linear -> GELU -> Dropout -> Linear -> SiLU -> Linear.

    ``dropout`` defaults to 0 here because the example compares eager and compiled losses step by
    step: compiled dropout draws its masks from a different generator than eager (reproducible
    under ``torch.manual_seed``, but not bit-identical to eager), so with p>0 the curves would
    differ by design.
    """

    def __init__(
        self, d_in: int = 32, hidden: int = 64, d_out: int = 4, dropout: float = 0.0
    ) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, d_out)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.fc1(x))
        x = self.drop(F.gelu(self.fc2(x)))
        x = F.silu(self.fc3(x))
        return self.head(x)


def make_data(
    n_batches: int, batch: int = 32, d_in: int = 32, n_classes: int = 4, seed: int = 0
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Inputs with labels from a fixed random teacher (a learnable task)."""
    g = torch.Generator().manual_seed(seed)
    teacher = torch.randn(d_in, n_classes, generator=g)
    batches = []
    for _ in range(n_batches):
        x = torch.randn(batch, d_in, generator=g)
        batches.append((x, (x @ teacher).argmax(dim=1)))
    return batches


def train(
    model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], *, backend: str | None
) -> list[float]:
    """AdamW steps over ``batches``; ``backend=None`` trains eagerly. Returns the losses."""
    step_model = torch.compile(model, backend=backend) if backend else model
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(step_model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main(steps: int = 200, every: int = 20) -> None:
    torch.manual_seed(0)
    # NOTE: dropout stays at p=0 so the eager and compiled loss curves can be compared exactly.
    model = MLP(dropout=0.0)
    batches = make_data(steps)

    t0 = time.perf_counter()
    eager = train(copy.deepcopy(model), batches, backend=None)
    t1 = time.perf_counter()
    compiled = train(copy.deepcopy(model), batches, backend="neuron")
    t2 = time.perf_counter()

    print(f"{'step':>5}  {'eager':>10}  {'neuron':>10}  {'rel diff':>9}")
    for i in range(0, steps, every):
        rel = abs(eager[i] - compiled[i]) / max(abs(eager[i]), 1e-12)
        print(f"{i:>5}  {eager[i]:>10.6f}  {compiled[i]:>10.6f}  {rel:>9.1e}")
    rel_last = abs(eager[-1] - compiled[-1]) / max(abs(eager[-1]), 1e-12)
    print(f"{steps - 1:>5}  {eager[-1]:>10.6f}  {compiled[-1]:>10.6f}  {rel_last:>9.1e}")
    print(f"eager {t1 - t0:.2f} s, neuron {t2 - t1:.2f} s (includes compilation)")

    torch.testing.assert_close(torch.tensor(compiled), torch.tensor(eager), rtol=1e-4, atol=1e-5)
    assert eager[-1] < 0.5 * eager[0], "the MLP did not learn the task"
    print("OK: compiled losses match eager")


if __name__ == "__main__":
    main()
