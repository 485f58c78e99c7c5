"""``neuron_compile.reset()``: forget every piece of process-wide state in one call.

Each piece keeps its own, narrower reset (``reset_metrics``, ``clear_fallback_ops``,
``reset_recompiles``, ``reset_cache_stats``, ...); this calls them all, so a test, a notebook or a
benchmark can start from a clean process without knowing where the state lives. Entries on disk
(the compile cache) are kept: only what lives in this process's memory goes.
"""

from __future__ import annotations

import sys


def reset() -> None:
    """Reset all process state: graph and bucket records, recompile history and warm-up, CPU
    fallback counts, cache counters, the in-memory executable cache, traced references, memoized
    toolchain versions and source hashes, traced NKI kernel configs, and every warn-once set
    (each warning is shown again once). Compiled functions already returned keep working."""
    from .cache import key
    from .cache.memory import executable_cache
    from .cache.tiers import reset_cache_stats
    from .fallback import clear_fallback_ops
    from .lowering import reference
    from .metrics import reset_metrics
    from .shapes import reset_recompiles
    from .versions import toolchain_versions
    from .warn_once import reset_warn_once

    executable_cache.clear()  # before the counters' baseline is taken
    reset_metrics()
    reset_recompiles()
    reset_cache_stats()
    clear_fallback_ops()
    reference._TRACES.clear()
    toolchain_versions.cache_clear()
    key.package_source_hash.cache_clear()
    key.host_fingerprint.cache_clear()
    reset_warn_once()
    nki = sys.modules.get("neuron_compile.trainium.kernels.nki")
    if nki is not None:  # loaded only by kernel authors and trn targets
        nki.clear_configs()
