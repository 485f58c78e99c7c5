"""ATen -> StableHLO lowering. Importing this package registers every rule."""

from __future__ import annotations

from . import stablehlo  # noqa: F401  (registers the rules)
from .lower_graph import LoweredGraph, lower_graph
from .registry import lookup, lowering, registered_ops

__all__ = ["LoweredGraph", "lookup", "lower_graph", "lowering", "registered_ops"]
