"""Per-key compile lock with stale-holder recovery.

``filelock`` (flock) already drops a lock when its holder dies, but not when the locked descriptor
was inherited by a forked helper that outlives the holder (a compiler worker pool, a leftover
``neuronx-cc`` child), and not on filesystems where filelock falls back to soft (existence) locks.
So the holder records who it is in a sidecar (``<lock>.owner``: pid, hostname, boot id, process
start time); a waiter that finds the holder dead breaks the lock at once instead of waiting for
the timeout. Breaking happens under a short second lock and only if the sidecar still names the
same dead acquisition, so two waiters never both break (and never break a fresh holder).

Pure stdlib + filelock: fault tests load this in cheap processes that never import torch.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import time
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

log = logging.getLogger(__name__)

# First waits are short: a hit right after someone else's compile is the common case.
_POLL_MIN = 0.02
_POLL_MAX = 0.5


class LockTimeout(TimeoutError):
    """The lock stayed held by a live process for longer than the timeout."""


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _proc_stat(pid: int) -> tuple[str, str] | None:
    """``(state, start time in clock ticks since boot)`` of ``pid``, or None if it does not exist."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    except OSError:
        return ("?", "")
    # The command name (field 2) may contain spaces and parentheses; the rest follows the last ')'.
    fields = text[text.rfind(")") + 2 :].split()
    return fields[0], fields[19]


def identity(pid: int | None = None) -> dict[str, Any]:
    """Who holds a lock: enough to tell later whether that process is still alive."""
    pid = os.getpid() if pid is None else pid
    stat = _proc_stat(pid)
    return {
        "pid": pid,
        "host": socket.gethostname(),
        "boot_id": _boot_id(),
        "start": stat[1] if stat else "",
        "token": secrets.token_hex(8),
        "since": time.time(),
    }


def holder_is_dead(owner: dict[str, Any]) -> bool:
    """True only when we can prove the recorded holder is gone; unknown (other host) is alive."""
    if owner.get("host") != socket.gethostname():
        return False  # NOTE: no liveness test across hosts; those waiters rely on flock + timeout
    boot = _boot_id()
    if boot and owner.get("boot_id") and owner["boot_id"] != boot:
        return True  # the machine rebooted since the lock was taken
    try:
        pid = int(owner["pid"])
    except (KeyError, TypeError, ValueError):
        return False
    stat = _proc_stat(pid)
    if stat is None:
        return True
    state, start = stat
    if state in ("Z", "X"):
        return True  # killed but not yet reaped by its parent
    return bool(owner.get("start")) and bool(start) and start != owner["start"]  # pid reused


class KeyLock:
    """Exclusive cross-process lock for one cache key (context manager)."""

    def __init__(self, path: Path, *, timeout: float) -> None:
        self.path = path
        self.owner_path = path.with_name(path.name + ".owner")
        self.timeout = timeout
        self._lock = FileLock(str(path))
        self._token: str | None = None

    def acquire(self) -> None:
        """Wait for the lock; break it early if its recorded holder is dead.

        Raises ``LockTimeout`` after ``timeout`` seconds and ``OSError`` if the lock file cannot
        be created (read-only cache directory).
        """
        deadline = time.monotonic() + self.timeout
        poll = _POLL_MIN
        while True:
            try:
                self._lock.acquire(timeout=0)
                break
            except Timeout:
                pass
            if self._break_if_stale():
                continue
            if time.monotonic() >= deadline:
                raise LockTimeout(f"{self.path} is held by {self._read_owner()}")
            time.sleep(poll)
            poll = min(poll * 2, _POLL_MAX)
        me = identity()
        self._token = me["token"]
        try:
            _write_json_atomic(self.owner_path, me)
        except OSError as exc:  # the lock itself still works; only stale detection degrades
            log.debug("cannot record lock owner in %s: %s", self.owner_path, exc)

    def release(self) -> None:
        if self._token is not None and self._read_owner().get("token") == self._token:
            try:
                self.owner_path.unlink()
            except OSError:
                pass
        self._token = None
        self._lock.release()

    def __enter__(self) -> KeyLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _read_owner(self) -> dict[str, Any]:
        try:
            data = json.loads(self.owner_path.read_bytes())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _break_if_stale(self) -> bool:
        owner = self._read_owner()
        if not owner or not holder_is_dead(owner):
            return False
        breaker = FileLock(str(self.path) + ".break")
        try:
            breaker.acquire(timeout=1.0)
        except Timeout:
            return False
        try:
            # Re-read under the breaker lock: another waiter may have broken it and re-acquired.
            if self._read_owner().get("token") != owner.get("token"):
                return False
            log.warning(
                "breaking stale cache lock %s held by dead process %s on %s",
                self.path,
                owner.get("pid"),
                owner.get("host"),
            )
            for p in (self.path, self.owner_path):
                try:
                    p.unlink()
                except FileNotFoundError:
                    pass
            return True
        finally:
            breaker.release()


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
