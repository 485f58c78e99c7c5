"""Random-graph fuzzing: chains of supported ops with random static shapes and dtypes, compiled
through lowering + XLA CPU, compared with eager PyTorch.

CI runs ``NEURON_COMPILE_FUZZ_EXAMPLES`` examples (default 200); set it higher for a long run.
Examples are derandomized so CI is deterministic; ``NEURON_COMPILE_FUZZ_RANDOM=1`` explores.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import run_lowered

EXAMPLES = int(os.environ.get("NEURON_COMPILE_FUZZ_EXAMPLES", "200"))
DERANDOMIZE = os.environ.get("NEURON_COMPILE_FUZZ_RANDOM", "") != "1"

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
DTYPES = [torch.float32, torch.bfloat16, torch.int32]
TOL = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (3e-2, 3e-2)}


@st.composite
def programs(draw):
    dtype = draw(st.sampled_from(DTYPES))
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)))
    usable = [s for s in STEPS if dtype.is_floating_point or not s.floats_only]
    steps = draw(st.lists(st.sampled_from(usable), min_size=1, max_size=6))
    seed = draw(st.integers(0, 2**16))
    return dtype, shape, steps, seed


def _inputs(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype), torch.randn(shape[-1:], generator=g).to(
            dtype
        )
    return (
        torch.randint(-4, 5, shape, generator=g, dtype=dtype),
        torch.randint(-4, 5, shape[-1:], generator=g, dtype=dtype),
    )


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=DERANDOMIZE,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(programs())
def test_random_chain_matches_eager(program):
    dtype, shape, steps, seed = program

    def chain(x: Tensor, other: Tensor) -> Tensor:
        for step in steps:
            x = step.apply(x, other)
        return x

    x, other = _inputs(dtype, shape, seed)
    expected = chain(x, other)
    (actual,) = run_lowered(chain, x, other)
    names = [s.name for s in steps]
    assert actual.dtype == expected.dtype, names
    assert actual.shape == expected.shape, names
    if dtype.is_floating_point:
        rtol, atol = TOL[dtype]
        torch.testing.assert_close(
            actual, expected, rtol=rtol, atol=atol, msg=lambda m: f"{names}: {m}"
        )
    else:
        assert torch.equal(actual, expected), names
