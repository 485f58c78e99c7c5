"""The NEFF of one lowered graph: cached, compiled with neuronx-cc, collected for ``precompile``,
or skipped (compile-only without neuronx-cc). ``TrainiumTarget.compile`` asks here.

Above both the driver (``neuronx_cc.py``, standard library only, which precompile workers import)
and ``precompile.py``, so neither imports the other's caller.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from .. import artifact as artifact_mod
from ..cache.binding import NEFF_FILE
from ..warn_once import NeuronCompileWarning, first_time, once_set, warn
from . import neuronx_cc, precompile

log = logging.getLogger(__name__)

_said: set[str] = once_set()


class ToolchainWarning(NeuronCompileWarning):
    """A trn target compiles without part of the Neuron toolchain or device (no neuronx-cc: no
    NEFF; no device: NEFFs are built but the XLA CPU executor runs the graphs)."""


def _say_once(key: str, message: str) -> None:
    if not first_time(_said, key):
        return
    log.info(message)
    warn(f"neuron-compile: {message}", ToolchainWarning)


def neff_key(
    module_text: str, io_specs: object, *, artifact_form: str, cfg: Any, exe: str, input_name: str
) -> Any:
    """Cache key of a graph's NEFF: the graph key with target, LNC and ``$NEURON_CC_FLAGS``
    (``graph_key``'s own components) plus the compiler version, -O level and input form."""
    from ..cache.key import graph_key
    from ..targets import get_target

    target = get_target(cfg.target)  # a TrainiumTarget: only trn graphs get here
    return graph_key(
        module_text,
        io_specs=io_specs,
        artifact_form=artifact_form,
        target=str(target.neuronx_cc_target),
        lnc=str(cfg.lnc),
        flags=os.environ.get(neuronx_cc.ENV_FLAGS, ""),
    ).extend(
        entry="neff",
        neuronx_cc_version=neuronx_cc.compiler_version(exe),
        optlevel=str(cfg.optlevel),
        neuronx_cc_input=input_name,
    )


def neff_for_graph(
    text: str,
    io_specs: object,
    *,
    cfg: Any,
    graph_name: str,
    cache_name: str,
    disk: Any,
    device: bool,
) -> bytes | None:
    """NEFF of one lowered graph for ``cfg.target`` (a trn target), or None when none is made.

    - precompile collection (``neuron-compile precompile``): record a job, return None;
    - neuronx-cc present: the cached NEFF, or compile it now (negative entry on failure);
    - no neuronx-cc and no device (compile-only): verify the neuronx-cc input, say once that
      graphs stop there, return None; no neuronx-cc but a device: NC521.
    """
    input_name, data = artifact_mod.neuronx_cc_input(text, cfg.artifact)
    exe = neuronx_cc.find_neuronx_cc()
    if exe is None:
        if device:
            neuronx_cc.run_neuronx_cc(
                input_name, data, target=cfg.target, lnc=cfg.lnc, graph_name=graph_name
            )
        artifact_mod.artifact_text(data, "hlo" if input_name.endswith(".pb") else "bytecode")
        _say_once(
            "no-neuronx-cc",
            f"target {cfg.target} without neuronx-cc: graphs stop after their verified "
            f"artifacts ({input_name}); no NEFF is compiled ({neuronx_cc.not_found_reason()}); "
            "the XLA CPU executor runs them",
        )
        return None
    key = neff_key(
        text, io_specs, artifact_form=cfg.artifact, cfg=cfg, exe=exe, input_name=input_name
    )
    digest = key.digest()
    collect = precompile.collect_dir()
    if collect is not None:
        job = neuronx_cc.NeffJob(
            graph_name=graph_name,
            key=digest,
            components=key.components(),
            input_name=input_name,
            input_path="",
            target=cfg.target,
            lnc=int(cfg.lnc),
            optlevel=int(cfg.optlevel),
            flags=os.environ.get(neuronx_cc.ENV_FLAGS, ""),
            cache_name=cache_name,
        )
        entry = disk.get(digest) if disk is not None else None
        cached = len(entry.read(NEFF_FILE)) if entry is not None else 0
        precompile.record_job(collect, job, data, cached_neff_bytes=cached)
        return None
    if not device:
        _say_once(
            "compile-only",
            f"compile-only mode: no Neuron device, graphs are compiled to {cfg.target} NEFFs "
            "into the cache and run on the XLA CPU executor",
        )

    def build() -> dict[str, bytes]:
        neff, tail = neuronx_cc.run_neuronx_cc(
            input_name,
            data,
            target=cfg.target,
            lnc=int(cfg.lnc),
            optlevel=int(cfg.optlevel),
            flags=os.environ.get(neuronx_cc.ENV_FLAGS, ""),
            graph_name=graph_name,
            exe=exe,
        )
        return {NEFF_FILE: neff, neuronx_cc.LOG_FILE: tail.encode()}

    if disk is None:
        return build()[NEFF_FILE]
    files, source = disk.get_or_create(
        digest, build, graph_name=cache_name + ".neff", components=key.components()
    )
    log.debug("graph %s: NEFF from %s", graph_name, source)
    return files[NEFF_FILE]
