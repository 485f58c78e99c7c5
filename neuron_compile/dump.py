"""Debug artifacts under ``NEURON_COMPILE_DUMP_DIR`` (off by default): one directory per compiled
region (a graph's own name when it has one), written on the ``RegionCompiled`` compile event.

Under torch.distributed with more than one rank, each rank dumps below ``<dump_dir>/rank<k>/``
(``dump_root``): ranks compile graphs of the same names, and one shared folder per graph would
leave whichever rank wrote last."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch.fx as fx

from . import events
from .versions import versions

log = logging.getLogger(__name__)


def dump_root(cfg: Any) -> Path | None:
    """Where this process dumps: ``cfg.dump_dir``, or its ``rank<k>`` folder when
    torch.distributed runs more than one rank; None when dumps are off."""
    if not cfg.dump_dir:
        return None
    from .collectives import world

    rank, size = world()
    return Path(cfg.dump_dir) / f"rank{rank}" if size > 1 else Path(cfg.dump_dir)


def dump_path(cfg: Any, *parts: str) -> Path | None:
    """``dump_root(cfg) / parts...``, or None when dumps are off."""
    root = dump_root(cfg)
    return root.joinpath(*parts) if root is not None else None


def dump_graph(
    dump_dir: str | Path,
    name: str,
    gm: fx.GraphModule,
    text: str,
    artifact: bytes,
    meta: dict[str, Any],
) -> Path | None:
    """Write FX code, StableHLO text, the artifact and a JSON of specs/timings/versions.

    A failure to dump is a warning in the log, never an error: debugging aids must not break runs.
    """
    try:
        out = Path(dump_dir) / name
        out.mkdir(parents=True, exist_ok=True)
        (out / "graph.fx.py").write_text(gm.code)
        (out / "module.stablehlo.mlir").write_text(text)
        form = meta.get("artifact_form", "portable")
        # An HloModuleProto is not MLIR bytecode: name it as neuronx-cc's docs do.
        filename = "module.hlo.pb" if form == "hlo" else f"module.{form}.mlirbc"
        (out / filename).write_bytes(artifact)
        tmp = out / f".meta.{os.getpid()}.json"
        tmp.write_text(json.dumps({**meta, "versions": versions()}, indent=2, default=str))
        os.replace(tmp, out / "meta.json")
        log.info("dumped %s to %s", name, out)
        return out
    except OSError as e:
        log.warning("could not dump %s to %s: %s", name, dump_dir, e)
        return None


def _on_region_compiled(event: events.RegionCompiled) -> None:
    """Dump a compiled region when ``dump_dir`` is set (never on an AOT-cache hit: no FX graph)."""
    cfg = event.cfg
    root = dump_root(cfg)
    if root is None or event.gm is None:
        return
    from .artifact import pretty

    meta = {
        "name": event.name,
        "kind": event.kind,
        "inputs": [vars(s) for s in event.lowered.inputs],
        "outputs": [vars(o) for o in event.lowered.outputs],
        "timings": event.record.as_dict(),
        "artifact_form": cfg.artifact,
    }
    text = pretty(event.lowered.text) if cfg.verify else event.lowered.text
    event.gm.recompile()  # gm.code after the passes
    dump_graph(root, event.name, event.gm, text, event.artifact, meta)


events.subscribe(_on_region_compiled, events.RegionCompiled)
