"""Failure bundles: a self-contained directory per failing graph that reproduces it without the
model.

Contents: ``graph.fx.py`` (the AOTAutograd graph's code), ``module.stablehlo.mlir`` (the emitted
module, when lowering got that far), ``inputs.json`` (names, shapes and dtypes of the graph inputs:
never values, so no weights), ``meta.json`` (error code, message, location, stage, versions,
options, ``NEURON_CC_FLAGS``, the exact neuronx-cc command if the failure came from it),
``error.txt`` and ``replay.py``.

``python replay.py`` replays the failing stage in a fresh process: exit 1 and the same error when
it reproduces, 0 when it no longer does, 2 when the stage cannot be replayed without the model
(lowering errors: the FX code is there to read). ``python replay.py --minimize`` also shrinks the
module with the delta-debugging minimizer and writes ``module.min.mlir``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .model import Location


@dataclass
class Failure:
    """A compile error with what a failure bundle needs."""

    error: BaseException
    graph: str
    kind: str
    fx_code: str | None = None
    inputs: list[dict[str, Any]] = field(default_factory=list)
    stablehlo: str | None = None
    flags: dict[str, Any] = field(default_factory=dict)
    location: Location | None = None


def stage(e: BaseException, f: Failure) -> str:
    """Where the failure happened, which decides how a bundle replays it."""
    code = getattr(e, "code", "")
    if code == "NC103":
        return "verify"
    if code == "NC301":
        return "executor"
    if code in ("NC101", "NC102"):
        return "lowering"
    if str(code).startswith("NC52") or "NCC_" in str(e):
        return "neuronx-cc"
    return "compile" if f.fx_code else "frame"


REPLAY = r'''#!/usr/bin/env python
"""Replay a neuron-compile failure without the model (written by `neuron-compile check`).

Exit status: 1 = the failure reproduces, 0 = it does not, 2 = this stage cannot be replayed here.
`--minimize` also shrinks module.stablehlo.mlir to module.min.mlir (delta debugging over ops).
"""

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
META = json.loads((HERE / "meta.json").read_text())


def main(argv):
    from neuron_compile.report import minimize as mz

    stage, code = META["stage"], META["code"]
    mlir = HERE / "module.stablehlo.mlir"
    if stage == "verify" and mlir.exists():
        expected = (META.get("verifier") or {}).get("message")
        fails = mz.verifier_fails_like(expected)
    elif stage == "executor" and mlir.exists():
        fails = mz.executor_fails
    else:
        print(f"[{code}] stage {stage!r} cannot be replayed without the model; read graph.fx.py "
              "and error.txt")
        return 2
    text = mlir.read_text()
    if not fails(text):
        print(f"[{code}] did not reproduce (fixed in this environment?)")
        return 0
    if stage == "verify":
        from neuron_compile.artifact import VerifyFailure, verify

        try:
            verify(text)
        except VerifyFailure as e:
            print(f"[{code}] reproduced: StableHLO verifier: line {e.line}: {e.message}")
    else:
        print(f"[{code}] reproduced: XLA CPU rejects the module")
    if "--minimize" in argv:
        small = mz.minimize(text, fails)
        (HERE / "module.min.mlir").write_text(small)
        print(f"minimized {mz.count_ops(text)} -> {mz.count_ops(small)} ops: module.min.mlir")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
'''


def _safe(name: str) -> str:
    return re.sub(r"[^\w.-]+", "_", name).strip("_") or "graph"


def _verifier(error: BaseException) -> dict[str, Any] | None:
    reason = getattr(error, "reason", None) or ""
    m = re.match(r"line (\d+): (.*)", reason, re.S)
    if m:
        return {"line": int(m.group(1)), "message": m.group(2).strip()}
    return {"line": None, "message": reason} if reason else None


def write_bundle(failure: Failure, root: str | os.PathLike, *, index: int = 0) -> Path:
    """Write ``failure``'s bundle under ``root``; return its directory."""
    from ..versions import versions

    e = failure.error
    code = getattr(e, "code", None) or "NC000"
    out = Path(root) / f"{index:02d}-{_safe(failure.graph)}-{code}"
    out.mkdir(parents=True, exist_ok=True)
    if failure.fx_code:
        (out / "graph.fx.py").write_text(failure.fx_code)
    if failure.stablehlo:
        (out / "module.stablehlo.mlir").write_text(failure.stablehlo)
    (out / "inputs.json").write_text(json.dumps(failure.inputs, indent=2))
    (out / "error.txt").write_text(f"{type(e).__name__}: {e}\n")
    command = getattr(e, "command", None) or getattr(e, "argv", None)
    meta = {
        "code": code,
        "error_type": type(e).__name__,
        "message": str(e),
        "graph": failure.graph,
        "kind": failure.kind,
        "stage": stage(e, failure),
        "where": str(failure.location) if failure.location else None,
        "verifier": _verifier(e) if code == "NC103" else None,
        "versions": versions(),
        "options": failure.flags,
        "env": {
            k: v
            for k, v in os.environ.items()
            if k.startswith("NEURON_COMPILE_") or k in ("NEURON_CC_FLAGS",)
        },
        "neuronx_cc_command": (" ".join(command) if isinstance(command, list | tuple) else command),
        "files": sorted(p.name for p in out.iterdir()) + ["meta.json", "replay.py"],
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=2, default=str))
    (out / "replay.py").write_text(REPLAY)
    return out
