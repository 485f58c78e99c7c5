"""Graph passes on ATen FX graphs, run before lowering. The whole order is visible here."""

from __future__ import annotations

from .base import GraphPass, run_pipeline
from .collapse_casts import collapse_casts
from .eliminate_common_subexpressions import eliminate_common_subexpressions
from .eliminate_dead_code import eliminate_dead_code
from .fold_constants import fold_constants
from .fold_permutes import fold_permutes
from .functionalize_inplace import functionalize_inplace
from .rebase_strided_views import rebase_strided_views
from .remove_noops import remove_noops
from .sink_transposes import sink_transposes

PIPELINE: tuple[GraphPass, ...] = (
    # First, while every meta["val"] still has eager's storage sharing, strides and offsets: it
    # makes as_strided(_scatter) address a flat copy of eager's storage (the passes below drop
    # views and copies, which changes what "the storage" of a view chain would be).
    rebase_strided_views,
    # Before everything: remove_noops and CSE keep every copy/duplicate near a mutation, so each
    # in-place op rewritten away unlocks them.
    functionalize_inplace,
    # Functionalization leaves alias/clone chains and same-dtype casts; removing them shrinks
    # what later passes and the lowering see, and exposes permute pairs and duplicates hidden
    # behind an alias.
    remove_noops,
    # After remove_noops (which owns lone same-dtype casts) and before CSE: a collapsed chain
    # reads the original tensor, so equal casts of it written through different chains merge.
    collapse_casts,
    # Before CSE: two transposes of the same tensor written differently (transpose(transpose(x))
    # vs permute(x)) only become identical expressions once each chain is one permute.
    fold_permutes,
    # Merge duplicates (AOTAutograd's backward recomputes views and transposes of saved values).
    eliminate_common_subexpressions,
    # After CSE: equal constant subgraphs are merged first and fold into one buffer, not two
    # get_attrs CSE could no longer merge.
    fold_constants,
    # Late: it introduces neuron_compile.dot_general, which the ATen-only passes above do not
    # understand; after fold_permutes/CSE so each operand is at most one (shared) permute.
    sink_transposes,
    # Last: every pass above can orphan nodes (folded inner permutes, merged duplicates' inputs,
    # permutes sunk into dot_general).
    eliminate_dead_code,
)


def pipeline_for(target_name: str) -> tuple[GraphPass, ...]:
    """The passes run before lowering for the target named ``target_name``: the core pipeline
    with the target's own passes placed in it (``Target.pipeline``)."""
    from ..targets import get_target

    return get_target(target_name).pipeline(PIPELINE)


__all__ = [
    "PIPELINE",
    "GraphPass",
    "collapse_casts",
    "eliminate_common_subexpressions",
    "eliminate_dead_code",
    "fold_constants",
    "fold_permutes",
    "functionalize_inplace",
    "pipeline_for",
    "rebase_strided_views",
    "remove_noops",
    "run_pipeline",
    "sink_transposes",
]
