"""Cache keys built from named components, so a miss can be explained component by component."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

SCHEMA_VERSION = 1  # bump to orphan every old entry


@dataclass(frozen=True)
class CacheKey:
    parts: tuple[tuple[str, str], ...]

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.parts).encode()).hexdigest()

    def explain(self, other: CacheKey) -> list[str]:
        """Names of the components that differ between two keys (why a lookup missed)."""
        mine, theirs = dict(self.parts), dict(other.parts)
        return sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))


def artifact_key(artifact: bytes, executor: str) -> CacheKey:
    """Key of an executable: the exact artifact bytes and the executor that compiled them."""
    return CacheKey(
        (
            ("schema", str(SCHEMA_VERSION)),
            ("executor", executor),
            ("artifact", hashlib.sha256(artifact).hexdigest()),
        )
    )
