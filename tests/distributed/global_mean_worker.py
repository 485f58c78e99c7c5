"""One gloo rank of issue 16's global mean, computed eagerly and compiled.

Run as ``python global_mean_worker.py PORT RANK`` (the test starts both ranks): prints one JSON
line ``{"rank", "eager", "compiled", "graphs", "pending_works"}``. Each rank is a plain process
that exits normally, so torch's exit-time report of unwaited collectives reaches its stderr.
"""

from __future__ import annotations

import json
import sys
import warnings

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import neuron_compile

WORLD_SIZE = 2


def mean_global(x: torch.Tensor) -> torch.Tensor:
    """The issue's function: the element count is a constant, reduced across ranks."""
    n = funcol.all_reduce(torch.tensor(float(x.numel())), "sum", dist.group.WORLD)
    s = funcol.all_reduce(x.sum(), "sum", dist.group.WORLD)
    return s / n


def _pending_works() -> int | None:
    """Collectives issued but never waited on (private torch API: None without it)."""
    size = getattr(torch._C._distributed_c10d, "_get_work_registry_size", None)
    return size() if size is not None else None


def main(port: int, rank: int) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE
    )
    try:
        # A different element count per rank: the local count (what the bug kept) is then
        # visibly not the global one. Small integers keep every sum exact in float32.
        x = torch.arange(3 + rank, dtype=torch.float32) - 2 * rank
        eager = mean_global(x)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # collectives compile now: no FallbackWarning
            compiled_fn = torch.compile(mean_global, backend="neuron")
            compiled = [compiled_fn(x) for _ in range(2)]  # the first call compiles
        line = {
            "rank": rank,
            "eager": eager.item(),
            "compiled": [c.item() for c in compiled],
            "graphs": len(neuron_compile.metrics()),
            "pending_works": _pending_works(),
        }
        print(json.dumps(line), flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
