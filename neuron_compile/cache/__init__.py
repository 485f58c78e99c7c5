"""Compilation caches: keys from named components (``key.CacheKey``), the in-process LRU of
executables (``memory``), the crash-safe shareable disk and remote tiers (``store``, ``tiers``)."""

from .key import CacheKey
from .memory import ExecutableCache, executable_cache

__all__ = ["CacheKey", "ExecutableCache", "executable_cache"]
