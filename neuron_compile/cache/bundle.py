"""Portable cache bundles: export entries from one machine, import them on another.

A bundle is a directory or a tar (``.tar``, ``.tar.gz``, ``.tgz``) holding::

    bundle.json                  {"schema", "kind", "created", "entries": {key: {"manifest_sha256"}}}
    entries/<key>/manifest.json  the entry manifest (sizes and sha256 of every artifact)
    entries/<key>/<artifact>     raw bytes

Import never extracts: member headers are checked first (types, paths, names against
``bundle.json``, sizes against the manifests and caps: ``read_bundle``), then members are read
with bounded reads and *everything* is validated (schema, manifest and artifact checksums, exact
file sets) before the first byte is written to the cache, so a hostile or damaged bundle installs
nothing and a lying header cannot exhaust memory.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import time
from pathlib import Path, PurePosixPath
from typing import Any

from .manifest import (
    KEY_RE,
    MANIFEST,
    ManifestError,
    dump_manifest,
    parse_manifest,
    sha256,
    verify_files,
    walk_tree,
)
from .settings import DEFAULT_MAX_BYTES

BUNDLE_SCHEMA = 1
BUNDLE_KIND = "neuron-compile-cache-bundle"
INDEX = "bundle.json"
_TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz")
#: Largest ``bundle.json`` or entry ``manifest.json`` an import reads (names and checksums only).
MAX_INDEX_BYTES = 16 * 2**20

Bundled = tuple[dict[str, Any], dict[str, bytes]]


def _errors() -> Any:
    from .. import errors  # lazy: errors.py imports torch.fx

    return errors


def _bundle_error(message: str) -> Exception:
    return _errors().CacheBundleError(message)


def _is_tar(path: Path) -> bool:
    return path.name.endswith(_TAR_SUFFIXES)


def write_bundle(entries: list[Bundled], bundle: Path) -> Path:
    """Write ``entries`` (manifest, files) to ``bundle``; atomic via a sibling temp + rename."""
    members: dict[str, bytes] = {}
    index: dict[str, Any] = {}
    for manifest, files in entries:
        key = manifest["key"]
        data = dump_manifest(manifest)
        members[f"entries/{key}/{MANIFEST}"] = data
        members.update({f"entries/{key}/{name}": blob for name, blob in files.items()})
        index[key] = {"manifest_sha256": sha256(data)}
    doc = {"schema": BUNDLE_SCHEMA, "kind": BUNDLE_KIND, "created": time.time(), "entries": index}
    members[INDEX] = json.dumps(doc, indent=1, sort_keys=True).encode()
    if bundle.exists() and not (bundle.is_dir() and not any(bundle.iterdir())):
        raise _bundle_error(f"{bundle} already exists")
    tmp = bundle.with_name(f".{bundle.name}.{os.getpid()}.tmp")
    try:
        if _is_tar(bundle):
            mode = "w:gz" if bundle.name.endswith(("gz", "tgz")) else "w"
            with tarfile.open(tmp, mode) as tar:
                for name, blob in sorted(members.items()):
                    info = tarfile.TarInfo(name)
                    info.size, info.mode, info.mtime = len(blob), 0o644, int(time.time())
                    tar.addfile(info, io.BytesIO(blob))
        else:
            for name, blob in members.items():
                (tmp / name).parent.mkdir(parents=True, exist_ok=True)
                (tmp / name).write_bytes(blob)
            if bundle.is_dir():
                bundle.rmdir()  # the empty target directory allowed above
        os.rename(tmp, bundle)
    finally:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        elif tmp.exists():
            tmp.unlink()
    return bundle


def _check_member_name(name: str) -> str:
    """A relative, normalised POSIX path inside the bundle; raise otherwise."""
    if not name or "\\" in name or "\x00" in name or name.startswith("/"):
        raise _bundle_error(f"member {name!r} has an absolute or invalid path")
    parts = PurePosixPath(name).parts
    if any(p in ("..", ".") for p in name.rstrip("/").split("/")) or not parts:
        raise _bundle_error(f"member {name!r} escapes the bundle")
    return "/".join(parts)


class _Members:
    """A bundle's members by name with their sizes, read only on request and never past the size
    the header (tar) or ``lstat`` (directory) announced: a sparse or lying member cannot make a
    read allocate more than the cap checked against that size."""

    def __init__(self, bundle: Path) -> None:
        self.bundle = bundle
        self.sizes: dict[str, int] = {}
        self._tar: tarfile.TarFile | None = None
        self._infos: dict[str, tarfile.TarInfo] = {}
        self._paths: dict[str, Path] = {}
        if bundle.is_file():
            self._open_tar()
        else:
            try:
                self._paths = walk_tree(bundle)
                self.sizes = {n: os.lstat(p).st_size for n, p in self._paths.items()}
            except ManifestError as exc:  # symlinks or special files in the bundle directory
                raise _bundle_error(f"{bundle}: {exc}") from None
            except OSError as exc:
                raise _bundle_error(f"cannot read bundle {bundle}: {exc}") from None

    def _open_tar(self) -> None:
        try:  # headers only: tarfile seeks over member data
            self._tar = tarfile.open(self.bundle, "r:*")
            for member in self._tar.getmembers():
                name = _check_member_name(member.name)
                if member.isdir():
                    continue
                if not member.isreg():
                    kind = "link" if member.issym() or member.islnk() else "special file"
                    raise _bundle_error(f"member {name!r} is a {kind}; only regular files allowed")
                if name in self._infos:
                    raise _bundle_error(f"member {name!r} appears twice")
                self._infos[name] = member
                self.sizes[name] = member.size
        except (tarfile.TarError, OSError, EOFError) as exc:
            self.close()
            raise _bundle_error(f"{self.bundle} is not a readable tar: {exc}") from None
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._tar is not None:
            self._tar.close()

    def read(self, name: str, cap: int) -> bytes:
        """The member's bytes; an error if it is larger than ``cap`` or not its announced size."""
        size = self.sizes[name]
        if size > cap:
            raise _bundle_error(f"member {name!r} is {size:,} bytes, over the limit of {cap:,}")
        try:
            if self._tar is not None:
                f = self._tar.extractfile(self._infos[name])
                if f is None:
                    raise _bundle_error(f"member {name!r} cannot be read")
                data = f.read(size + 1)
            else:
                fd = os.open(self._paths[name], os.O_RDONLY | os.O_NOFOLLOW)
                try:
                    chunks, left = [], size + 1
                    while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
                        chunks.append(chunk)
                        left -= len(chunk)
                    data = b"".join(chunks)
                finally:
                    os.close(fd)
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise _bundle_error(f"cannot read member {name!r} of {self.bundle}: {exc}") from None
        if len(data) != size:
            raise _bundle_error(f"member {name!r} changed size while being read")
        return data


def read_bundle(bundle: Path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> list[Bundled]:
    """Read and fully validate a bundle; raise ``CacheBundleError`` on the first defect.

    Bounded: ``bundle.json`` and manifests may be at most ``MAX_INDEX_BYTES``, the artifacts
    together at most ``max_bytes`` (the importing cache's size cap: a bigger bundle could never
    fit). Every member name is checked against ``bundle.json`` and every artifact's size against
    its manifest before the artifact is read, so memory use is bounded by what is legitimately
    listed, whatever the headers claim.
    """
    if not bundle.exists():
        raise _bundle_error(f"{bundle} does not exist")
    members = _Members(bundle)
    try:
        return _validate(members, max_bytes)
    finally:
        members.close()


def _validate(members: _Members, max_bytes: int) -> list[Bundled]:
    bundle, sizes = members.bundle, members.sizes
    if INDEX not in sizes:
        raise _bundle_error(f"{bundle} has no {INDEX}")
    total = sum(size for name, size in sizes.items() if name != INDEX)
    if total > max_bytes:
        raise _bundle_error(
            f"{bundle} holds {total:,} bytes, more than the cache's max_bytes={max_bytes:,}"
        )
    index_data = members.read(INDEX, MAX_INDEX_BYTES)
    try:
        index = json.loads(index_data)
    except ValueError as exc:
        raise _bundle_error(f"{INDEX} is not JSON: {exc}") from None
    if not isinstance(index, dict) or index.get("kind") != BUNDLE_KIND:
        raise _bundle_error(f"{bundle} is not a neuron-compile cache bundle")
    if index.get("schema") != BUNDLE_SCHEMA:
        raise _bundle_error(f"bundle schema {index.get('schema')!r}, expected {BUNDLE_SCHEMA}")
    listed = index.get("entries")
    if not isinstance(listed, dict):
        raise _bundle_error(f"{INDEX} lacks its entry table")
    grouped: dict[str, dict[str, str]] = {}  # key -> inner name -> member name
    for name in sizes:
        if name == INDEX:
            continue
        top, _, rest = name.partition("/")
        key, _, inner = rest.partition("/")
        if top != "entries" or not KEY_RE.match(key) or not inner:
            raise _bundle_error(f"unexpected member {name!r}")
        grouped.setdefault(key, {})[inner] = name
    if set(grouped) != set(listed):
        raise _bundle_error(f"entries on disk {sorted(grouped)} differ from {INDEX}")
    out = []
    for key, names in sorted(grouped.items()):
        manifest_name = names.pop(MANIFEST, None)
        if manifest_name is None:
            raise _bundle_error(f"entry {key} has no manifest")
        manifest_data = members.read(manifest_name, MAX_INDEX_BYTES)
        if sha256(manifest_data) != (listed[key] or {}).get("manifest_sha256"):
            raise _bundle_error(f"entry {key}: manifest checksum differs from {INDEX}")
        try:
            manifest = parse_manifest(manifest_data, key)
            expected = manifest["files"]
            if set(names) != set(expected):  # names and sizes first, then the bytes
                verify_files(manifest, dict.fromkeys(names, b""))
            for inner, member in names.items():
                if sizes[member] != expected[inner]["size"]:
                    raise ManifestError(
                        f"{inner}: size {sizes[member]}, manifest says {expected[inner]['size']}"
                    )
            files = {inner: members.read(member, max_bytes) for inner, member in names.items()}
            verify_files(manifest, files)
        except ManifestError as exc:
            raise _bundle_error(f"entry {key}: {exc}") from None
        out.append((manifest, files))
    return out
