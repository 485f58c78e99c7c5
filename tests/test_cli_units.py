"""Sizes the CLI prints: one formatter, and the same number for the same cache everywhere.

``neuron-compile info`` used to print ``366.8 of 10 GiB`` for a cache ``cache du`` measured at
384,622,729 bytes (366.8 MiB). Both now walk the cache once the same way (``usage()``) and print
through ``format_bytes``; ``--json`` keeps exact byte counts.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from neuron_compile.cache.maintenance import format_bytes

TINY_COMPILE = textwrap.dedent(
    """
    import torch

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 3)

        def forward(self, x):
            return self.lin(x).relu()

    torch.compile(Tiny(), backend="neuron")(torch.randn(2, 4)).sum().backward()
    import neuron_compile
    print(*[r.name for r in neuron_compile.metrics()])
    """
)


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1536, "1.5 KiB"),
        (384_622_729, "366.8 MiB"),
        (2**20 - 1, "1.0 MiB"),  # rounds up into the next unit, never "1024.0 KiB"
        (10 * 2**30, "10.0 GiB"),
        (3 * 2**40, "3.0 TiB"),
    ],
)
def test_format_bytes_uses_binary_units(size, text):
    assert format_bytes(size) == text


def _run(*args: str, env: dict[str, str]) -> str:
    proc = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def filled_cache(tmp_path_factory) -> tuple[Path, dict[str, str], list[str]]:
    """A cache holding the entries of one real compile (forward and backward of a tiny model)."""
    tmp = tmp_path_factory.mktemp("units")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEURON_COMPILE_")}
    env.update(
        NEURON_COMPILE_CACHE_DIR=str(tmp / "nc"),
        TORCHINDUCTOR_CACHE_DIR=str(tmp / "inductor"),
        NEURON_COMPILE_TARGET="cpu",
    )
    names = _run("-c", TINY_COMPILE, env=env).split()
    assert names == ["Tiny_0_forward_0", "Tiny_0_backward_0"]
    return tmp / "nc", env, names


def _cli(*args: str, env: dict[str, str]) -> str:
    return _run("-m", "neuron_compile", *args, env=env)


def test_info_and_cache_du_report_the_same_size(filled_cache):
    root, env, _names = filled_cache
    du = json.loads(_cli("cache", "du", "--json", env=env))
    info = json.loads(_cli("info", "--json", env=env))["cache"]
    assert du["entries"] >= 4 and du["bytes"] > 1024  # artifacts, indexes, executables
    assert (info["entries"], info["total_bytes"], info["root"]) == (
        du["entries"],
        du["bytes"],
        str(root),
    )
    human = format_bytes(du["bytes"])
    assert re.fullmatch(r"\d+\.\d (KiB|MiB)", human)
    info_line = next(ln for ln in _cli("info", env=env).splitlines() if ln.startswith("cache "))
    assert f"{du['entries']} entries, {human} of 10.0 GiB" in info_line
    du_line = _cli("cache", "du", env=env).strip()
    assert du_line.startswith(f"{human} ({du['bytes']:,} bytes) in {du['entries']} entries")
    assert du_line.endswith("max 10.0 GiB")


def test_cache_ls_has_a_header_and_explains_cache_names(filled_cache):
    _root, env, names = filled_cache
    lines = _cli("cache", "ls", env=env).splitlines()
    assert lines[0].split() == ["key", "artifacts", "compile", "graph", "(cache", "name)"]
    listed = {ln.split()[-1] for ln in lines[1:] if re.match(r"[0-9a-f]{16}  ", ln)}
    # metrics() says Tiny_0_forward_0; the cache drops the per-process frame counter
    assert {"Tiny_forward_0", "Tiny_backward_0"} <= listed
    assert not any(name in listed for name in names)
    note = " ".join(lines)
    assert "TinyGPT_0_forward_0 -> TinyGPT_forward_0" in note and "metrics()" in note
    sizes = [ln.split()[1:3] for ln in lines[1:] if re.match(r"[0-9a-f]{16}  ", ln)]
    assert sizes and all(unit in ("B", "KiB", "MiB") for _n, unit in sizes)


def test_cache_verify_summarises_what_it_checked(filled_cache, tmp_path):
    root, env, _names = filled_cache
    du = json.loads(_cli("cache", "du", "--json", env=env))
    out = _cli("cache", "verify", env=env).strip()
    assert out == (
        f"checked {du['entries']} entries ({format_bytes(du['bytes'])}) in {root}: all good"
    )
    report = json.loads(_cli("cache", "verify", "--json", env=env))
    assert (report["entries"], report["bytes"], report["bad"], report["ok"]) == (
        du["entries"],
        du["bytes"],
        0,
        True,
    )


def test_cache_verify_counts_bad_entries(tmp_path):
    from neuron_compile.cache.store import DiskCache
    from tests.cache.procs import key_of, payload

    cache = DiskCache(tmp_path / "c")
    good, bad = key_of("units-good"), key_of("units-bad")
    for key in (good, bad):
        cache.put(key, payload(key), graph_name="g", components={})
    (cache.get(bad).path / "part0.bin").write_bytes(b"flipped")
    entries, size = cache.usage()
    proc = subprocess.run(
        [sys.executable, "-m", "neuron_compile", "cache", "verify", "--dir", str(cache.root)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    last = proc.stdout.strip().splitlines()[-1]
    assert last == f"checked 2 entries ({format_bytes(size)}) in {cache.root}: 1 bad"
    assert entries == 2
