"""Portable cache bundles: export entries from one machine, import them on another.

A bundle is a directory or a tar (``.tar``, ``.tar.gz``, ``.tgz``) holding::

    bundle.json                  {"schema", "kind", "created", "entries": {key: {"manifest_sha256"}}}
    entries/<key>/manifest.json  the entry manifest (sizes and sha256 of every artifact)
    entries/<key>/<artifact>     raw bytes

Import never extracts: members are read into memory and *everything* is validated (member types
and paths, key format, schema, manifest and artifact checksums, exact file sets) before the first
byte is written to the cache, so a hostile or damaged bundle installs nothing.
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
    read_nofollow,
    sha256,
    verify_files,
    walk_tree,
)

BUNDLE_SCHEMA = 1
BUNDLE_KIND = "neuron-compile-cache-bundle"
INDEX = "bundle.json"
_TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz")

Bundled = tuple[dict[str, Any], dict[str, bytes]]


def _bundle_error(message: str) -> Exception:
    from ..errors import CacheBundleError  # lazy: errors.py imports torch.fx

    return CacheBundleError(message)


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


def _tar_members(path: Path) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    try:
        with tarfile.open(path, "r:*") as tar:
            for member in tar.getmembers():
                name = _check_member_name(member.name)
                if member.isdir():
                    continue
                if not member.isreg():
                    kind = "link" if member.issym() or member.islnk() else "special file"
                    raise _bundle_error(f"member {name!r} is a {kind}; only regular files allowed")
                if name in out:
                    raise _bundle_error(f"member {name!r} appears twice")
                f = tar.extractfile(member)
                if f is None:
                    raise _bundle_error(f"member {name!r} cannot be read")
                out[name] = f.read()
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise _bundle_error(f"{path} is not a readable tar: {exc}") from None
    return out


def _dir_members(path: Path) -> dict[str, bytes]:
    try:
        return {name: read_nofollow(p) for name, p in walk_tree(path).items()}
    except ManifestError as exc:  # symlinks or special files in the bundle directory
        raise _bundle_error(f"{path}: {exc}") from None
    except OSError as exc:
        raise _bundle_error(f"cannot read bundle {path}: {exc}") from None


def read_bundle(bundle: Path) -> list[Bundled]:
    """Read and fully validate a bundle; raise ``CacheBundleError`` on the first defect."""
    if not bundle.exists():
        raise _bundle_error(f"{bundle} does not exist")
    members = _tar_members(bundle) if bundle.is_file() else _dir_members(bundle)
    try:
        index = json.loads(members.pop(INDEX))
    except KeyError:
        raise _bundle_error(f"{bundle} has no {INDEX}") from None
    except ValueError as exc:
        raise _bundle_error(f"{INDEX} is not JSON: {exc}") from None
    if not isinstance(index, dict) or index.get("kind") != BUNDLE_KIND:
        raise _bundle_error(f"{bundle} is not a neuron-compile cache bundle")
    if index.get("schema") != BUNDLE_SCHEMA:
        raise _bundle_error(f"bundle schema {index.get('schema')!r}, expected {BUNDLE_SCHEMA}")
    listed = index.get("entries")
    if not isinstance(listed, dict):
        raise _bundle_error(f"{INDEX} lacks its entry table")
    grouped: dict[str, dict[str, bytes]] = {}
    for name, blob in members.items():
        top, _, rest = name.partition("/")
        key, _, inner = rest.partition("/")
        if top != "entries" or not KEY_RE.match(key) or not inner:
            raise _bundle_error(f"unexpected member {name!r}")
        grouped.setdefault(key, {})[inner] = blob
    if set(grouped) != set(listed):
        raise _bundle_error(f"entries on disk {sorted(grouped)} differ from {INDEX}")
    out = []
    for key, files in sorted(grouped.items()):
        manifest_data = files.pop(MANIFEST, None)
        if manifest_data is None:
            raise _bundle_error(f"entry {key} has no manifest")
        if sha256(manifest_data) != (listed[key] or {}).get("manifest_sha256"):
            raise _bundle_error(f"entry {key}: manifest checksum differs from {INDEX}")
        try:
            manifest = parse_manifest(manifest_data, key)
            verify_files(manifest, files)
        except ManifestError as exc:
            raise _bundle_error(f"entry {key}: {exc}") from None
        out.append((manifest, files))
    return out
