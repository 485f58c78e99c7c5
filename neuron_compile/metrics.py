"""Per-graph compile metrics (``neuron_compile.metrics()``), per-bucket runtime metrics
(``neuron_compile.bucket_metrics()``), and ``reset_metrics()`` clearing both. Graph records come
from the ``GraphCompiled`` compile event (events.py)."""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass, field

from . import events

_lock = threading.Lock()
_RECORDS: list[GraphRecord] = []
_BUCKETS: dict[tuple[str, int], BucketRecord] = {}


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
    executor_compile_s: float = 0.0  # XLA compile, or loading a cached executable
    backend_s: float = 0.0  # graph handed to our compiler -> runnable callable, everything included
    executor_cache_hit: bool = False  # the executable came from the in-process LRU
    #: Wall time of the graph's first execution (summed over its regions), one-time work of the
    #: executor's included: the rest of a cold first call is tracing and ``backend_s``.
    first_run_s: float = 0.0
    #: Where the artifact came from: ``memory``, ``disk``, ``remote``, ``compiled`` (a miss, now
    #: stored), ``uncached`` (a miss the cache could not store) or ``off`` (cache disabled).
    cache_source: str = ""
    cache_key: str = ""
    cache_miss: list[str] = field(default_factory=list)  # why the disk lookup missed
    #: Why PyTorch's AOTAutogradCache entry for this graph's frame was refused at load (it could
    #: not be called as it was compiled, aot_cache.Convention), so the frame was traced again.
    aot_cache_refused: str = ""
    calls: int = 0
    recompile: bool = False  # a new static specialization of an already compiled frame
    downcasts: list[str] = field(default_factory=list)
    artifact_bytes: int = 0
    regions: int = 1  # compiled regions; more than one when ops fall back to the CPU
    fallback_ops: dict[str, int] = field(default_factory=dict)  # op -> nodes run eagerly
    #: StableHLO collective -> how many the compiled module runs (``all_reduce``, ...)
    collectives: dict[str, int] = field(default_factory=dict)
    #: Roofline estimate of the device time of one call (``cost_model.estimate_module`` on the
    #: lowered StableHLO, summed over regions) on ``est_target``; None when the ``estimate``
    #: option is off or the estimate failed.
    est_device_s: float | None = None
    est_target: str = ""
    #: torch.distributed rank of the process that compiled the graph (0 without a process
    #: group); set when the record is published (``GraphCompiled``).
    rank: int = 0

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


def _on_graph_compiled(event: events.GraphCompiled) -> None:
    from .collectives import world

    event.record.rank = world()[0]
    add_record(event.record)


events.subscribe(_on_graph_compiled, events.GraphCompiled)


class Metrics(list):
    """``list[GraphRecord]`` plus ``cache``: the compilation cache's counters (hits and misses
    per tier, bytes read and written, compile seconds saved) over the same period."""

    cache: dict


def metrics() -> Metrics:
    """Records of every graph compiled since the last ``reset_metrics()``, oldest first, with
    the cache counters of that period in ``.cache``."""
    from .cache.tiers import cache_stats

    with _lock:
        out = Metrics(_RECORDS)
    out.cache = cache_stats()
    return out


@dataclass
class BucketRecord:
    """Runtime use of one bucket by one bucketing source (a ``BucketedModule`` or a
    ``bucketed_collate``), accumulated since the last ``reset_metrics()``.

    ``hits`` counts calls (``BucketedModule``) or batches (``bucketed_collate``) padded to this
    bucket; ``real_tokens`` counts the elements of the unpadded inputs (rows x real length, per
    sample for a collate) and ``padded_tokens`` those of the padded inputs (rows x bucket, including
    rows added by batch bucketing), so padding is ``padded_tokens - real_tokens``.
    """

    source: str  # the ``name`` given to BucketedModule / bucketed_collate (or their default)
    bucket: int  # the sequence bucket (padded length)
    hits: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0

    @property
    def padding_fraction(self) -> float:
        """Share of the padded inputs that is padding: ``1 - real_tokens / padded_tokens``."""
        return 1 - self.real_tokens / self.padded_tokens if self.padded_tokens else 0.0

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["padding_fraction"] = self.padding_fraction
        return d


def record_bucket_hit(source: str, bucket: int, real_tokens: int, padded_tokens: int) -> None:
    """Count one call or batch of ``source`` padded to ``bucket`` (``neuron_compile.bucketing``)."""
    if not 0 <= real_tokens <= padded_tokens:
        raise ValueError(
            f"need 0 <= real_tokens <= padded_tokens, got {real_tokens}, {padded_tokens}"
        )
    with _lock:
        rec = _BUCKETS.get((source, bucket))
        if rec is None:
            rec = _BUCKETS[(source, bucket)] = BucketRecord(source, bucket)
        rec.hits += 1
        rec.real_tokens += real_tokens
        rec.padded_tokens += padded_tokens


def bucket_metrics() -> list[BucketRecord]:
    """Per-bucket hits and padding since the last ``reset_metrics()``, sorted by (source, bucket).

    Snapshots: later hits do not change records already returned.
    """
    with _lock:
        return [dataclasses.replace(_BUCKETS[k]) for k in sorted(_BUCKETS)]


def reset_metrics() -> None:
    """Clear graph records, bucket records, eager frames (``eager_frames()``), recompile counts
    and events and the cache counters; warm-up (strict mode) starts again, and per-run warnings
    (the 64-bit policy's, once per model) are said again."""
    from .cache.tiers import reset_cache_stats
    from .frames import reset_eager_frames
    from .shapes import reset_recompiles
    from .warn_once import reset_run_once

    with _lock:
        _RECORDS.clear()
        _BUCKETS.clear()
    reset_eager_frames()
    reset_recompiles()
    reset_cache_stats()
    reset_run_once()
