"""Graph passes on ATen FX graphs, run before lowering. The whole order is visible here."""

from __future__ import annotations

from .base import GraphPass, run_pipeline
from .eliminate_common_subexpressions import eliminate_common_subexpressions
from .eliminate_dead_code import eliminate_dead_code
from .fold_permutes import fold_permutes
from .remove_noops import remove_noops

PIPELINE: tuple[GraphPass, ...] = (
    # First: functionalization leaves alias/clone chains and same-dtype casts; removing them
    # shrinks what later passes and the lowering see, and exposes permute pairs and duplicates
    # hidden behind an alias.
    remove_noops,
    # Before CSE: two transposes of the same tensor written differently (transpose(transpose(x))
    # vs permute(x)) only become identical expressions once each chain is one permute.
    fold_permutes,
    # Merge duplicates (AOTAutograd's backward recomputes views and transposes of saved values).
    eliminate_common_subexpressions,
    # Last: every pass above can orphan nodes (folded inner permutes, merged duplicates' inputs).
    eliminate_dead_code,
)

#: Passes that only run for trn targets, after PIPELINE: they rewrite subgraphs into the custom
#: calls neuronx-cc has dedicated kernels for. The CPU target never sees those calls.
NEURON_PIPELINE: tuple[GraphPass, ...] = ()


def pipeline_for(target: str) -> tuple[GraphPass, ...]:
    """The passes run before lowering for ``target`` (``cpu``, ``trn2``, ``trn3``)."""
    return PIPELINE + NEURON_PIPELINE if target.startswith("trn") else PIPELINE


__all__ = [
    "NEURON_PIPELINE",
    "PIPELINE",
    "GraphPass",
    "eliminate_common_subexpressions",
    "eliminate_dead_code",
    "fold_permutes",
    "pipeline_for",
    "remove_noops",
    "run_pipeline",
]
