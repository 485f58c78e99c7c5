"""Per-graph compile metrics: ``neuron_compile.metrics()`` and ``reset_metrics()``."""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass, field

_lock = threading.Lock()
_RECORDS: list[GraphRecord] = []


@dataclass
class GraphRecord:
    """One compiled graph. Times are seconds; ``calls`` counts executions."""

    name: str  # {model}_{id}_{forward|backward|inference}_{n}
    kind: str
    node_count: int
    capture_s: float = (
        0.0  # Dynamo graph handed over -> this graph reached our compiler (AOT trace)
    )
    passes_s: float = 0.0
    lowering_s: float = 0.0
    verify_s: float = 0.0  # parse + verify + serialize
    executor_compile_s: float = 0.0
    executor_cache_hit: bool = False
    calls: int = 0
    recompile: bool = False  # a new static specialization of an already compiled frame
    downcasts: list[str] = field(default_factory=list)
    artifact_bytes: int = 0
    regions: int = 1  # compiled regions; more than one when ops fall back to the CPU
    fallback_ops: dict[str, int] = field(default_factory=dict)  # op -> nodes run eagerly

    @property
    def our_compile_s(self) -> float:
        """Time spent in neuron-compile's own work (passes + lowering + verify/serialize)."""
        return self.passes_s + self.lowering_s + self.verify_s

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["our_compile_s"] = self.our_compile_s
        return d


def add_record(record: GraphRecord) -> None:
    with _lock:
        _RECORDS.append(record)


def metrics() -> list[GraphRecord]:
    """Records of every graph compiled since the last ``reset_metrics()``, oldest first."""
    with _lock:
        return list(_RECORDS)


def reset_metrics() -> None:
    """Clear graph records, recompile counts and events; warm-up (strict mode) starts again."""
    from .shapes import reset_recompiles

    with _lock:
        _RECORDS.clear()
    reset_recompiles()
