"""On-disk tier of the compilation cache: crash-safe, concurrency-safe, bounded, shareable.

Layout under the cache root (``$NEURON_COMPILE_CACHE_DIR`` or ``~/.cache/neuron-compile``)::

    entries/<key[:2]>/<key>/   artifacts + last_access + manifest.json (see manifest.py)
    tmp/                       private staging dirs; a publish is one rename out of here
    quarantine/                corrupt entries, moved aside for inspection, never served
    failures/<key>.json        negative entries: a compile that failed, with its fingerprint
    locks/<key>.lock           per-key compile locks (lock.py); locks/evict.lock for eviction

Concurrency: one process compiles a key while others wait on its lock and then read. Readers hold
a shared ``flock`` on the entry's manifest while they read; eviction, prune and quarantine take it
exclusively without blocking and *rename* the entry away before deleting it, so an entry is never
deleted under a reader (a busy entry is simply skipped).

Robustness: a cache problem never crashes a caller that could run uncached. I/O errors become one
warning per ``DiskCache`` and a miss; only strict-mode misses (``CacheMissError``) and cached
compile failures (``CachedCompileFailure``) raise. This module is pure stdlib + filelock (no
torch, no jax) so fault tests can run it in cheap processes; error classes load lazily.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import secrets
import shutil
import socket
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from . import settings
from .binding import self_keyed
from .failures import FailureRecords
from .lock import KeyLock, LockTimeout
from .maintenance import (
    SUBDIRS,
    Maintenance,
    _errors,
    describe_diff,
    ensure_dir,
    subtree_reason,
    unsafe_reason,
)
from .manifest import (
    ACCESS,
    KEY_RE,
    MANIFEST,
    Entry,
    ManifestError,
    SchemaError,
    build_manifest,
    check_key,
    entry_path,
    foreign_reason,
    is_local_only,
    parse_manifest,
    read_entry,
    read_fd,
    read_nofollow,
    same_file,
    tree_size,
    write_entry,
)
from .signing import Signer

__all__ = ["DEFAULT_MAX_BYTES", "DiskCache", "Entry", "default_root", "describe_diff"]
DEFAULT_MAX_BYTES = settings.DEFAULT_MAX_BYTES
DEFAULT_FAILURE_TTL = settings.DEFAULT_FAILURE_TTL
ENV_ALLOW_SHARED = settings.ENV_ALLOW_SHARED
ENV_VARS = settings.ENV_VARS
default_root = settings.default_root

log = logging.getLogger(__name__)


class DiskCache(Maintenance, FailureRecords):
    """Local disk cache with an optional read-through remote tier (see the module docstring)."""

    def __init__(
        self,
        root: Path,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        remote: Path | None = None,
        allow_shared_writable: bool = False,
        lock_timeout: float = 600.0,
        failure_ttl: float = DEFAULT_FAILURE_TTL,
        retry_failed: bool = False,
        cache_only: bool = False,
        create: bool = True,  # False: open an existing cache to read; create nothing
        signer: Signer | None = None,  # a team key: sign writes, check the tiers it covers
    ) -> None:
        try:
            self.root = settings.expand_path(str(root))
            self.remote = settings.expand_path(str(remote)) if remote else None
        except ValueError as exc:
            raise _errors().OptionsError(
                f"cache directory {root if remote is None else remote}: {exc}",
                hint="give a directory path; '~name' needs an existing user name",
            ) from None
        self.max_bytes = int(max_bytes)
        self.allow_shared_writable = allow_shared_writable
        self.lock_timeout = lock_timeout
        self.failure_ttl = failure_ttl
        self.retry_failed = retry_failed
        self.cache_only = cache_only
        self._warned = False
        # Eviction walks the whole cache; doing that on every put made each compile O(entries).
        # The size ledger every writer shares (ledger.py) decides when to walk, and a walk at
        # least every RESCAN_SECONDS catches what it cannot see (entries deleted by hand).
        self._last_scan = 0.0
        self._counts: dict[str, float] = dict.fromkeys(
            ("disk_hits", "disk_misses", "remote_hits", "remote_misses", "bytes_read",
             "bytes_written", "compile_seconds_saved", "compiles", "compile_seconds",
             "failures_recorded", "cached_failures_raised", "quarantined", "evicted"),
            0,
        )  # fmt: skip
        self.signer = signer
        self.enabled, self.writable = self._prepare_root(create)
        self.remote_enabled = self.remote is not None and self._check_remote(self.remote)

    @classmethod
    def from_env(cls, *, create: bool = True) -> DiskCache | None:
        """The cache configured by ``NEURON_COMPILE_CACHE_*`` env vars (parsed by settings.py,
        which warns about bad values); None when disabled. ``create=False``: see ``__init__``."""
        s = settings.from_environ()
        if s is None:
            return None
        return cls(
            s.root,
            max_bytes=s.max_bytes,
            remote=s.remote,
            allow_shared_writable=s.allow_shared_writable,
            failure_ttl=s.failure_ttl,
            retry_failed=s.retry_failed,
            cache_only=s.cache_only,
            signer=s.signer,
            create=create,
        )

    # -- setup and warnings ---------------------------------------------------------------------

    def _warn(self, message: str) -> None:
        """One warning per instance: a training loop must not drown in repeated cache noise."""
        if self._warned:
            log.debug("%s", message)
        else:
            self._warned = True
            log.warning("%s", message)

    def _prepare_root(self, create: bool = True) -> tuple[bool, bool]:
        """``(enabled, writable)``: unsafe roots are not used at all, read-only ones only read.
        ``create=False`` (read-only commands) makes nothing: a missing root is an empty cache."""
        try:
            if create:
                self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            elif not self.root.is_dir():
                return False, False
        except OSError:
            pass  # reported below as unusable or read-only
        why = unsafe_reason(self.root, allow_shared=self.allow_shared_writable)
        if why is None:
            why = subtree_reason(self.root, allow_shared=self.allow_shared_writable)
        if why is None and self._signer_refuses("local"):
            why = self.signer.problem  # type: ignore[union-attr]
        if why is not None:
            self._warn(
                f"[NC404] not using compilation cache {self.root}: {why}; running uncached "
                f"(fix the directory, or set {ENV_ALLOW_SHARED}=1 if sharing it is intended)"
            )
            return False, False
        try:
            for d in SUBDIRS if create else ():
                ensure_dir(self.root / d)
        except OSError as exc:
            self._warn(f"compilation cache {self.root} is not writable ({exc}); compiling uncached")
            return True, False
        return True, create

    def _check_remote(self, remote: Path) -> bool:
        why = unsafe_reason(remote, allow_shared=self.allow_shared_writable)
        if why is None:
            why = subtree_reason(remote, allow_shared=self.allow_shared_writable)
        if why is None and self._signer_refuses("remote"):
            why = self.signer.problem  # type: ignore[union-attr]
        if why is not None:
            self._warn(f"[NC404] not using remote cache {remote}: {why}")
            return False
        return True

    def _signer_refuses(self, tier: str) -> bool:
        """Whether ``tier`` is covered by a team key that cannot be used: fail closed."""
        return self.signer is not None and self.signer.covers(tier) and bool(self.signer.problem)

    def signature_problem(self, tier: str, manifest: dict[str, Any]) -> str | None:
        """Why an entry of ``tier`` ("local", "remote", "import") is refused by the team key."""
        if self.signer is None or not self.signer.covers(tier):
            return None
        return self.signer.refusal(manifest)

    def trusts_self_keyed(self, tier: str) -> bool:
        """Whether ``tier`` may serve entries that bind only to themselves (``self_keyed``):
        when the team key covers it, or when only you can write it (the ownership checks ran:
        no ``ALLOW_SHARED``, and it is not an import)."""
        if self.signer is not None and self.signer.covers(tier) and not self.signer.problem:
            return True
        return tier != "import" and not self.allow_shared_writable

    # -- reading --------------------------------------------------------------------------------

    def get(self, key: str, *, count: bool = True) -> Entry | None:
        """A verified entry from the local tier, else the remote tier (copied into local).
        ``count=False``: a lookup that is not a compile (an index probe) leaves the hit/miss
        counters alone."""
        return self._lookup(key, count_miss=count, count_hit=count)[0]

    @contextlib.contextmanager
    def hold(self, key: str) -> Iterator[Entry | None]:
        """``get(key)``, and keep the entry from being evicted or pruned until the block exits.

        For callers that use the entry's files by path (a runtime mapping a NEFF) rather than the
        bytes ``get`` returns. Holds a shared ``flock`` on the entry's manifest.
        """
        entry = self.get(key)
        fd = None
        if entry is not None:
            try:
                fd = os.open(entry.path / MANIFEST, os.O_RDONLY | os.O_NOFOLLOW)
                fcntl.flock(fd, fcntl.LOCK_SH)
                if not same_file(fd, entry.path / MANIFEST):  # removed between get and lock
                    entry = None
            except OSError:
                entry = None
        try:
            yield entry
        finally:
            if fd is not None:
                os.close(fd)

    def _lookup(
        self, key: str, *, count_miss: bool = True, count_hit: bool = True
    ) -> tuple[Entry | None, str]:
        check_key(key)
        if not self.enabled:
            return None, "uncached"
        entry = self._load(self.root, key, local=True)
        if entry is not None:
            if count_hit:
                self._count_hit("disk", entry)
            return entry, "disk"
        self._counts["disk_misses"] += count_miss
        if not self.remote_enabled:
            return None, "disk"
        assert self.remote is not None
        entry = self._load(self.remote, key, local=False)
        if entry is not None and is_local_only(entry.manifest):
            # Host-specific native code (an XLA executable) is only ever loaded from entries this
            # machine wrote: loading one runs it. promote() never puts one in the remote tier.
            log.warning("remote cache entry %s claims to be local-only; ignored", key[:12])
            entry = None
        if entry is None:
            self._counts["remote_misses"] += count_miss
            return None, "remote"
        if count_hit:
            self._count_hit("remote", entry)
        if self.writable:
            try:
                path = self._publish(self.root, key, entry.manifest, entry.files())
                entry = Entry(key, path, entry.manifest, entry._data)
                self._evict_if_needed(tree_size(path), protect=key)
            except OSError as exc:
                self._warn(f"cannot copy remote cache entry {key[:12]} to {self.root}: {exc}")
        return entry, "remote"

    def _count_hit(self, tier: str, entry: Entry) -> None:
        self._counts[f"{tier}_hits"] += 1
        self._counts["bytes_read"] += entry.size
        self._counts["compile_seconds_saved"] += float(entry.manifest.get("compile_seconds", 0.0))

    def _load(self, base: Path, key: str, *, local: bool) -> Entry | None:
        path = entry_path(base, key)
        try:
            fd = os.open(path / MANIFEST, os.O_RDONLY | os.O_NOFOLLOW)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                self._quarantine(base, key, path, None, "manifest.json is a symlink")
            else:
                self._warn(f"cache read failed for {key[:12]}: {type(exc).__name__}: {exc}")
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)  # eviction takes LOCK_EX: it cannot delete under us
            if not same_file(fd, path / MANIFEST):
                return None  # evicted or quarantined while we waited for the lock
            shard = os.lstat(path.parent)
            if stat.S_ISLNK(shard.st_mode):
                raise ManifestError(f"{path.parent} is a symlink")
            owned = not self.allow_shared_writable
            if owned and (why := foreign_reason(shard)) is not None:
                raise ManifestError(f"its shard directory is {why}")
            manifest, files = read_entry(path, read_fd(fd), key, owned=owned)
            tier = "local" if base == self.root else "remote"
            why = self.signature_problem(tier, manifest)
            if why is not None:
                raise ManifestError(f"signature: {why}")
            if self_keyed(manifest) and not self.trusts_self_keyed(tier):
                log.debug("FX index entry %s of a tier others write, unsigned: lowering", key[:12])
                return None
        except SchemaError as exc:
            log.info("cache entry %s skipped: %s", key[:12], exc)
            return None
        except ManifestError as exc:
            self._quarantine(base, key, path, fd, str(exc))
            return None
        except OSError as exc:
            self._warn(f"cache read failed for {key[:12]}: {type(exc).__name__}: {exc}")
            return None
        finally:
            os.close(fd)
        if local:
            try:
                os.utime(path / ACCESS, follow_symlinks=False)
            except OSError:
                pass  # a read-only cache still serves hits; LRU order just stops updating
        return Entry(key, path, manifest, files)

    def quarantine(self, key: str, why: str) -> None:
        """Move this cache's own entry ``key`` aside: a caller found it does not bind."""
        self._quarantine(self.root, key, entry_path(self.root, key), None, why)

    def _quarantine(self, base: Path, key: str, path: Path, fd: int | None, why: str) -> None:
        """Move a corrupt entry aside, unless another reader holds it (it will do the same).
        A corrupt remote entry is only refused (a miss): readers never write to the shared tier."""
        if base != self.root:
            self._warn(f"corrupt remote cache entry {key[:12]} ({why}) ignored, left in {base}")
            return
        own = None
        try:
            if fd is None:
                try:
                    fd = own = os.open(path / MANIFEST, os.O_RDONLY | os.O_NOFOLLOW)
                except OSError:
                    pass  # no manifest, or it is a symlink: nothing a reader could hold
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if not same_file(fd, path / MANIFEST):
                    return
            dest = base / "quarantine" / f"{key}.{int(time.time())}.{secrets.token_hex(3)}"
            os.rename(path, ensure_dir(dest.parent) / dest.name)  # never into a symlink's target
        except BlockingIOError:
            log.info("corrupt cache entry %s (%s) is in use; left for its reader", key[:12], why)
            return
        except OSError as exc:
            log.warning("corrupt cache entry %s (%s) could not be quarantined: %s", key, why, exc)
            return
        finally:
            if own is not None:
                os.close(own)
        self._counts["quarantined"] += 1
        log.warning("corrupt cache entry %s (%s) moved to %s", key[:12], why, dest)

    # -- writing --------------------------------------------------------------------------------

    def put(
        self,
        key: str,
        files: dict[str, bytes],
        *,
        graph_name: str,
        components: dict[str, str],
        compile_seconds: float = 0.0,
        meta: dict | None = None,
    ) -> Entry | None:
        """Publish an entry atomically, then evict down to ``max_bytes``. None if not stored."""
        manifest = build_manifest(
            key,
            files,
            graph_name=graph_name,
            components=components,
            compile_seconds=compile_seconds,
            meta=meta,
            signer=self.signer,
        )
        if not (self.enabled and self.writable):
            return None
        size = sum(len(d) for d in files.values())
        if size > self.max_bytes:
            log.info("not caching %s: %d bytes exceed max_bytes=%d", key[:12], size, self.max_bytes)
            return None
        try:
            path = self._publish(self.root, key, manifest, files)
        except OSError as exc:
            self._warn(
                f"cannot write compilation cache entry {key[:12]} to {self.root}: "
                f"{type(exc).__name__}: {exc}; continuing uncached"
            )
            return None
        self._counts["bytes_written"] += size
        self._evict_if_needed(tree_size(path), protect=key)  # what a walk counts
        return Entry(key, path, manifest, dict(files))

    def _publish(
        self, base: Path, key: str, manifest: dict[str, Any], files: dict[str, bytes]
    ) -> Path:
        """Stage in ``tmp/``, fsync, rename into place. Raises OSError; never leaves a partial."""
        tmp = base / "tmp" / f"w-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(6)}"
        dest = entry_path(base, key)
        try:
            ensure_dir(tmp.parent)
            tmp.mkdir(mode=0o755)
            write_entry(tmp, manifest, files)
            ensure_dir(ensure_dir(dest.parent.parent, 0o755) / dest.parent.name, 0o755)
            try:
                os.rename(tmp, dest)
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
                # Someone published this key first; keep theirs if it is whole, else replace it.
                if self._load(base, key, local=False) is not None:
                    return dest
                self._remove(base, key, dest)
                os.rename(tmp, dest)
            fd = os.open(dest.parent, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            self._mark_name(base, str(manifest.get("graph_name", "")), key)
            return dest
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    @staticmethod
    def _name_dir(base: Path, graph_name: str) -> Path:
        return base / "names" / hashlib.sha256(graph_name.encode()).hexdigest()[:16]

    def _mark_name(self, base: Path, graph_name: str, key: str) -> None:
        """An empty ``names/<graph>/<key>`` marker: miss explanations read only the entries of
        one graph instead of every manifest in the cache. Best effort (a hint, not data)."""
        try:
            d = self._name_dir(base, graph_name)
            ensure_dir(ensure_dir(d.parent, 0o755) / d.name, 0o755)  # a hint: never via a link
            os.close(os.open(d / key, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644))
        except OSError:
            pass

    def get_or_create(
        self,
        key: str,
        create: Callable[[], dict[str, bytes]],
        *,
        graph_name: str,
        components: dict[str, str],
    ) -> tuple[dict[str, bytes], str]:
        """``(files, source)``, source in {"disk", "remote", "compiled", "uncached"}.

        One process per key runs ``create``; others wait for its lock and then read the entry.
        A failure of ``create`` is recorded and re-raised; later calls raise
        ``CachedCompileFailure`` until the failure TTL expires. In strict mode a miss raises
        ``CacheMissError`` instead of compiling.
        """
        entry, source = self._lookup(key)
        if entry is not None:
            return entry.files(), source
        self._raise_if_failed(key)
        if self.cache_only:
            self._raise_miss(key, graph_name, components)
        if not (self.enabled and self.writable):
            return self._compile(key, create, graph_name, components, record=False)[0], "uncached"
        lock = KeyLock(self.root / "locks" / f"{key}.lock", timeout=self.lock_timeout)
        try:
            ensure_dir(lock.path.parent)  # a locks/ symlinked after open: never create through it
            lock.acquire()
        except (LockTimeout, OSError) as exc:
            self._warn(f"cannot lock cache key {key[:12]} ({exc}); compiling uncached")
            return self._compile(key, create, graph_name, components, record=False)[0], "uncached"
        try:
            # Compiled by the previous holder while we waited? (The miss is already counted.)
            entry, source = self._lookup(key, count_miss=False)
            if entry is not None:
                return entry.files(), source
            self._raise_if_failed(key)
            files, seconds = self._compile(key, create, graph_name, components, record=True)
            stored = self.put(
                key, files, graph_name=graph_name, components=components, compile_seconds=seconds
            )
            if stored is not None:
                self._clear_failure(key)
            return files, "compiled" if stored is not None else "uncached"
        finally:
            lock.release()

    def _compile(
        self,
        key: str,
        create: Callable[[], dict[str, bytes]],
        graph_name: str,
        components: dict[str, str],
        *,
        record: bool,
    ) -> tuple[dict[str, bytes], float]:
        start = time.perf_counter()
        try:
            files = create()
        except Exception as exc:
            if record:
                self._record_failure(key, graph_name, components, exc, time.perf_counter() - start)
            raise
        seconds = time.perf_counter() - start
        self._counts["compiles"] += 1
        self._counts["compile_seconds"] += seconds
        return files, seconds

    # -- strict mode ----------------------------------------------------------------------------

    def _raise_miss(self, key: str, graph_name: str, components: dict[str, str]) -> None:
        raise _errors().CacheMissError.for_key(
            key,
            graph_name=graph_name,
            components=components,
            explanation=self.explain_miss(graph_name, components) if self.enabled else [],
            root=str(self.root),
        )

    def explain_miss(self, graph_name: str, components: dict[str, str]) -> list[str]:
        """Which components differ from the nearest entries of ``graph_name`` ("a: 1 → 2")."""
        best: list[str] | None = None
        bases = [self.root] + ([self.remote] if self.remote_enabled and self.remote else [])
        for base in bases:
            try:
                keys = [m.name for m in os.scandir(self._name_dir(base, graph_name))]
            except OSError:
                continue
            for key in keys:
                if not KEY_RE.match(key):
                    continue
                try:
                    manifest = parse_manifest(read_nofollow(entry_path(base, key) / MANIFEST), key)
                except (OSError, ManifestError):
                    continue  # evicted since: the marker is stale
                if manifest.get("graph_name") != graph_name:
                    continue
                lines = describe_diff(manifest.get("components", {}), components)
                if best is None or len(lines) < len(best):
                    best = lines
        if best is None:
            return []
        return best or ["all components equal the nearest entry (the key derivation changed?)"]

    def stats(self, *, scan: bool = True) -> dict[str, Any]:
        """Counters of this instance plus the current size of the local tier (``scan=False``:
        counters only, no walk over a possibly huge cache directory)."""
        sizes: dict[str, int] = {}
        if scan:
            entries = list(self._entry_dirs()) if self.enabled else []
            sizes = {"entries": len(entries), "total_bytes": sum(tree_size(p) for _k, p in entries)}
        return {
            **self._counts,
            **sizes,
            "max_bytes": self.max_bytes,
            "root": str(self.root),
            "remote": str(self.remote) if self.remote else None,
            "enabled": self.enabled,
        }
