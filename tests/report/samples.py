"""Sample models with exactly one known defect each, for the report tests.

Each defect's line carries a marker comment (``# DEFECT: name``); tests find the expected line
with ``line_of(name)`` so editing this file never silently breaks them.
"""

from __future__ import annotations

import torch
import torch.nn as nn

import tests.custom_ops  # noqa: F401  (registers nctest::cpu_scan, which has no lowering)


@torch.library.custom_op("nctest_report::bad_verify", mutates_args=())
def bad_verify(x: torch.Tensor) -> torch.Tensor:
    """x + 1 eagerly; the report tests register a lowering that emits an invalid module."""
    return x + 1


@bad_verify.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def graph_break_print(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    print("sample checkpoint")  # DEFECT: print
    return y + 1


def data_dependent_branch(x: torch.Tensor) -> torch.Tensor:
    y = torch.sin(x) * 2
    if y.sum() > 0:  # DEFECT: branch
        return y * 3
    return y - 1


class ScanNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.lin(x))
        h = torch.ops.nctest.cpu_scan(h)  # DEFECT: fallback
        return torch.tanh(h) * 2 + 1


def wide_input(x: torch.Tensor) -> torch.Tensor:
    return torch.exp(x * 3) + 1  # DEFECT: downcast


def shape_sensitive(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x @ x.T) + 1  # DEFECT: recompile


def invalid_module(x: torch.Tensor) -> torch.Tensor:
    y = torch.cos(x) + 1
    return torch.ops.nctest_report.bad_verify(y) * 2  # DEFECT: verifier


def clean(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x @ x.T) + 1


def clean_factory():
    """``module:function`` target form: returns (model, example inputs)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)), (torch.randn(4, 8),)


def line_of(name: str) -> int:
    """1-based line of ``# DEFECT: name`` in this file."""
    with open(__file__, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if line.rstrip().endswith(f"# DEFECT: {name}"):
                return i
    raise KeyError(name)


@torch.library.custom_op("nctest_report::plus_one", mutates_args=())
def plus_one(x: torch.Tensor) -> torch.Tensor:
    """x + 1 eagerly; the report tests register a lowering that forgets the + 1."""
    return x + 1


@plus_one.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def wrong_numerics(x: torch.Tensor) -> torch.Tensor:
    return torch.ops.nctest_report.plus_one(x * 2) - 1  # DEFECT: mismatch


def run_clean() -> None:
    """CLI target: a clean model, compiled with the default backend (check makes it neuron)."""
    torch.compile(clean)(torch.randn(4, 8))


def run_with_break() -> None:
    """CLI target: the same model plus a graph break."""
    torch.compile(clean)(torch.randn(4, 8))
    torch.compile(graph_break_print)(torch.randn(4))


def run_crashing() -> None:
    """CLI target: fails for a reason that has nothing to do with compilation."""
    torch.compile(clean)(torch.randn(4, 8))
    raise ValueError("a bug in the user's script")
