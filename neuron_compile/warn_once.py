"""Warn once per process: one helper for every "say this only the first time" in the package.

Each user keeps its own set of keys (``once_set()``), so its tests can reset or replace it;
``reset_warn_once()`` (called by ``neuron_compile.reset()``) clears every set made here.

Under torch.distributed every rank compiles the same graphs and would print the same warning N
times. ``warn`` (and so ``warn_once``) shows a warning on rank 0 only; on the other ranks of a
world of more than one rank it goes to the ``neuron_compile`` logger at INFO, prefixed with the
rank (``NEURON_COMPILE_LOG=info`` shows them). Filters such as ``-W error`` apply on rank 0.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Hashable

log = logging.getLogger("neuron_compile")
_lock = threading.Lock()
_sets: list[set] = []


def once_set() -> set:
    """A new, empty set of keys already reported; ``reset_warn_once()`` clears it."""
    seen: set = set()
    with _lock:
        _sets.append(seen)
    return seen


def first_time(seen: set, key: Hashable) -> bool:
    """True the first time ``key`` is seen in ``seen`` (and records it), False after that."""
    with _lock:
        if key in seen:
            return False
        seen.add(key)
        return True


def warn(message: str, category: type[Warning] = UserWarning, *, stacklevel: int = 1) -> None:
    """``warnings.warn(message, category)`` on rank 0 (or without torch.distributed); on the
    other ranks, an INFO log line. ``stacklevel`` is what the caller would pass to
    ``warnings.warn`` itself (1: the line calling ``warn``)."""
    from .collectives import world

    rank, size = world()
    if size > 1 and rank != 0:
        log.info("rank %d: %s: %s", rank, category.__name__, message)
        return
    warnings.warn(message, category, stacklevel=stacklevel + 1)


def warn_once(
    seen: set,
    key: Hashable,
    message: str,
    category: type[Warning] = UserWarning,
    *,
    stacklevel: int = 1,
) -> bool:
    """``warn(message, category)`` the first time ``key`` is seen in ``seen``; returns whether it
    warned (on rank 0) or logged (other ranks). ``stacklevel`` is what the caller would pass to
    ``warnings.warn`` itself (1: the line calling ``warn_once``)."""
    if not first_time(seen, key):
        return False
    warn(message, category, stacklevel=stacklevel + 1)
    return True


def reset_warn_once() -> None:
    """Forget every key of every ``once_set()``: each warning is shown again once."""
    with _lock:
        for seen in _sets:
            seen.clear()
