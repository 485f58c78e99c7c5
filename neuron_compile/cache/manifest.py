"""Entry format: a directory of raw artifact files plus ``manifest.json`` (JSON, never pickle).

The manifest lists every file with its size and sha256 and carries its own checksum, so a
bit-flip anywhere in an entry is detected on read. It is written last and the directory is
published with one ``rename``; a reader therefore sees a whole entry or none. Shared by the
store (``store.py``) and by bundles (``bundle.py``). Pure stdlib.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from .binding import binding_problem
from .signing import Signer

STORE_SCHEMA = 1  # bump when the entry layout changes; older entries then read as misses
MANIFEST = "manifest.json"
# Empty sidecar whose mtime is the last access: artifacts are never rewritten after publish.
ACCESS = "last_access"
RESERVED = frozenset({MANIFEST, ACCESS})
KEY_RE = re.compile(r"[0-9a-f]{64}\Z")
_PART_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]{0,127}\Z")


class ManifestError(ValueError):
    """An entry is corrupt, partial, or unsafe (symlink, stray file): never serve it."""


class SchemaError(ManifestError):
    """An entry written by another store schema: a miss, but not corruption."""


def check_key(key: str) -> str:
    if not isinstance(key, str) or not KEY_RE.match(key):
        raise ValueError(f"cache keys are 64 lowercase hex digits, got {key!r}")
    return key


def check_name(name: str) -> str:
    """Artifact names are relative POSIX paths of plain parts: no '..', no absolute, no dot-files."""
    parts = name.split("/") if isinstance(name, str) else [""]
    if name in RESERVED or not all(_PART_RE.match(p) for p in parts):
        raise ValueError(f"invalid artifact name {name!r}")
    return name


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _checksum(manifest: dict[str, Any]) -> str:
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    return sha256(json.dumps(body, sort_keys=True).encode())


def build_manifest(
    key: str,
    files: dict[str, bytes],
    *,
    graph_name: str,
    components: dict[str, str],
    compile_seconds: float = 0.0,
    meta: dict[str, Any] | None = None,
    created: float | None = None,
    signer: Signer | None = None,
) -> dict[str, Any]:
    manifest: dict[str, Any] = {
        "schema": STORE_SCHEMA,
        "kind": "entry",
        "key": check_key(key),
        "graph_name": str(graph_name),
        "components": {str(k): str(v) for k, v in components.items()},
        "files": {
            check_name(n): {"size": len(d), "sha256": sha256(d)} for n, d in sorted(files.items())
        },
        "created": time.time() if created is None else float(created),
        "compile_seconds": float(compile_seconds),
        "meta": dict(meta or {}),
    }
    return seal(manifest, signer)


def seal(manifest: dict[str, Any], signer: Signer | None = None) -> dict[str, Any]:
    """``manifest`` signed by ``signer`` when it holds a usable key (any previous signature
    dropped), with its checksum recomputed. Writers sign what they write, promote or export."""
    sealed = {k: v for k, v in manifest.items() if k not in ("checksum", "signature")}
    if signer is not None and signer.problem is None:
        sealed["signature"] = signer.signature(sealed)
    sealed["checksum"] = _checksum(sealed)
    return sealed


def foreign_reason(st: os.stat_result) -> str | None:
    """Why a directory or file with status ``st`` may hold what another user wrote, or None:
    owned by someone else, or writable by group or others."""
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not by you (uid {os.geteuid()})"
    if st.st_mode & 0o022:
        return f"writable by group or others (mode {oct(st.st_mode & 0o777)})"
    return None


def dump_manifest(manifest: dict[str, Any]) -> bytes:
    return json.dumps(manifest, indent=1, sort_keys=True).encode()


def parse_manifest(data: bytes, key: str | None = None) -> dict[str, Any]:
    """Decode and check a manifest (schema, self-checksum, key, file table)."""
    try:
        manifest = json.loads(data)
    except ValueError as exc:
        raise ManifestError(f"manifest is not valid JSON: {exc}") from None
    if not isinstance(manifest, dict):
        raise ManifestError("manifest is not a JSON object")
    if manifest.get("schema") != STORE_SCHEMA:
        raise SchemaError(f"store schema {manifest.get('schema')!r}, expected {STORE_SCHEMA}")
    if manifest.get("checksum") != _checksum(manifest):
        raise ManifestError("manifest checksum mismatch")
    if key is not None and manifest.get("key") != key:
        raise ManifestError(f"manifest is for key {manifest.get('key')!r}")
    files = manifest.get("files")
    if not isinstance(files, dict) or not isinstance(manifest.get("components"), dict):
        raise ManifestError("manifest lacks a file table or components")
    try:
        check_key(manifest["key"])
        for name, info in files.items():
            check_name(name)
            if not isinstance(info.get("size"), int) or not isinstance(info.get("sha256"), str):
                raise ManifestError(f"bad file record for {name!r}")
    except (TypeError, AttributeError, ValueError) as exc:
        raise ManifestError(str(exc)) from None
    return manifest


def verify_files(manifest: dict[str, Any], files: dict[str, bytes]) -> None:
    """Exactly the files of the manifest, each with the recorded size and sha256, and bound to
    the manifest's key by content (binding.py)."""
    expected = manifest["files"]
    if set(files) != set(expected):
        missing = sorted(set(expected) - set(files))
        extra = sorted(set(files) - set(expected))
        raise ManifestError(f"file set differs from manifest (missing {missing}, extra {extra})")
    for name, data in files.items():
        info = expected[name]
        if len(data) != info["size"]:
            raise ManifestError(f"{name}: size {len(data)}, manifest says {info['size']}")
        if sha256(data) != info["sha256"]:
            raise ManifestError(f"{name}: sha256 mismatch")
    problem = binding_problem(manifest["key"], manifest, files)
    if problem is not None:  # whole, but not the entry of this key: a forgery or a misplacement
        raise ManifestError(f"entry not bound to its key: {problem}")


def read_nofollow(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ManifestError(f"{path.name} is not a regular file")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def walk_tree(top: Path, *, owned: bool = False) -> dict[str, Path]:
    """Every regular file under ``top`` by relative POSIX name; symlinks and devices are errors,
    and with ``owned`` so is anything another user owns or may write (``foreign_reason``)."""
    st = os.lstat(top)
    if not stat.S_ISDIR(st.st_mode):
        raise ManifestError(f"{top} is {'a symlink' if stat.S_ISLNK(st.st_mode) else 'not a dir'}")
    if owned and (why := foreign_reason(st)) is not None:
        raise ManifestError(f"the entry directory is {why}")
    found: dict[str, Path] = {}
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            st = os.lstat(path)
            mode = st.st_mode
            rel = PurePosixPath(path.relative_to(top)).as_posix()
            if owned and not stat.S_ISLNK(mode) and (why := foreign_reason(st)) is not None:
                raise ManifestError(f"{rel} is {why}")
            if stat.S_ISLNK(mode):
                raise ManifestError(f"{rel} is a symlink")
            if stat.S_ISREG(mode):
                found[rel] = path
            elif not stat.S_ISDIR(mode):
                raise ManifestError(f"{rel} is not a regular file")
    return found


def read_entry(
    path: Path, manifest_data: bytes, key: str, *, owned: bool = False
) -> tuple[dict[str, Any], dict[str, bytes]]:
    """Load and fully verify the entry at ``path``; raise ``ManifestError`` on any defect
    (``owned``: including a file or directory another user may have written)."""
    manifest = parse_manifest(manifest_data, key)
    on_disk = walk_tree(path, owned=owned)
    stray = sorted(set(on_disk) - set(manifest["files"]) - RESERVED)
    if stray:
        raise ManifestError(f"files not in the manifest: {stray}")
    files = {}
    for name in manifest["files"]:
        if name not in on_disk:
            raise ManifestError(f"{name} is missing")
        files[name] = read_nofollow(on_disk[name])
    verify_files(manifest, files)
    return manifest, files


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_entry(tmp: Path, manifest: dict[str, Any], files: dict[str, bytes]) -> None:
    """Write artifacts, then the manifest, all fsynced, into the (private) directory ``tmp``."""
    dirs = {tmp}
    for name, data in files.items():
        target = tmp / name
        for parent in reversed(target.relative_to(tmp).parents[:-1]):
            if tmp / parent not in dirs:  # modes explicit: a umask of 002 must not make them
                os.mkdir(tmp / parent, 0o755)  # group-writable, which readers refuse
                dirs.add(tmp / parent)
        _write_file(target, data)
    _write_file(tmp / ACCESS, b"")
    _write_file(tmp / MANIFEST, dump_manifest(manifest))  # last: its presence marks completion
    for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
        fsync_dir(d)


def _write_file(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def entry_path(base: Path, key: str) -> Path:
    return base / "entries" / key[:2] / key


def same_file(fd: int, path: Path) -> bool:
    """The entry we locked is still the one at ``path`` (not evicted or replaced meanwhile)."""
    try:
        a, b = os.fstat(fd), os.lstat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def read_fd(fd: int) -> bytes:
    chunks, offset = [], 0
    while chunk := os.pread(fd, 1 << 20, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def tree_size(path: Path) -> int:
    total = 0
    for dirpath, _dirs, names in os.walk(path, followlinks=False):
        for name in names:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


@dataclass(frozen=True)
class Entry:
    """A verified cache entry. ``files()`` of an entry returned by ``get`` needs no disk access."""

    key: str
    path: Path
    manifest: dict[str, Any]
    _data: dict[str, bytes] | None = field(default=None, repr=False, compare=False)

    @property
    def graph_name(self) -> str:
        return self.manifest.get("graph_name", "")

    @property
    def components(self) -> dict[str, str]:
        return self.manifest.get("components", {})

    @property
    def size(self) -> int:
        return sum(info["size"] for info in self.manifest["files"].values())

    @property
    def last_access(self) -> float:
        try:
            return os.lstat(self.path / ACCESS).st_mtime
        except OSError:
            return float(self.manifest.get("created", 0.0))

    def read(self, name: str) -> bytes:
        """One artifact, checked against the manifest (``ManifestError`` if it changed on disk)."""
        if self._data is not None and name in self._data:
            return self._data[name]
        info = self.manifest["files"][check_name(name)]
        data = read_nofollow(self.path / name)
        if len(data) != info["size"] or sha256(data) != info["sha256"]:
            raise ManifestError(f"{self.key[:12]}/{name} does not match its manifest")
        return data

    def files(self) -> dict[str, bytes]:
        return {name: self.read(name) for name in self.manifest["files"]}

    def summary(self) -> dict[str, Any]:
        m = self.manifest
        return {
            "key": self.key,
            "graph_name": self.graph_name,
            "size": self.size,
            "files": sorted(m["files"]),
            "created": m.get("created"),
            "last_access": self.last_access,
            "compile_seconds": m.get("compile_seconds", 0.0),
            "components": self.components,
        }


def is_local_only(manifest: dict[str, Any]) -> bool:
    """Entries holding host-specific native code: never exported, promoted, imported or read
    from the remote tier (``meta={"local_only": True}``)."""
    return bool((manifest.get("meta") or {}).get("local_only"))
