"""Export/import bundles: round trips, and rejection of hostile or damaged bundles."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile

import pytest

from neuron_compile.cache.store import DiskCache
from neuron_compile.errors import CacheBundleError

from .procs import key_of, payload

COMPONENTS = {"neuronx-cc": "2.28.7"}


@pytest.fixture
def source(tmp_path):
    c = DiskCache(tmp_path / "src")
    keys = [key_of(f"b{i}") for i in range(2)]
    for k in keys:
        c.put(k, {**payload(k), "nki/k.py": b"pass\n"}, graph_name="g", components=COMPONENTS)
    return c, keys


@pytest.mark.parametrize("name", ["bundle.tar", "bundle.tar.gz", "bundle_dir"])
def test_export_import_round_trip(tmp_path, source, name):
    c, keys = source
    bundle = c.export(keys, tmp_path / name)
    dest = DiskCache(tmp_path / "dest")
    assert sorted(dest.import_bundle(bundle)) == sorted(keys)
    for k in keys:
        entry = dest.get(k)
        assert entry.files() == c.get(k).files() and entry.components == COMPONENTS
    assert dest.import_bundle(bundle) == sorted(keys)  # idempotent


def _members(tmp_path, source) -> dict[str, bytes]:
    c, keys = source
    bundle = c.export(keys[:1], tmp_path / "good.tar")
    with tarfile.open(bundle) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isreg()}


def _tar(path, members: dict[str, bytes], extra: list[tarfile.TarInfo] = ()) -> str:
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in extra:
            tar.addfile(info)
    return path


def _link(name: str, kind: bytes, target: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


def _hostile(members: dict[str, bytes], case: str):
    key = next(n.split("/")[1] for n in members if n.startswith("entries/"))
    first = f"entries/{key}/part0.bin"
    if case == "traversal":
        return {**members, f"entries/{key}/../../x": b"evil"}, []
    if case == "dotdot_top":
        return {**members, "../x": b"evil"}, []
    if case == "absolute":
        return {**members, "/tmp/evil": b"evil"}, []
    if case == "symlink":
        return members, [_link(f"entries/{key}/link", tarfile.SYMTYPE, "/etc/passwd")]
    if case == "hardlink":
        return members, [_link(f"entries/{key}/hard", tarfile.LNKTYPE, first)]
    if case == "device":
        return members, [_link(f"entries/{key}/dev", tarfile.CHRTYPE, "")]
    if case == "bad_checksum":
        return {**members, first: members[first][:-1] + b"\x00"}, []
    if case == "wrong_schema":
        index = json.loads(members["bundle.json"])
        return {**members, "bundle.json": json.dumps({**index, "schema": 99}).encode()}, []
    if case == "entry_schema":
        manifest = f"entries/{key}/manifest.json"  # index re-signed: the entry schema must fail
        data = members[manifest].replace(b'"schema": 1', b'"schema": 2')
        index = json.loads(members["bundle.json"])
        index["entries"][key]["manifest_sha256"] = hashlib.sha256(data).hexdigest()
        return {**members, manifest: data, "bundle.json": json.dumps(index).encode()}, []
    if case == "bad_key":
        return {n.replace(key, key.upper()): d for n, d in members.items()}, []
    if case == "missing_file":
        return {n: d for n, d in members.items() if n != first}, []
    raise AssertionError(case)


CASES = {  # case -> what the error must say
    "traversal": "escapes the bundle",
    "dotdot_top": "escapes the bundle",
    "absolute": "absolute",
    "symlink": "is a link",
    "hardlink": "is a link",
    "device": "special file",
    "bad_checksum": "sha256 mismatch",
    "wrong_schema": "bundle schema 99",
    "entry_schema": "store schema 2",
    "bad_key": "unexpected member",
    "missing_file": "missing ['part0.bin']",
}


@pytest.mark.parametrize("case", CASES)
def test_import_rejects_hostile_tar_and_installs_nothing(tmp_path, source, case):
    members, extra = _hostile(_members(tmp_path, source), case)
    bundle = _tar(tmp_path / f"{case}.tar", members, extra)
    dest = DiskCache(tmp_path / "dest")
    with pytest.raises(CacheBundleError) as info:
        dest.import_bundle(bundle)
    assert info.value.code == "NC403" and CASES[case] in str(info.value)
    assert dest.entries() == [] and not (tmp_path / "x").exists()


def test_import_rejects_symlink_in_bundle_directory(tmp_path, source):
    c, keys = source
    bundle = c.export(keys[:1], tmp_path / "dir_bundle")
    target = bundle / "entries" / keys[0] / "part0.bin"
    target.unlink()
    os.symlink("/etc/passwd", target)
    with pytest.raises(CacheBundleError, match="symlink"):
        DiskCache(tmp_path / "dest").import_bundle(bundle)


def test_export_of_missing_key_fails_cleanly(tmp_path, source):
    c, _keys = source
    with pytest.raises(CacheBundleError):
        c.export([key_of("nope")], tmp_path / "b.tar")
    assert not (tmp_path / "b.tar").exists()


def test_host_specific_executables_never_leave_or_enter_a_cache(tmp_path, source):
    """Loading an XLA executable runs its native code: only entries this host wrote qualify."""
    from neuron_compile.cache.bundle import write_bundle

    c, keys = source
    exe = key_of("exe")
    c.put(exe, payload(exe), graph_name="g.executable", components={}, meta={"local_only": True})
    bundle = c.export([*keys, exe], tmp_path / "b.tar")
    dest = DiskCache(tmp_path / "dest")
    assert sorted(dest.import_bundle(bundle)) == sorted(keys)  # exported without the executable
    assert dest.get(exe) is None

    forged = write_bundle([(c.get(exe).manifest, c.get(exe).files())], tmp_path / "forged.tar")
    with pytest.raises(CacheBundleError, match="host-specific"):
        dest.import_bundle(forged)
    assert dest.get(exe) is None

    remote = DiskCache(tmp_path / "remote")
    remote.put(exe, payload(exe), graph_name="g", components={}, meta={"local_only": True})
    reader = DiskCache(tmp_path / "reader", remote=tmp_path / "remote")
    assert reader.get(exe) is None  # a local-only entry in the shared tier is not served
