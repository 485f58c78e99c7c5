"""Several ranks, one report: the torchrun launch of ``check``/``precompile --nproc-per-node N``
and the merge of the ranks' reports.

The parent runs ``python -m torch.distributed.run --standalone --nproc-per-node N ...`` (torch's
own launcher: rendezvous on a free local port, ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/
``MASTER_ADDR``/``MASTER_PORT`` for every rank, the other ranks stopped when one fails) with
``NEURON_COMPILE_RANK_REPORT_DIR`` naming a temporary directory; each rank writes its report
there as ``rank<k>.json`` and the parent merges them (``merge_reports``).

Ranks that compile the same graph get the same cache key: that graph is one row listing its
ranks, and, with a shared cache, one compile (the others wait on the key's lock and read it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .model import Finding, GraphEntry, Report

#: Set by the parent for the ranks of ``check --nproc-per-node``: where each writes its report.
ENV_RANK_REPORT_DIR = "NEURON_COMPILE_RANK_REPORT_DIR"


def process_rank() -> tuple[int, int]:
    """``(rank, world_size)`` of this process: torch.distributed's when initialized, else
    torchrun's ``RANK``/``WORLD_SIZE`` (a script may compile before it creates its process group,
    or destroy it before the report is made), else ``(0, 1)``."""
    from ..collectives import world

    rank, size = world()
    if size > 1:
        return rank, size
    env_rank, env_size = os.environ.get("RANK", ""), os.environ.get("WORLD_SIZE", "")
    if env_rank.isdigit() and env_size.isdigit() and int(env_size) > 1:
        return int(env_rank), int(env_size)
    return 0, 1


def torchrun_command(nproc: int, argv: Sequence[str]) -> list[str]:
    """The command that runs ``argv`` (a script and its arguments, or ``-m module ...``) as
    ``nproc`` ranks on this host."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        *argv,
    ]


def run_ranks(
    nproc: int, argv: Sequence[str], env: dict[str, str] | None = None, stdout: Any = None
) -> int:
    """Run ``argv`` under torchrun as ``nproc`` ranks (output passes through, to ``stdout`` if
    given); its exit status."""
    command = torchrun_command(nproc, argv)
    env = {**os.environ, **(env or {})}
    return subprocess.run(command, env=env, stdout=stdout, check=False).returncode


def rank_report_path(directory: str | os.PathLike, rank: int) -> Path:
    return Path(directory) / f"rank{rank}.json"


def load_rank_reports(directory: str | os.PathLike, nproc: int) -> dict[int, Report]:
    """The reports the ranks wrote, by rank (a rank that died early wrote none)."""
    out = {}
    for rank in range(nproc):
        path = rank_report_path(directory, rank)
        if path.is_file():
            out[rank] = Report.from_dict(json.loads(path.read_text()))
    return out


def _graph_identity(g: GraphEntry) -> tuple:
    """Two ranks' rows are one graph when their cache keys match; a graph without a key (a
    failed one) by name, kind, status and size."""
    key = g.cache.get("key")
    if key:
        return ("key", key)
    return ("name", g.name, g.kind, g.status, g.node_count, tuple(sorted(g.fallback_ops.items())))


def _finding_identity(f: Finding, graph: str | None) -> tuple:
    loc = (f.location.file, f.location.line) if f.location else None
    return (f.category, f.code, f.message, loc, graph)


_NUMERICS_ORDER = (None, "random", "matched", "mismatch")  # the worst rank's status wins


def merge_reports(by_rank: Mapping[int, Report], world_size: int) -> Report:
    """One report for every rank's: a graph compiled under one cache key by several ranks is
    one row (the lowest rank's values) listing those ranks; identical findings are one finding
    listing their ranks, with the largest count of any one rank (N ranks hitting the same graph
    break is one graph break); cache counters are summed; crashes are kept per rank."""
    if not by_rank:
        raise ValueError("no rank wrote a report")
    first = by_rank[min(by_rank)]
    merged = Report(
        target=first.target,
        mode=first.mode,
        versions=dict(first.versions),
        created=first.created,
        duration_s=max(r.duration_s for r in by_rank.values()),
        world_size=world_size,
    )
    rows: dict[tuple, GraphEntry] = {}
    findings: dict[tuple, Finding] = {}
    crashes = []
    for rank in sorted(by_rank):
        rep = by_rank[rank]
        names: dict[str, str] = {}  # this rank's graph name -> the merged row's name
        for g in rep.graphs:
            ident = _graph_identity(g)
            row = rows.get(ident)
            if row is None:
                row = rows[ident] = GraphEntry(**{**vars(g), "ranks": []})
                merged.graphs.append(row)
            row.ranks = sorted({*row.ranks, *g.ranks})
            if _NUMERICS_ORDER.index(g.numerics) > _NUMERICS_ORDER.index(row.numerics):
                row.numerics = g.numerics
            names[g.name] = row.name
        for f in rep.findings:
            graph = names.get(f.graph, f.graph) if f.graph else None
            ident = _finding_identity(f, graph)
            known = findings.get(ident)
            if known is None:
                known = findings[ident] = Finding(**{**vars(f), "graph": graph, "ranks": []})
                merged.findings.append(known)
            known.ranks = sorted({*known.ranks, *f.ranks})
            known.count = max(known.count, f.count)
        for k, v in rep.cache.items():
            if isinstance(v, int | float) and not isinstance(v, bool):
                merged.cache[k] = merged.cache.get(k, 0) + v
        if rep.crash:
            crashes.append(f"rank {rank}: {rep.crash}")
    merged.crash = "; ".join(crashes) or None
    return merged
