"""Alias of ``neuron_compile.cost_model`` under the name the design spec uses."""

from __future__ import annotations

from .cost_model import (
    CUSTOM_CALL_PASSES,
    ELEMENTWISE_RATE,
    HLO_DATA_MOVEMENT,
    HLO_FREE,
    ModuleCost,
    NodeCost,
    OpCost,
    estimate,
    estimate_for_record,
    estimate_module,
    node_cost,
)

__all__ = [
    "CUSTOM_CALL_PASSES",
    "ELEMENTWISE_RATE",
    "HLO_DATA_MOVEMENT",
    "HLO_FREE",
    "ModuleCost",
    "NodeCost",
    "OpCost",
    "estimate",
    "estimate_for_record",
    "estimate_module",
    "node_cost",
]
