"""Bounded bundle imports: a member whose header claims gigabytes is refused (NC403) from its
header, before a byte of it is read, so a 10 KB sparse file cannot exhaust memory."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import textwrap

import pytest

from neuron_compile.cache.bundle import MAX_INDEX_BYTES
from neuron_compile.cache.store import DiskCache

from .procs import key_of, payload

HUGE = 4 * 2**30  # 4 GiB: fits a ustar size field, and would dominate any RSS measurement
BLOCK = tarfile.BLOCKSIZE


def _sparse_tar(path, members: dict[str, bytes], huge_name: str) -> str:
    """A valid tar whose last member claims ``HUGE`` bytes of zeros that the file system holds as
    a hole: ``tarfile`` reads it as a real 4 GiB member, the disk holds a few KB."""
    with open(path, "wb") as f:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            f.write(info.tobuf(tarfile.USTAR_FORMAT) + data + b"\0" * (-len(data) % BLOCK))
        info = tarfile.TarInfo(huge_name)
        info.size = HUGE
        f.write(info.tobuf(tarfile.USTAR_FORMAT))
        f.seek(HUGE, os.SEEK_CUR)  # the hole
        f.write(b"\0" * (2 * BLOCK))  # end-of-archive marker
    assert os.stat(path).st_blocks * 512 < 2**20  # really sparse
    return str(path)


@pytest.fixture
def good(tmp_path):
    c = DiskCache(tmp_path / "src")
    key = key_of("limits")
    c.put(key, payload(key), graph_name="g", components={"neuronx-cc": "2.28.7"})
    with tarfile.open(c.export([key], tmp_path / "good.tar")) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isreg()}
    return key, members


def _cases(tmp_path, key: str, members: dict[str, bytes]) -> dict[str, tuple[str, str, int]]:
    """case -> (bundle, expected message, importing cache's max_bytes)."""
    first = f"entries/{key}/part0.bin"
    without_first = {n: d for n, d in members.items() if n != first}
    without_index = {n: d for n, d in members.items() if n != "bundle.json"}
    big = 10 * 2**30
    cases = {
        "listed_artifact": (without_first, first, f"size {HUGE}, manifest says", big),
        "unlisted_artifact": (members, f"entries/{key}/zeros.bin", "extra ['zeros.bin']", big),
        "unlisted_key": (members, f"entries/{key_of('x')}/a.bin", "differ from bundle.json", big),
        "stray_member": (members, "zeros.bin", "unexpected member", big),
        "index": (without_index, "bundle.json", f"over the limit of {MAX_INDEX_BYTES:,}", big),
        "over_max_bytes": (without_first, first, "more than the cache's max_bytes", 2**20),
    }
    out = {}
    for case, (base, huge_name, message, max_bytes) in cases.items():
        out[case] = (_sparse_tar(tmp_path / f"{case}.tar", base, huge_name), message, max_bytes)
    # The same attack as a directory bundle: a sparse 4 GiB file in place of an artifact.
    d = tmp_path / "dir_bundle"
    for name, data in members.items():
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_bytes(data)
    with open(d / first, "r+b") as f:
        f.truncate(HUGE)
    out["directory"] = (str(d), f"size {HUGE}, manifest says", big)
    return out


_CHILD = textwrap.dedent(
    """
    import json, resource, sys, time
    from neuron_compile.cache.store import DiskCache
    from neuron_compile.errors import CacheBundleError

    cases, dest = json.loads(sys.argv[1]), sys.argv[2]
    DiskCache(dest)  # warm up: everything the import path needs is loaded and allocated
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out = {}
    for case, (bundle, _msg, max_bytes) in cases.items():
        start = time.monotonic()
        try:
            DiskCache(dest, max_bytes=max_bytes).import_bundle(bundle)
            result = {"error": None}
        except CacheBundleError as exc:
            result = {"error": str(exc), "code": exc.code}
        result["seconds"] = time.monotonic() - start
        result["peak_over_base"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
        out[case] = result
    print(json.dumps(out))
    """
)


def test_sparse_huge_members_are_refused_from_their_headers(tmp_path, good):
    key, members = good
    cases = _cases(tmp_path, key, members)
    dest = tmp_path / "dest"
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(cases), str(dest)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout.splitlines()[-1])
    for case, (_bundle, message, _max) in cases.items():
        r = results[case]
        assert r["error"] is not None and r["code"] == "NC403", (case, r)
        assert message in r["error"], (case, r["error"])
        assert r["seconds"] < 10, (case, r)
        assert r["peak_over_base"] < 300 * 2**20, (case, r)  # 4 GiB would be read otherwise
    assert DiskCache(dest).entries() == []


def test_legitimate_bundle_still_imports_with_a_tight_cap(tmp_path, good):
    key, members = good
    bundle = tmp_path / "ok.tar"
    with tarfile.open(bundle, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    assert DiskCache(tmp_path / "dest", max_bytes=2**20).import_bundle(bundle) == [key]
