"""The process-wide disk cache, configured by ``NEURON_COMPILE_CACHE_*`` env vars.

Built lazily on first use and rebuilt when those variables change (tests and notebooks set them
after import), so every compile in a process shares one ``DiskCache`` and its counters.
"""

from __future__ import annotations

import os
import threading

from .store import DiskCache

_lock = threading.Lock()
_current: tuple[tuple[tuple[str, str], ...], DiskCache | None] | None = None


_PREFIXES = ("NEURON_COMPILE_CACHE", "NEURON_COMPILE_REMOTE_CACHE", "XDG_CACHE_HOME", "HOME")


def _env_snapshot() -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(_PREFIXES)))


def disk_cache() -> DiskCache | None:
    """The active disk cache, or None when ``NEURON_COMPILE_CACHE_DIR=off``."""
    global _current
    snapshot = _env_snapshot()
    with _lock:
        if _current is None or _current[0] != snapshot:
            _current = (snapshot, DiskCache.from_env())
        return _current[1]


_baseline: dict[str, float] = {}


def cache_stats() -> dict:
    """Cache counters since the last ``reset_cache_stats()``: the in-process LRU (``memory_*``)
    and the disk tiers (``disk_*``, ``remote_*``, bytes, ``compile_seconds_saved``, ...)."""
    from .memory import executable_cache

    out: dict = {
        "memory_hits": executable_cache.hits - _baseline.get("memory_hits", 0),
        "memory_misses": executable_cache.misses - _baseline.get("memory_misses", 0),
    }
    cache = disk_cache()
    if cache is None:
        out["enabled"] = False
        return out
    for name, value in cache.stats(scan=False).items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and name in _baseline:
            value -= _baseline[name]
        out[name] = value
    return out


def reset_cache_stats() -> None:
    """Start the counters of ``cache_stats()`` from zero (entries on disk are kept)."""
    from .memory import executable_cache

    cache = disk_cache()
    _baseline.clear()
    _baseline.update(memory_hits=executable_cache.hits, memory_misses=executable_cache.misses)
    if cache is not None:
        counts = cache.stats(scan=False)
        for name in ("entries", "total_bytes", "max_bytes"):  # state, not counters
            counts.pop(name, None)
        _baseline.update(
            {
                k: v
                for k, v in counts.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool)
            }
        )
