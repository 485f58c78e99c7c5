"""Debug artifacts under ``NEURON_COMPILE_DUMP_DIR`` (off by default): one directory per graph."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch.fx as fx

log = logging.getLogger(__name__)


def versions() -> dict[str, str]:
    from importlib import metadata

    import jaxlib
    import torch

    from . import __version__
    from .artifact import stablehlo_version

    return {
        "neuron_compile": __version__,
        "torch": torch.__version__,
        "jax": metadata.version("jax"),
        "jaxlib": jaxlib.__version__,
        "stablehlo": stablehlo_version(),
    }


def dump_graph(
    dump_dir: str, name: str, gm: fx.GraphModule, text: str, artifact: bytes, meta: dict[str, Any]
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
