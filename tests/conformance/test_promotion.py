"""Mixed-dtype samples (``promotion.py``), CI slice: the binary ops and the backward ops over a
grad and an input, with operands of different dtypes, compiled vs eager (one compile per
combination). ``python -m tests.conformance.run --promotion`` runs every combination."""

from __future__ import annotations

import pytest

from tests.conformance import promotion

#: (op, combination label) -> why it is a known wrong answer (fix it, then remove the entry)
KNOWN: dict[tuple[str, str], str] = {}


def _label(combo: tuple[promotion.Operand, promotion.Operand]) -> str:
    return f"{combo[0].label}-{combo[1].label}"


def _check(samples: list[promotion.Sample]) -> None:
    outcomes = promotion.run_samples(samples)
    known = [o for o in outcomes if (o.op, o.combo) in KNOWN]
    bad = [o for o in outcomes if o.outcome in ("mismatch", "error") and o not in known]
    assert not bad, "\n".join(f"{o.op} [{o.combo}]: {o.outcome}: {o.reason}" for o in bad)
    xpass = [(o.op, o.combo) for o in known if o.outcome not in ("mismatch", "error")]
    assert not xpass, f"fixed now: remove from KNOWN: {xpass}"
    assert any(o.outcome != "skip" for o in outcomes), "eager rejected every sample"


@pytest.mark.parametrize("combo", promotion.CI_BINARY_COMBOS, ids=_label)
def test_binary_ops_promote_like_eager(combo):
    _check(promotion.binary_samples(combo))


@pytest.mark.parametrize("combo", promotion.CI_BACKWARD_COMBOS, ids=_label)
def test_backward_ops_promote_grad_and_input_like_eager(combo):
    _check(promotion.backward_samples(combo))


def test_samples_cover_every_lowered_grad_input_backward():
    # Every op the promoting decompositions cover has samples, so a new entry gets checked.
    from neuron_compile.decompositions.promoting import GRAD_INPUT_BACKWARDS

    sampled = {op for _, op, _ in promotion.BACKWARD_OPS}
    assert not set(GRAD_INPUT_BACKWARDS) - sampled
