"""Random graphs for the fuzzers: chains of supported ops with random static shapes and dtypes.

``test_random_graphs.py`` runs them through lowering + XLA CPU directly; ``warm.py`` runs them
through ``torch.compile`` in a cold and a warm process. A program is plain data (``Program``), so
the warm process can replay exactly the programs the cold one drew.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

Tensor = torch.Tensor


@dataclass(frozen=True)
class Step:
    """One op of a chain: ``apply(x, other)`` where ``other`` is a second graph input."""

    name: str
    apply: Callable[[Tensor, Tensor], Tensor]
    floats_only: bool = False


def _reduce(kind: str, dim: int, keepdim: bool) -> Callable[[Tensor, Tensor], Tensor]:
    def apply(x: Tensor, _: Tensor) -> Tensor:
        if x.dim() == 0:
            return x
        d = dim % x.dim()
        if kind == "sum":
            return x.sum(d, keepdim=keepdim)
        if kind == "mean":
            return (
                x.float().mean(d, keepdim=keepdim).to(x.dtype)
                if not x.is_floating_point()
                else x.mean(d, keepdim=keepdim)
            )
        return x.amax(d, keepdim=keepdim)

    return apply


def _permute(x: Tensor, _: Tensor) -> Tensor:
    return x.permute(*reversed(range(x.dim()))) if x.dim() > 1 else x


def _flatten(x: Tensor, _: Tensor) -> Tensor:
    return x.reshape(-1)


def _slice(x: Tensor, _: Tensor) -> Tensor:
    return x[..., ::2] if x.dim() and x.shape[-1] > 1 else x


def _binary(op: Callable[[Tensor, Tensor], Tensor]) -> Callable[[Tensor, Tensor], Tensor]:
    def apply(x: Tensor, other: Tensor) -> Tensor:
        # Broadcast `other` onto x's trailing dims so every chain stays shape-valid.
        y = other.reshape(-1)[: x.shape[-1]] if x.dim() else other.reshape(-1)[0]
        if x.dim() and y.numel() < x.shape[-1]:
            y = y[:1]
        return op(x, y.to(x.dtype))

    return apply


def _inv(x: Tensor, _: Tensor) -> Tensor:
    """``linalg.inv`` of ``I + 0.1 x xᵀ`` per row (eigenvalues in [1, 1 + 0.1|x|²], so well
    conditioned for any x the chain produces), summed back to x's shape. ``linalg.inv`` checks
    for singular input with an effectful op, which AOTAutograd threads through effect tokens:
    the case that crashed warm starts (issue 15)."""
    if x.dim() == 0:
        return x
    v = x.float().clamp(-10, 10)
    eye = torch.eye(v.shape[-1], dtype=v.dtype)
    a = eye + 0.1 * v.unsqueeze(-1) * v.unsqueeze(-2)
    return torch.linalg.inv(a).sum(-1).to(x.dtype)


STEPS: list[Step] = [
    Step("tanh", lambda x, _: torch.tanh(x), floats_only=True),
    Step("sigmoid", lambda x, _: torch.sigmoid(x), floats_only=True),
    Step("exp-clamped", lambda x, _: torch.exp(x.clamp(-5, 5)), floats_only=True),
    Step("gelu", lambda x, _: torch.nn.functional.gelu(x), floats_only=True),
    Step("softmax", lambda x, _: x.softmax(-1) if x.dim() else x, floats_only=True),
    Step("relu", lambda x, _: torch.relu(x)),
    Step("abs", lambda x, _: x.abs()),
    Step("neg", lambda x, _: -x),
    Step("square", lambda x, _: x * x),
    Step("add", _binary(torch.add)),
    Step("mul", _binary(torch.mul)),
    Step("sub", _binary(torch.sub)),
    Step("maximum", _binary(torch.maximum)),
    Step("where", _binary(lambda x, y: torch.where(x > y, x, y))),
    Step("sum", _reduce("sum", -1, False)),
    Step("sum-keepdim", _reduce("sum", 0, True)),
    Step("mean", _reduce("mean", -1, True), floats_only=True),
    Step("amax", _reduce("amax", 0, False)),
    Step("permute", _permute),
    Step("flatten", _flatten),
    Step("slice", _slice),
    Step("unsqueeze", lambda x, _: x.unsqueeze(0)),
]
#: Steps only the torch.compile fuzzer draws: their graphs differ from an ATen trace in how
#: AOTAutograd wraps them (effect tokens), which ``run_lowered`` never exercises.
COMPILE_STEPS: list[Step] = [*STEPS, Step("linalg-inv", _inv, floats_only=True)]
DTYPES = [torch.float32, torch.bfloat16, torch.int32]
TOL = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (3e-2, 3e-2)}


@st.composite
def programs(
    draw: st.DrawFn, steps: list[Step] = STEPS
) -> tuple[torch.dtype, tuple[int, ...], list[Step], int]:
    """``(dtype, shape, steps, seed)`` of one random chain."""
    dtype = draw(st.sampled_from(DTYPES))
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)))
    usable = [s for s in steps if dtype.is_floating_point or not s.floats_only]
    chosen = draw(st.lists(st.sampled_from(usable), min_size=1, max_size=6))
    seed = draw(st.integers(0, 2**16))
    return dtype, shape, chosen, seed


def inputs(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> tuple[Tensor, Tensor]:
    """The chain's two graph inputs: ``x`` of ``shape`` and ``other`` of its last dim."""
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype), torch.randn(shape[-1:], generator=g).to(
            dtype
        )
    return (
        torch.randint(-4, 5, shape, generator=g, dtype=dtype),
        torch.randint(-4, 5, shape[-1:], generator=g, dtype=dtype),
    )


def chain_of(steps: list[Step]) -> Callable[[Tensor, Tensor], Tensor]:
    """The program's function: ``steps`` applied in order to ``x``, each with ``other``."""

    def chain(x: Tensor, other: Tensor) -> Tensor:
        for step in steps:
            x = step.apply(x, other)
        return x

    return chain
