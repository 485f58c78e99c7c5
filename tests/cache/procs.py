"""Real processes for cache fault tests: fork from the test process (torch already imported, so a
child costs milliseconds, not an interpreter start) and collect a JSON result through a pipe."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import select
import signal
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from neuron_compile.cache.store import DiskCache


class Child:
    """A forked process running ``fn(*args)``; ``result()`` returns its JSON-able return value."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        read, write = os.pipe()
        with warnings.catch_warnings():
            # JAX warns that fork and threads mix badly; children only run the torch/jax-free store.
            warnings.simplefilter("ignore", RuntimeWarning)
            self.pid = os.fork()
        if self.pid == 0:  # child: never return into pytest
            os.close(read)
            try:
                out = {"ok": fn(*args)}
            except BaseException as exc:  # report everything, including SystemExit
                out = {"error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"}
            try:
                with os.fdopen(write, "w") as f:
                    json.dump(out, f, default=str)
            finally:
                os._exit(0)
        os.close(write)
        self._read = read
        self.status: int | None = None

    def result(self, timeout: float = 60.0) -> Any:
        deadline = time.monotonic() + timeout
        chunks = []
        while True:  # drain the pipe as it fills, so a large result cannot block the child
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise TimeoutError(f"child {self.pid} did not finish in {timeout}s")
            if select.select([self._read], [], [], min(left, 0.1))[0]:
                chunk = os.read(self._read, 1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
        os.close(self._read)
        self.status = os.waitpid(self.pid, 0)[1]
        text = b"".join(chunks).decode()
        out = json.loads(text) if text else {"error": f"child died with status {self.status}"}
        if "error" in out:
            raise AssertionError(f"child {self.pid} failed: {out['error']}")
        return out["ok"]

    def kill(self) -> None:
        """SIGKILL and reap (a zombie would still look alive to stale-lock detection)."""
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self.status is None:
            self.status = os.waitpid(self.pid, 0)[1]
            try:
                os.close(self._read)
            except OSError:
                pass


class WarningCounter(logging.Handler):
    """Counts WARNING+ records of the cache loggers (use in children, where caplog is absent)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []
        logging.getLogger("neuron_compile.cache").addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def key_of(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def payload(key: str, parts: int = 3, size: int = 4096) -> dict[str, bytes]:
    """Deterministic multi-file artifacts derived from the key, so readers can check content."""
    return {
        f"part{i}.bin": hashlib.shake_256(f"{key}/{i}".encode()).digest(size) for i in range(parts)
    }


def digest(files: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    return h.hexdigest()


def cache(root: Path, **kwargs: Any) -> DiskCache:
    return DiskCache(root, **kwargs)


def wait_for(path: Path, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.005)
