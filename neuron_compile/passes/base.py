"""Pass plumbing: a pass is ``GraphModule -> bool`` (True if it changed the graph)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import torch.fx as fx

from ..errors import BUG_HINT, LoweringError, UnsupportedOpError

log = logging.getLogger(__name__)

GraphPass = Callable[[fx.GraphModule], bool]

LINT_ENV = "NEURON_COMPILE_LINT_EACH_PASS"  # read per pipeline run, like the other env vars


def run_pipeline(
    gm: fx.GraphModule,
    passes: Sequence[GraphPass],
    dump_to: Path | None = None,
    *,
    recompile: bool = True,
) -> list[str]:
    """Run ``passes`` in order; return the names of those that changed the graph.

    ``dump_to``: a directory that receives the graph before the passes (``00_input.fx.py``) and
    after each pass that changed it (``NN_<pass>.fx.py``), to bisect a pass that broke a graph.
    ``recompile=False`` leaves ``gm.forward`` stale (the graph itself is current): the lowering
    reads only the graph, and regenerating Python code costs as much as several passes.
    """
    changed_by: list[str] = []
    done: list[str] = []
    # Linting costs about as much as a pass: after each pass when debugging (names the pass that
    # broke the graph), else once at the end.
    lint_each = (
        dump_to is not None
        or os.environ.get(LINT_ENV, "") not in ("", "0")
        or log.isEnabledFor(logging.DEBUG)
    )
    _dump(dump_to, 0, "input", gm)
    for position, graph_pass in enumerate(passes, start=1):
        name = graph_pass.__name__
        try:
            changed = graph_pass(gm)
        except UnsupportedOpError:
            raise  # a pass refusing a construct it cannot compile exactly: the user's answer
        except Exception as e:
            raise LoweringError(
                f"pass {name} failed (after {', '.join(done) or 'no passes'}): {type(e).__name__}: {e}",
                hint=BUG_HINT,
            ) from e
        if changed:
            if lint_each:
                try:
                    gm.graph.lint()
                except Exception as e:
                    raise LoweringError(
                        f"pass {name} left the graph malformed: {e}", hint=BUG_HINT
                    ) from e
            changed_by.append(name)
            _dump(dump_to, position, name, gm)
        log.debug("pass %s changed=%s", name, changed)
        done.append(name)
    if changed_by and not lint_each:
        try:
            gm.graph.lint()
        except Exception as e:
            raise LoweringError(
                f"the graph is malformed after passes {', '.join(changed_by)}: {e}",
                hint=BUG_HINT + f"; set {LINT_ENV}=1 to lint after each pass",
            ) from e
    if changed_by and recompile:
        gm.recompile()
    return changed_by


def _dump(directory: Path | None, position: int, name: str, gm: fx.GraphModule) -> None:
    if directory is None:
        return
    try:  # a debugging aid never breaks a compile
        directory.mkdir(parents=True, exist_ok=True)
        gm.recompile()  # gm.code is generated from the graph at recompile
        (directory / f"{position:02d}_{name}.fx.py").write_text(gm.code)
    except OSError as e:
        log.warning("could not dump pass output to %s: %s", directory, e)
