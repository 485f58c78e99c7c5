"""Random-graph fuzzing: chains of supported ops with random static shapes and dtypes, compiled
through lowering + XLA CPU, compared with eager PyTorch.

CI runs ``NEURON_COMPILE_FUZZ_EXAMPLES`` examples (default 200); set it higher for a long run.
Examples are derandomized so CI is deterministic; ``NEURON_COMPILE_FUZZ_RANDOM=1`` explores.
The programs live in ``graphs.py``; ``test_warm_graphs.py`` runs them through ``torch.compile`` in
a cold and a warm process.
"""

from __future__ import annotations

import os

import torch
from hypothesis import HealthCheck, given, settings

from tests.fuzz.graphs import TOL, Tensor, inputs, programs
from tests.helpers import run_lowered

EXAMPLES = int(os.environ.get("NEURON_COMPILE_FUZZ_EXAMPLES", "200"))
DERANDOMIZE = os.environ.get("NEURON_COMPILE_FUZZ_RANDOM", "") != "1"


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

    x, other = inputs(dtype, shape, seed)
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
