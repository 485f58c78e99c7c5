"""In-process LRU of compiled executables (recompiles of an identical graph reuse the executable)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from .key import CacheKey


class ExecutableCache:
    def __init__(self, capacity: int = 256) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get_or_create(self, key: CacheKey, create: Callable[[], Any]) -> tuple[Any, bool]:
        """Return ``(executable, hit)``; ``create`` runs outside the lock on a miss."""
        digest = key.digest()
        with self._lock:
            if digest in self._items:
                self._items.move_to_end(digest)
                self.hits += 1
                return self._items[digest], True
        value = create()
        with self._lock:
            self.misses += 1
            self._items[digest] = value
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)
        return value, False

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._items)


executable_cache = ExecutableCache()
