"""Listing and maintenance of a ``DiskCache``: eviction, prune, clear, verify, promote, bundles.

A mixin so the public API stays on ``DiskCache`` while ``store.py`` keeps to the read/write path.
Every removal goes through ``_remove``: exclusive non-blocking ``flock`` on the entry's manifest
(readers hold it shared), rename out of ``entries/``, then delete, so nothing is deleted under a
reader and a crash mid-delete leaves only a grave in ``tmp/`` that the next cleanup removes.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import secrets
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from . import ledger
from .binding import artifact_problem, self_keyed
from .lock import holder_is_dead
from .manifest import (
    KEY_RE,
    MANIFEST,
    Entry,
    ManifestError,
    check_key,
    foreign_reason,
    is_local_only,
    parse_manifest,
    read_entry,
    read_nofollow,
    same_file,
    seal,
    tree_size,
)
from .signing import Signer

log = logging.getLogger(__name__)

_STALE_TMP_SECONDS = 6 * 3600.0  # staging dirs of writers on other hosts: assume dead after this
SUBDIRS = ("entries", "tmp", "quarantine", "failures", "locks", "names")


def unsafe_reason(path: Path, *, allow_shared: bool) -> str | None:
    """Why ``path`` must not be used as a cache directory, or None if it is fine."""
    try:
        st = os.stat(path)  # a symlinked *root* is fine (~/.cache on another disk); entries are not
    except OSError as exc:
        return f"cannot stat it: {exc}"
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    if allow_shared:
        return None
    why = foreign_reason(st)
    return None if why is None else f"it is {why}"


def subtree_reason(root: Path, *, allow_shared: bool) -> str | None:
    """Why the directories a cache reads under ``root`` must not be trusted, or None: each must
    be a real directory with the root's ownership rules (another user's ``entries/`` inside a
    root of ours could be filled with anything)."""
    for d in SUBDIRS:
        path = root / d
        if path.is_symlink():
            return f"{d}/ is a symlink"
        if path.exists() and (why := unsafe_reason(path, allow_shared=allow_shared)) is not None:
            return f"{d}/: {why}"
    return None


def ensure_dir(path: Path, mode: int = 0o700) -> Path:
    """Create one directory level if missing; raise ``OSError`` (ELOOP) if it is a symlink or not
    a directory. Every write under a cache root goes through this: never write through a link."""
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        pass
    if stat.S_ISDIR(os.lstat(path).st_mode):
        return path
    raise OSError(errno.ELOOP, "refusing to write through a symlink or non-directory", str(path))


def link_problems(root: Path) -> list[dict[str, str]]:
    """Symlinks where the cache keeps only real directories (subdirs, shards, entries, name
    dirs). They are never followed, so entries behind them are invisible: report them."""
    found = [d for d in SUBDIRS if (root / d).is_symlink()]
    levels = [("entries", 1), ("entries", 2), ("names", 1)]
    for top, depth in levels:
        if top in found:
            continue
        dirs = [root / top]
        for _ in range(depth - 1):
            dirs = [Path(d.path) for p in dirs for d in _scan(p) if d.is_dir(follow_symlinks=False)]
        for d in dirs:
            found += [
                f"{top}/{Path(e.path).relative_to(root / top)}" for e in _scan(d) if e.is_symlink()
            ]
    return [
        {"key": rel, "problem": "symlink under the cache root: never followed, remove it"}
        for rel in sorted(set(found))
    ]


def _scan(path: Path) -> list[os.DirEntry]:
    try:
        return list(os.scandir(path))
    except OSError:
        return []


def rmtree(path: Path) -> None:
    """Delete a tree without following symlinks; a symlink (a rejected entry) is just unlinked."""
    if path.is_symlink():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


_BINARY_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(n: int) -> str:
    """``384622729`` -> ``"366.8 MiB"``: binary units, one decimal (bytes below 1 KiB). The one
    formatter every size the CLI prints goes through; ``--json`` keeps the exact byte counts."""
    if n < 1024:
        return f"{n} B"
    value, unit = float(n), "B"
    for unit in _BINARY_UNITS:
        value /= 1024
        if value < 1024 or unit == _BINARY_UNITS[-1]:
            break
    if f"{value:.1f}" == "1024.0" and unit != _BINARY_UNITS[-1]:  # 1,048,575 B is 1.0 MiB
        value, unit = 1.0, _BINARY_UNITS[_BINARY_UNITS.index(unit) + 1]
    return f"{value:.1f} {unit}"


#: Longest time a process trusts its own size estimate before walking the cache again.
RESCAN_SECONDS = 60.0


def _errors() -> Any:
    from .. import errors  # lazy: errors.py imports torch.fx, the cache must not

    return errors


class Maintenance:
    """Methods of ``DiskCache`` that list, bound and move entries (see the module docstring)."""

    root: Path
    remote: Path | None
    remote_enabled: bool
    enabled: bool
    writable: bool
    max_bytes: int
    failure_ttl: float
    _counts: dict[str, float]
    _warn: Callable[[str], None]
    _load: Callable[..., Entry | None]
    _publish: Callable[..., Path]
    signer: Signer | None
    allow_shared_writable: bool
    signature_problem: Callable[[str, dict[str, Any]], str | None]
    trusts_self_keyed: Callable[[str], bool]
    failure: Callable[[str], dict[str, Any] | None]

    def _entry_dirs(self, base: Path | None = None) -> Iterator[tuple[str, Path]]:
        top = (base or self.root) / "entries"
        try:
            shards = [] if top.is_symlink() else sorted(os.scandir(top), key=lambda d: d.name)
        except OSError:
            return
        for shard in shards:
            if len(shard.name) != 2 or not shard.is_dir(follow_symlinks=False):
                continue
            try:
                found = sorted(os.scandir(shard.path), key=lambda d: d.name)
            except OSError:
                continue  # removed by a concurrent prune
            for d in found:
                if KEY_RE.match(d.name) and d.name[:2] == shard.name:
                    yield d.name, Path(d.path)

    def _manifests(self) -> Iterator[dict[str, Any]]:
        bases = [self.root] + ([self.remote] if self.remote_enabled and self.remote else [])
        for base in bases:
            for key, path in self._entry_dirs(base):
                try:
                    yield parse_manifest(read_nofollow(path / MANIFEST), key)
                except (OSError, ManifestError):
                    continue

    def entries(self) -> list[Entry]:
        """Local entries whose manifest parses (artifacts are not verified: see ``verify``)."""
        out = []
        for key, path in self._entry_dirs():
            try:
                out.append(Entry(key, path, parse_manifest(read_nofollow(path / MANIFEST), key)))
            except (OSError, ManifestError):
                continue
        return out

    def du(self) -> int:
        """Bytes on disk under ``entries/`` (artifacts, manifests, sidecars)."""
        return self.usage()[1]

    def usage(self) -> tuple[int, int]:
        """``(entry directories, bytes on disk)`` of the local tier, from one walk: what
        ``neuron-compile info``, ``cache du`` and ``cache verify`` report, so they agree."""
        sizes = [tree_size(path) for _key, path in self._entry_dirs()]
        return len(sizes), sum(sizes)

    def verify(self, *, quarantine: bool = False) -> list[dict[str, str]]:
        """Check every local entry in full; ``[{"key", "problem"}]``, empty when all are good.
        Symlinked shards, entries and name dirs are problems too (``key`` is then their path)."""
        problems = link_problems(self.root)
        for key, path in self._entry_dirs():
            if path.is_symlink():
                continue  # reported above
            try:
                manifest, files = read_entry(
                    path, read_nofollow(path / MANIFEST), key, owned=not self.allow_shared_writable
                )
                problem = artifact_problem(manifest, files)
                if problem is not None:  # well-formed and keyed, but the artifact is not its own
                    raise ManifestError(f"entry not bound to its key: {problem}")
                problem = self.signature_problem("local", manifest)
                if problem is not None:
                    raise ManifestError(f"signature: {problem}")
            except (OSError, ManifestError) as exc:
                problems.append({"key": key, "problem": f"{type(exc).__name__}: {exc}"})
                if quarantine:
                    self._quarantine(self.root, key, path, None, str(exc))
        return problems

    def _remove(self, base: Path, key: str, path: Path) -> bool:
        """Rename the entry away and delete it, unless a reader holds it. True if removed."""
        fd = None
        try:
            try:
                fd = os.open(path / MANIFEST, os.O_RDWR | os.O_NOFOLLOW)  # NFS wants RW for LOCK_EX
            except PermissionError:
                fd = os.open(path / MANIFEST, os.O_RDONLY | os.O_NOFOLLOW)
            except (FileNotFoundError, NotADirectoryError) as exc:
                if not path.exists() and not path.is_symlink():
                    raise FileNotFoundError(path) from exc
            except OSError as exc:
                if exc.errno != errno.ELOOP:
                    raise
            if fd is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return False  # a reader holds it
                if not same_file(fd, path / MANIFEST):
                    return False
            grave = ensure_dir(base / "tmp") / f"del-{secrets.token_hex(6)}"
            os.rename(path, grave)
        except FileNotFoundError:
            return False
        except OSError as exc:
            self._warn(f"cannot remove cache entry {key[:12]}: {exc}")
            return False
        finally:
            if fd is not None:
                os.close(fd)
        rmtree(grave)
        return True

    def _evict_if_needed(self, added: int, *, protect: str | None = None) -> None:
        """Walk and evict when the local tier's size by the ledger (every writer's puts since
        the last walk, ``ledger.py``) passes ``max_bytes`` or is unknown, and at least every
        ``RESCAN_SECONDS`` (entries removed or copied in by other means)."""
        total = ledger.add(self.root / "locks", added)
        fresh = time.monotonic() - self._last_scan < RESCAN_SECONDS
        if total is not None and total <= self.max_bytes and fresh:
            return
        self._evict(protect=protect)

    def _evict(self, *, protect: str | None = None) -> None:
        """Delete least-recently-accessed entries until the local tier fits ``max_bytes``."""
        try:
            lock = FileLock(str(ensure_dir(self.root / "locks") / "evict.lock"))
            lock.acquire(timeout=30)
        except (Timeout, OSError) as exc:
            log.debug("eviction skipped: %s", exc)
            return
        before = ledger.read(self.root / "locks")
        try:
            self._cleanup_tmp()
            items, total = [], 0
            for key, path in self._entry_dirs():
                size = tree_size(path)
                total += size
                items.append((Entry(key, path, {}).last_access, key, path, size))
            for _atime, key, path, size in sorted(items):
                if total <= self.max_bytes:
                    break
                if key != protect and self._remove(self.root, key, path):
                    total -= size
                    self._counts["evicted"] += 1
                    log.info("evicted cache entry %s (%d bytes)", key[:12], size)
            if total > self.max_bytes:
                log.info("cache holds %d bytes > max %d: the rest is in use", total, self.max_bytes)
            ledger.settle(self.root / "locks", total, before)
            self._last_scan = time.monotonic()
        except OSError as exc:  # eviction is housekeeping: never fail the put that triggered it
            self._warn(f"cache eviction in {self.root} failed: {exc}")
        finally:
            lock.release()

    def _cleanup_tmp(self) -> None:
        """Delete staging dirs of dead writers and graves of interrupted deletes."""
        try:
            stale = list(os.scandir(ensure_dir(self.root / "tmp")))  # not a symlink's target
        except OSError:
            return
        for d in stale:
            dead = d.name.startswith("del-")
            if d.name.startswith("w-") and d.name.count("-") >= 3:
                host, pid, _ = d.name[2:].rsplit("-", 2)
                dead = holder_is_dead({"host": host, "pid": pid})
            try:
                dead = (
                    dead
                    or time.time() - d.stat(follow_symlinks=False).st_mtime > _STALE_TMP_SECONDS
                )
            except OSError:
                continue
            if dead:
                rmtree(Path(d.path))

    def prune(
        self, *, older_than: float | None = None, keep_component: dict[str, str] | None = None
    ) -> list[str]:
        """Remove entries not accessed for ``older_than`` seconds (>= 0), and entries whose
        component (for each name in ``keep_component``) is present but differs: old compiler
        versions. An entry made without the component (``absent``: a CPU-only artifact for
        ``neuronx-cc``) is not an old version of it. Expired failure records go too. Returns the
        removed keys."""
        if older_than is not None and not older_than >= 0:  # NaN too
            raise ValueError(f"older_than must be >= 0 seconds, got {older_than}")
        removed, now = [], time.time()
        for entry in self.entries():
            old = older_than is not None and now - entry.last_access > older_than
            stale = any(
                entry.components.get(name, "absent") not in ("absent", value)
                for name, value in (keep_component or {}).items()
            )
            if (old or stale) and self._remove(self.root, entry.key, entry.path):
                removed.append(entry.key)
        for path in self._failure_files():
            record = self.failure(path.stem)
            if record is None or now - float(record.get("created", 0)) > self.failure_ttl:
                path.unlink(missing_ok=True)
        return removed

    def _failure_files(self) -> list[Path]:
        if (self.root / "failures").is_symlink():
            return []  # never unlink files in a link's target
        try:
            found = (self.root / "failures").iterdir()
            return sorted(p for p in found if p.suffix == ".json" and KEY_RE.match(p.stem))
        except OSError:
            return []

    def clear(self, *, failures_only: bool = False) -> int:
        """Remove every entry not held by a reader, all failure records and quarantine.
        Returns the number of entries removed."""
        for path in self._failure_files():
            path.unlink(missing_ok=True)
        if failures_only:
            return 0
        removed = sum(self._remove(self.root, key, path) for key, path in self._entry_dirs())
        shutil.rmtree(self.root / "quarantine", ignore_errors=True)
        shutil.rmtree(self.root / "names", ignore_errors=True)  # hints; rebuilt on publish
        self._cleanup_tmp()
        ledger.forget(self.root / "locks")
        return removed

    def promote(self, keys: list[str] | None = None) -> int:
        """Copy verified local entries to the remote tier; returns how many were copied.
        Entries with ``meta={"local_only": True}`` (host-specific executables) stay local."""
        if not self.remote_enabled or self.remote is None:
            self._warn("no usable remote cache: set NEURON_COMPILE_REMOTE_CACHE")
            return 0
        copied = 0
        for key in keys if keys is not None else [k for k, _p in self._entry_dirs()]:
            entry = self._load(self.root, check_key(key), local=False)
            if entry is None or is_local_only(entry.manifest):
                continue
            if self._load(self.remote, key, local=False) is not None:
                continue
            try:  # signed with the team key, if we hold one: we wrote and verified it
                self._publish(self.remote, key, seal(entry.manifest, self.signer), entry.files())
                copied += 1
            except OSError as exc:
                self._warn(f"cannot promote {key[:12]} to {self.remote}: {exc}")
        return copied

    def exportable(self, keys: list[str]) -> list[Any]:
        """The verified entries of ``keys`` a bundle carries: all but host-specific executables
        (raises ``CacheBundleError`` for a key without a valid entry)."""
        entries = []
        for key in keys:
            entry = self.get(key, count=False)  # exporting is not a hit
            if entry is None:
                raise _errors().CacheBundleError(
                    f"cannot export {key}: no valid entry in {self.root}", key=key
                )
            if not is_local_only(entry.manifest):  # host-specific native code stays here
                entries.append(entry)
        return entries

    def export(self, keys: list[str], bundle: Path) -> Path:
        """Write a portable bundle (directory, or ``.tar``/``.tar.gz``) of the verified entries
        of ``keys``, host-specific executables left out (``exportable``)."""
        return self.export_entries(self.exportable(keys), bundle)

    def export_entries(self, entries: list[Entry], bundle: Path) -> Path:
        """Write ``entries`` (from ``exportable``) as a bundle, each manifest signed with the team
        key when this cache holds one."""
        from .bundle import write_bundle

        sealed = [(seal(e.manifest, self.signer), e.files()) for e in entries]
        return write_bundle(sealed, Path(bundle))

    def import_bundle(self, bundle: Path) -> list[str]:
        """Validate the whole bundle, then install its entries; returns the keys installed (all
        but FX index entries without the team key's signature: ``binding.self_keyed``)."""
        from .bundle import read_bundle

        # Raises CacheBundleError before anything is written; reads at most max_bytes of artifacts.
        entries = read_bundle(Path(bundle), max_bytes=self.max_bytes)
        foreign = [m["key"] for m, _f in entries if is_local_only(m)]
        if foreign:
            raise _errors().CacheBundleError(
                f"bundle holds host-specific executables ({', '.join(k[:12] for k in foreign)}); "
                "they are never imported: loading one would run native code from the bundle"
            )
        unsigned = [
            f"{m['key'][:12]}: {why}"
            for m, _f in entries
            if (why := self.signature_problem("import", m)) is not None
        ]
        if unsigned:
            raise _errors().CacheBundleError(
                f"bundle entries not signed by the team key ({'; '.join(unsigned)}); nothing "
                "imported (export them again where the team key is set)"
            )
        if not (self.enabled and self.writable):
            raise _errors().CacheBundleError(f"cache {self.root} is disabled or read-only")
        installed = []
        for manifest, files in entries:
            if self_keyed(manifest) and not self.trusts_self_keyed("import"):
                continue  # an unsigned FX index entry: this host lowers the graph once instead
            if self._load(self.root, manifest["key"], local=False) is None:
                self._publish(self.root, manifest["key"], manifest, files)
            installed.append(manifest["key"])
        self._evict()
        skipped = len(entries) - len(installed)
        if skipped:
            log.info("%d unsigned FX index entries of the bundle not installed", skipped)
        return installed


def describe_diff(old: dict[str, str], new: dict[str, str]) -> list[str]:
    """Human lines for components that differ: values when short, "changed" for hashes/long."""
    lines = []
    for name in sorted(old.keys() | new.keys()):
        a, b = old.get(name), new.get(name)
        if a == b:
            continue
        if a is None:
            lines.append(f"{name}: added ({_short(b)})")
        elif b is None:
            lines.append(f"{name}: removed (was {_short(a)})")
        elif _readable(a) and _readable(b):
            lines.append(f"{name}: {a} → {b}")
        else:
            lines.append(f"{name}: changed")
    return lines


def _readable(value: str) -> bool:
    return len(value) <= 40 and "\n" not in value and not KEY_RE.match(value)


def _short(value: str | None) -> str:
    return value if value is not None and _readable(value) else "…"
