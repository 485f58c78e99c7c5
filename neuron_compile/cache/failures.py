"""Negative cache entries: a compile that failed, kept so the next attempt fails fast (NC402).

``failures/<key>.json`` records the error, its fingerprint and when it happened; it is raised as
``CachedCompileFailure`` until ``failure_ttl`` passes, ``retry_failed`` is set, or a successful
compile of the key clears it. A mixin of ``DiskCache`` (store.py); pure stdlib.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .maintenance import _errors, ensure_dir
from .manifest import check_key


class FailureRecords:
    """Methods of ``DiskCache`` that record, read and raise failed compiles."""

    root: Path
    enabled: bool
    retry_failed: bool
    failure_ttl: float
    _counts: dict[str, float]
    _warn: Callable[[str], None]

    def _failure_path(self, key: str) -> Path:
        return self.root / "failures" / f"{key}.json"

    def _record_failure(
        self, key: str, graph_name: str, components: dict[str, str], exc: Exception, secs: float
    ) -> None:
        text = str(exc)
        first = text.splitlines()[0] if text else ""
        record = {
            "schema": 1,
            "kind": "failure",
            "key": key,
            "graph_name": graph_name,
            "components": {str(k): str(v) for k, v in components.items()},
            "error_type": f"{type(exc).__module__}.{type(exc).__qualname__}",
            "message": text[:20000],
            "fingerprint": hashlib.sha256(
                f"{type(exc).__qualname__}: {first}".encode()
            ).hexdigest(),
            "created": time.time(),
            "compile_seconds": secs,
        }
        path = self._failure_path(key)
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
        try:
            ensure_dir(path.parent)  # failures/ must not be a symlink
            tmp.write_text(json.dumps(record, indent=1))
            os.replace(tmp, path)
            self._counts["failures_recorded"] += 1
        except OSError as exc2:
            self._warn(f"cannot record compile failure for {key[:12]}: {exc2}")
            tmp.unlink(missing_ok=True)

    def failure(self, key: str) -> dict[str, Any] | None:
        """The recorded failure of ``key`` (expired or not), or None."""
        try:
            record = json.loads(self._failure_path(check_key(key)).read_bytes())
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) and record.get("key") == key else None

    def _clear_failure(self, key: str) -> None:
        try:
            self._failure_path(key).unlink()
        except OSError:
            pass

    def _raise_if_failed(self, key: str) -> None:
        if not self.enabled or self.retry_failed:
            return
        record = self.failure(key)
        if record is None:
            return
        created = float(record.get("created", 0.0))
        retry_at = created + self.failure_ttl
        if time.time() >= retry_at:
            return  # TTL expired: try again (a success clears the record)
        self._counts["cached_failures_raised"] += 1
        raise _errors().CachedCompileFailure.from_record(record, retry_at=retry_at)
