"""Compilation caches. Today: an in-process LRU of executables keyed by artifact digest.

NOTE: the crash-safe, shareable on-disk tier is issue #8; it builds on ``key.CacheKey``.
"""

from .key import CacheKey, artifact_key
from .memory import ExecutableCache, executable_cache

__all__ = ["CacheKey", "ExecutableCache", "artifact_key", "executable_cache"]
