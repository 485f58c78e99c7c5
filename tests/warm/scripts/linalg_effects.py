"""Effectful ops: torch.linalg.inv, solve and cholesky trace with ``aten._linalg_check_errors``,
which AOTAutograd threads through an effect token. Inference, then training through the same
function (a recompile for grad mode)."""

from __future__ import annotations

import torch


def solve_all(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
    spd = a @ a.mT + torch.eye(a.shape[-1])
    return torch.linalg.inv(a), torch.linalg.solve(a, b), torch.linalg.cholesky(spd)


def run(out) -> None:
    a = torch.randn(5, 5) + 4 * torch.eye(5)
    b = torch.randn(5, 2)
    compiled = torch.compile(solve_all, backend="neuron", dynamic=False)
    with torch.no_grad():
        for name, got, want in zip(
            ("inv", "solve", "cholesky"), compiled(a, b), solve_all(a, b), strict=True
        ):
            out.check(f"inference.{name}", got, want, tol=1e-4)
        # What the token orders is the error check: a singular matrix must fail (or not: the
        # compiled graphs do not check today, eager raises) alike in both processes.
        out.raises("singular", lambda: compiled(torch.zeros(5, 5), b))
    for step in range(2):  # the second backward runs the loaded backward graph again
        ag, bg = a.clone().requires_grad_(), b.clone().requires_grad_()
        ae, be = a.clone().requires_grad_(), b.clone().requires_grad_()
        loss = sum(t.square().sum() for t in compiled(ag, bg))
        loss.backward()
        want = sum(t.square().sum() for t in solve_all(ae, be))
        want.backward()
        out.check(f"loss{step}", loss, want, tol=1e-3)
        out.check(f"grad{step}.a", ag.grad, ae.grad, tol=1e-3)
        out.check(f"grad{step}.b", bg.grad, be.grad, tol=1e-3)
