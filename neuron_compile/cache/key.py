"""Cache keys built from named components, so a miss can be explained component by component.

A graph's key names everything that decides what the compiler produces from it, and nothing
else: weights are graph inputs (never in the key), and device index, rank, hostname, working
directory and source locations never enter it (the emitter writes no MLIR locations), so two
ranks on two hosts share entries.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..versions import toolchain_versions

SCHEMA_VERSION = 1  # bump to orphan every old entry

#: Environment variable whose flags are handed to neuronx-cc (documented by AWS); part of the key.
NEURON_CC_FLAGS = "NEURON_CC_FLAGS"


@dataclass(frozen=True)
class CacheKey:
    parts: tuple[tuple[str, str], ...]

    def digest(self) -> str:
        """sha256 of the components as a sorted list: the same set of named components gives
        the same key whatever their order, so a manifest's ``components`` re-derive it."""
        return key_of_components(self.parts)

    def components(self) -> dict[str, str]:
        return dict(self.parts)

    def explain(self, other: CacheKey) -> list[str]:
        """Names of the components that differ between two keys (why a lookup missed)."""
        mine, theirs = dict(self.parts), dict(other.parts)
        return sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))

    def extend(self, **more: str) -> CacheKey:
        return CacheKey(self.parts + tuple(sorted(more.items())))


def key_of_components(parts: Iterable[tuple[str, str]] | dict[str, str]) -> str:
    """The key digest of named components (``CacheKey.digest``): what an entry's manifest must
    re-derive to be served under its key (binding.py)."""
    items = parts.items() if isinstance(parts, dict) else parts
    return hashlib.sha256(
        json.dumps(sorted([str(k), str(v)] for k, v in items)).encode()
    ).hexdigest()


def _sha(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


@functools.lru_cache(maxsize=1)
def package_source_hash() -> str:
    """sha256 over this package's own Python sources (relative path + bytes, sorted): any change
    to a lowering rule or pass must miss, even without a version bump."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def canonical_flags(flags: str | Iterable[str] | None) -> str:
    """Compiler flags in one canonical spelling: ``--a=1 --b`` and ``--b  --a 1`` are equal.

    Flags are order-insensitive for neuronx-cc except repeated ones, whose relative order is kept.
    """
    words = shlex.split(flags) if isinstance(flags, str) else list(flags or ())
    pairs: list[tuple[str, str]] = []
    i = 0
    while i < len(words):
        word = words[i]
        if word.startswith("-") and "=" in word:
            name, value = word.split("=", 1)
        elif word.startswith("-") and i + 1 < len(words) and not words[i + 1].startswith("-"):
            name, value = word, words[i + 1]
            i += 1
        else:
            name, value = word, ""
        pairs.append((name, value))
        i += 1
    pairs.sort(key=lambda p: p[0])  # stable: repeated flags keep their order
    return " ".join(f"{n}={v}" if v else n for n, v in pairs)


def graph_key(
    module_text: str,
    *,
    io_specs: object,
    artifact_form: str,
    target: str = "cpu",
    lnc: str = "-",
    flags: str | None = None,
    replica_groups: object = (),
) -> CacheKey:
    """Key of one lowered graph's artifacts: what neuronx-cc (or XLA) would compile.

    ``io_specs`` is any JSON-able description of inputs and outputs (shapes, dtypes, which
    outputs alias inputs). ``flags`` defaults to ``$NEURON_CC_FLAGS``.
    """
    parts = {
        **environment_components(artifact_form, target=target, lnc=lnc, flags=flags),
        "module": _sha(module_text),
        "io": _sha(json.dumps(io_specs, sort_keys=True, default=str)),
        "replica_groups": json.dumps(replica_groups, default=list),
    }
    return CacheKey(tuple(parts.items()))


def environment_components(
    artifact_form: str, *, target: str = "cpu", lnc: str = "-", flags: str | None = None
) -> dict[str, str]:
    """The key components that do not come from the graph: schema, this package's sources,
    toolchain versions, target, LNC, canonical flags (default ``$NEURON_CC_FLAGS``)."""
    if flags is None:
        flags = os.environ.get(NEURON_CC_FLAGS, "")
    return {
        "schema": str(SCHEMA_VERSION),
        "package": package_source_hash(),
        **toolchain_versions(),
        "target": target,
        "lnc": lnc,
        "flags": canonical_flags(flags),
        "artifact_form": artifact_form,
    }


@functools.lru_cache(maxsize=1)
def host_fingerprint() -> str:
    """CPU architecture and feature flags: an XLA CPU executable is compiled for the host's ISA
    extensions and is only reused on a machine that has the same ones."""
    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                flags = " ".join(sorted(line.split(":", 1)[1].split()))
                break
    except OSError:
        pass
    return _sha(f"{platform.machine()}|{flags}")[:16]


def executable_key(
    graph: CacheKey, executor: str, artifact: bytes, replicas: int = 1, ranks: tuple[int, ...] = ()
) -> CacheKey:
    """Key of a host-specific executable compiled from ``artifact`` (the artifact of ``graph``):
    the artifact's sha256 is a component, so an executable is only served for the exact bytes
    it was compiled from. An executable with collectives embeds its device assignment (one
    replica per rank it reaches, ``ranks``, this rank's device local): the world size, this rank
    and (when they are not the whole world) the ranks enter its key, never the artifact's."""
    key = graph.extend(executor=executor, host=host_fingerprint(), artifact=_sha(artifact))
    if replicas > 1:
        from ..collectives import world

        key = key.extend(replicas=str(replicas), replica=str(world()[0]))
        if ranks and ranks != tuple(range(replicas)):
            key = key.extend(ranks=",".join(map(str, ranks)))
    return key
