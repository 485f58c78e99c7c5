"""Graph passes on ATen FX graphs, run before lowering. The whole order is visible here."""

from __future__ import annotations

from .base import GraphPass, run_pipeline
from .remove_noops import remove_noops

PIPELINE: tuple[GraphPass, ...] = (
    # First: functionalization leaves alias/clone chains; removing them shrinks what later passes
    # and the lowering see, and avoids copies neuronx-cc would have to prove away.
    remove_noops,
)

__all__ = ["PIPELINE", "GraphPass", "run_pipeline", "remove_noops"]
