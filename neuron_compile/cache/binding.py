"""Bind every cache entry to its key by content, so a consistent forgery is refused.

A manifest's checksum only proves the entry is whole: anyone who can write an entry can reseal
it. What ties an entry to the key it sits under is that the key is a digest of named components
(key.py) and those components are, in part, digests of the entry's own files:

- every entry holding one of our artifacts (graph artifact, executable, NEFF) must re-derive
  its key from its manifest's components: an entry moved or copied under another key is refused;
- a graph entry's ``module.stablehlo.mlir`` must hash to its ``module`` component (the
  artifact itself is checked against the module by the compiler before anything is compiled
  from it: compiler._executable);
- an executable entry's key names the sha256 of the artifact it was compiled from
  (``executable_key``): it is only looked up for, and served with, those exact bytes;
- an FX index entry's payload must name, in its graph key's components, the hash of its own
  module text, and those components must digest to the graph key its manifest records
  (fx_index.load_index re-derives the whole graph key from the payload's text and specs).

``binding_problem`` runs on every verified read (manifest.verify_files): the local tier, the
remote tier, bundle imports and ``neuron-compile cache verify``. Cheap: one sha256 over the module
text. Pure stdlib, like the store.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from .key import key_of_components

ARTIFACT_FILE = "artifact"
MODULE_FILE = "module.stablehlo.mlir"
EXECUTABLE_FILE = "executable.xla_cpu"
INDEX_FILE = "index.json"
NEFF_FILE = "model.neff"
#: Files whose presence makes an entry one of ours: its key must be re-derivable.
KEYED_FILES = frozenset({ARTIFACT_FILE, MODULE_FILE, EXECUTABLE_FILE, NEFF_FILE})


def self_keyed(manifest: dict[str, Any]) -> bool:
    """Whether the entry's key cannot be re-derived from its content: an FX index entry's key
    digests an FX graph the entry does not hold, so a whole index entry written for another
    graph binds as well as the genuine one. Such entries are trusted only from the local tier,
    a remote tier nobody else can write, or with the team key's signature (signing.py)."""
    return INDEX_FILE in (manifest.get("files") or {})


def module_digest(text: bytes | str) -> str:
    """``components["module"]`` of a module text (key.graph_key's definition)."""
    raw = text.decode() if isinstance(text, bytes) else text
    return hashlib.sha256(raw.encode()).hexdigest()


def binding_problem(key: str, manifest: dict[str, Any], files: dict[str, bytes]) -> str | None:
    """Why the entry ``files`` with ``manifest`` must not be served under ``key``, or None."""
    components = manifest.get("components") or {}
    if KEYED_FILES & files.keys():
        derived = key_of_components(components)
        if derived != key:
            return f"its components derive key {derived[:12]}, not {key[:12]}"
    if ARTIFACT_FILE in files and MODULE_FILE not in files:
        return f"{ARTIFACT_FILE} without the module it was built from"
    if MODULE_FILE in files:
        try:
            digest = module_digest(files[MODULE_FILE])
        except UnicodeDecodeError:
            return f"{MODULE_FILE} is not text"
        if digest != components.get("module"):
            return f"{MODULE_FILE} does not hash to the key's module component"
    if EXECUTABLE_FILE in files and "artifact" not in components:
        return "an executable that does not name the artifact it was compiled from"
    if INDEX_FILE in files:
        return _index_problem(files[INDEX_FILE], components)
    return None


def _index_problem(data: bytes, components: dict[str, Any]) -> str | None:
    try:
        payload = json.loads(data)
        parts = [(str(k), str(v)) for k, v in payload["graph_key"]]
        text = payload["text"]
    except (ValueError, KeyError, TypeError) as exc:
        return f"unreadable index payload ({type(exc).__name__})"
    if key_of_components(parts) != components.get("graph_key"):
        return "the index payload's graph key is not the one its manifest names"
    if module_digest(str(text)) != dict(parts).get("module"):
        return "the index payload's text does not hash to its graph key's module component"
    return None


def artifact_problem(manifest: dict[str, Any], files: dict[str, bytes]) -> str | None:
    """Why a graph entry's artifact is not the serialization of its (key-bound) module, or None.

    Not on the read path (it needs jaxlib and costs a serialization): the compiler runs the same
    check before it compiles an artifact read from a cache tier (compiler._executable), and
    ``neuron-compile cache verify`` runs this one on every graph entry."""
    if ARTIFACT_FILE not in files or MODULE_FILE not in files:
        return None
    from .. import artifact as artifact_mod  # lazy: jaxlib

    form = str((manifest.get("components") or {}).get("artifact_form", "portable"))
    try:
        rebuilt = artifact_mod.serialize(files[MODULE_FILE].decode(), form)
        # As XLA compiles them: an HloModuleProto embeds a per-process module id.
        as_run = artifact_mod.executable_input
        if as_run(rebuilt, form) == as_run(files[ARTIFACT_FILE], form):
            return None
    except Exception as exc:  # a module that does not serialize cannot be the artifact's source
        return f"its module does not serialize ({type(exc).__name__})"
    return f"{ARTIFACT_FILE} is not the serialization of {MODULE_FILE}"
