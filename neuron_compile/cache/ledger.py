"""The local tier's size ledger: one small file every writing process updates under ``flock``.

It holds the bytes the last walk of ``entries/`` counted plus what every process has published
since. Each process used to keep its own estimate (its last walk plus its own writes) and walk
again only past ``max_bytes`` or after ``RESCAN_SECONDS``, so two processes writing at once each
saw half the growth and the tier stayed above its cap (16 % over with two writers, nothing
evicted). The ledger only decides *when* to walk; eviction still counts the files. A missing,
unreadable or tampered ledger reads as "unknown", which means "walk now", and the walk rewrites
it. Over-counting (an entry published while a walk counted it too) only walks sooner.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: The ledger's file name in the cache's ``locks/`` directory.
LEDGER = "size"


@contextmanager
def _locked(locks: Path) -> Iterator[int]:
    # 0o666 less the umask: a group-shared cache (umask 002) lets every writer count.
    fd = os.open(locks / LEDGER, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)


def _read(fd: int) -> int | None:
    try:
        value = int(os.pread(fd, 32, 0).decode("ascii"))
    except (UnicodeDecodeError, ValueError):  # empty (new), or not ours
        return None
    return value if value >= 0 else None


def _write(fd: int, value: int) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(value).encode("ascii"), 0)


def add(locks: Path, added: int) -> int | None:
    """Count ``added`` published bytes; the tier's size by the ledger, or None if unknown."""
    try:
        with _locked(locks) as fd:
            total = _read(fd)
            if total is not None:
                total += added
                _write(fd, total)
            return total
    except OSError:
        return None


def read(locks: Path) -> int | None:
    """The ledger's total (None if unknown), read before a walk so ``settle`` can keep what
    other processes add while it runs."""
    try:
        with _locked(locks) as fd:
            return _read(fd)
    except OSError:
        return None


def settle(locks: Path, walked: int, before: int | None) -> None:
    """After a walk (and its evictions) left ``walked`` bytes: the ledger becomes that plus what
    others added since it read ``before``."""
    try:
        with _locked(locks) as fd:
            now = _read(fd)
            since = now - before if now is not None and before is not None else 0
            _write(fd, walked + max(since, 0))
    except OSError:
        pass


def forget(locks: Path) -> None:
    """Drop the ledger (``clear``): the next put walks and writes it again."""
    try:
        (locks / LEDGER).unlink(missing_ok=True)
    except OSError:
        pass
