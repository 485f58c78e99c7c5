"""Pass plumbing: a pass is ``GraphModule -> bool`` (True if it changed the graph)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch.fx as fx

from ..errors import BUG_HINT, LoweringError

log = logging.getLogger(__name__)

GraphPass = Callable[[fx.GraphModule], bool]


def run_pipeline(gm: fx.GraphModule, passes: Sequence[GraphPass]) -> list[str]:
    """Run ``passes`` in order; return the names of those that changed the graph."""
    changed_by: list[str] = []
    done: list[str] = []
    for graph_pass in passes:
        name = graph_pass.__name__
        try:
            changed = graph_pass(gm)
        except Exception as e:
            raise LoweringError(
                f"pass {name} failed (after {', '.join(done) or 'no passes'}): {type(e).__name__}: {e}",
                hint=BUG_HINT,
            ) from e
        if changed:
            gm.graph.lint()
            gm.recompile()
            changed_by.append(name)
        log.debug("pass %s changed=%s", name, changed)
        done.append(name)
    return changed_by
