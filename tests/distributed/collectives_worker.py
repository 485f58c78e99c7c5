"""One rank of the collective-lowering checks (``test_collectives.py`` starts the ranks).

Run under torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). Each case runs a
function eagerly and compiled with ``backend="neuron"`` and prints one JSON line per rank:
whether every output matched eager bit for bit, the fallback ops of each compiled graph, and the
replica groups each graph's collectives were lowered with. Values are small integers in float32,
so every sum is exact in any order and "bit for bit" is the right bar.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import warnings
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

import neuron_compile
from neuron_compile import events


def _ints(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(rank)
    return torch.randint(-8, 9, shape, generator=g).to(dtype) + rank


def world_ops(group: dist.ProcessGroup) -> Callable[..., tuple[torch.Tensor, ...]]:
    def fn(x: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, ...]:
        s = funcol.all_reduce(x * 2, "sum", group)
        mx = funcol.all_reduce(x, "max", group)
        mn = funcol.all_reduce(x - 1, "min", group)
        p = funcol.all_reduce(torch.sign(x) + 2, "product", group)
        avg = funcol.all_reduce(x, "avg", group)
        g = funcol.all_gather_tensor(s, 0, group)
        rs = funcol.reduce_scatter_tensor(g, "sum", 0, group)
        b = funcol.broadcast(x + 3, 1, group)
        a2a = funcol.all_to_all_single(g, None, None, group)
        ni = funcol.all_reduce(n, "sum", group)
        coalesced = [
            *funcol.all_reduce_coalesced([x, x * 3], "sum", group),
            *funcol.all_gather_into_tensor_coalesced([x, x - 2], group),
            *funcol.reduce_scatter_tensor_coalesced([g, g + 1], "sum", [0, 0], group),
        ]
        autograd_forms = [  # the forward of the autograd-aware ops
            funcol.reduce_scatter_tensor_autograd(g, "sum", 0, group),
            funcol.all_to_all_single_autograd(g, None, None, group),
        ]
        return s, mx, mn, p, avg, g, rs, b, a2a, ni, *coalesced, *autograd_forms

    return fn


def mesh_ops(mesh: object) -> Callable[..., tuple[torch.Tensor, ...]]:
    dp, tp = mesh.get_group("dp"), mesh.get_group("tp")

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a = funcol.all_reduce(x, "sum", tp)
        b = funcol.all_gather_tensor(a * 2, 0, dp)
        c = funcol.reduce_scatter_tensor(b, "sum", 0, tp)
        return a, b, c

    return fn


def rank_constants(group: dist.ProcessGroup) -> Callable[..., list[torch.Tensor]]:
    """Collectives over values that are constants of each rank's own graph: XLA, which assumes
    every replica runs one module, folded ``all_reduce(sum)`` of a constant into the constant
    times the group size, and ran the ranks' unordered collectives in different orders."""
    rank = dist.get_rank()

    def fn(x: torch.Tensor) -> list[torch.Tensor]:
        c = torch.full((3,), float(rank + 1))
        outs = [x + funcol.all_reduce(c, op, group) for op in ("sum", "max", "min", "product")]
        outs.append(funcol.all_gather_tensor(c * 2, 0, group))
        outs.append(funcol.reduce_scatter_tensor(torch.full((4,), float(rank)), "sum", 0, group))
        outs.append(funcol.all_to_all_single(torch.arange(4.0) + 10 * rank, None, None, group))
        outs.append(funcol.broadcast(c, 1, group))
        return outs

    return fn


def stage_ops(
    group: dist.ProcessGroup, alone: dist.ProcessGroup
) -> Callable[..., tuple[torch.Tensor, ...]]:
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return funcol.all_reduce(x * 2, "sum", group), funcol.all_reduce(x - 1, "max", alone)

    return fn


def no_rows(group: dist.ProcessGroup) -> Callable[..., tuple[torch.Tensor, ...]]:
    """Gathers and reduce-scatters of tensors with no rows (StableHLO rejects a zero-size
    all_gather_dim / scatter dimension) between collectives that have rows."""

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a = funcol.all_reduce(x, "sum", group)
        g = funcol.all_gather_tensor(x[:0] + 1, 0, group)
        rs = funcol.reduce_scatter_tensor(a[:0] * 2, "sum", 0, group)
        return a, g, rs, funcol.all_gather_tensor(a + 1, 0, group)

    return fn


def saved_across_clients(group: dist.ProcessGroup) -> Callable[..., torch.Tensor]:
    """A forward with a collective whose backward has none: the saved activation, an array of
    the distributed client, feeds a graph on the local client."""

    def fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        gathered = funcol.all_gather_tensor_autograd(x, 0, group)
        return (torch.relu(gathered) @ w).sum()

    return fn


def rank_folds(group: dist.ProcessGroup) -> Callable[..., tuple[torch.Tensor, ...]]:
    """Two collectives whose operands fold to the input itself on rank 0 (``x * 1``, ``x + 0``)
    and not on rank 1: only the barriers keep them in one order on both ranks."""
    rank = dist.get_rank()

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a = funcol.all_reduce(x * (rank + 1), "sum", group)
        return a, funcol.all_reduce(x + rank, "max", group)

    return fn


def _run(fn: Callable[..., object], *args: torch.Tensor) -> dict[str, object]:
    groups: list[list[list[int]]] = []

    def seen(event: object) -> None:
        if isinstance(event, events.GraphLowered):
            groups.extend([list(map(list, c.replica_groups)) for c in event.lowered.collectives])

    neuron_compile.reset_metrics()
    eager = fn(*args)
    with events.subscribed(seen, events.GraphLowered):
        compiled_fn = torch.compile(fn, backend="neuron")
        compiled_fn(*args)  # compiles
        compiled = compiled_fn(*args)
    eager, compiled = _as_tuple(eager), _as_tuple(compiled)
    return {
        "equal": [bool(torch.equal(e, c)) for e, c in zip(eager, compiled, strict=True)],
        "dtypes": [str(c.dtype) for c in compiled],
        "fallback": [r.fallback_ops for r in neuron_compile.metrics()],
        "graphs": len(neuron_compile.metrics()),
        "sources": [r.cache_source for r in neuron_compile.metrics()],
        "collectives": [r.collectives for r in neuron_compile.metrics()],
        "groups": groups,
    }


def _as_tuple(out: object) -> tuple[torch.Tensor, ...]:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _grads(fn: Callable[..., torch.Tensor], x: torch.Tensor, w: torch.Tensor) -> list:
    w = w.clone().requires_grad_()
    fn(x, w).backward()
    return [w.grad]


class _Logged(logging.Handler):
    """neuron_compile's log warnings (a cached executable that would not load, ...)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def main(case: str) -> None:
    logged = _Logged()
    logging.getLogger("neuron_compile").addHandler(logged)
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    line: dict[str, object] = {"rank": rank}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # funcol's all_gather_tensor rename
        if case == "world":
            line.update(_run(world_ops(dist.group.WORLD), _ints(2 * size, 3), _ints(3).long()))
        elif case == "mesh":
            mesh = init_device_mesh("cpu", (2, size // 2), mesh_dim_names=("dp", "tp"))
            line.update(_run(mesh_ops(mesh), _ints(2 * size, 3)))
            line["mesh"] = mesh.mesh.tolist()
            # Not row-major: the columns [0, 1] and [3, 2] are no translates of each other's
            # rows, only the mesh itself knows the other ranks' groups.
            custom = DeviceMesh("cpu", [[0, 3], [1, 2]], mesh_dim_names=("dp", "tp"))
            torch._dynamo.reset()
            found = _run(mesh_ops(custom), _ints(2 * size, 3))
            line["custom"] = {k: found[k] for k in ("equal", "fallback", "groups")}
            line["custom"]["log_warnings"] = []  # collected once, for the whole line
        elif case == "no_rows":
            line.update(_run(no_rows(dist.group.WORLD), _ints(2 * size, 3)))
        elif case == "one_stage":
            # Pipeline-like: only the first subgroup ever runs a compiled collective (over its
            # own group, then over a group of one rank); the others wait in c10d.
            sub, _ = dist.new_subgroups(group_size=2)
            alone, _ = dist.new_subgroups(group_size=1)
            if rank < 2:
                line.update(_run(stage_ops(sub, alone), _ints(4, 3)))
            else:
                line.update({"equal": [True] * 2, "fallback": [{}], "groups": []})
            dist.barrier()
        elif case == "folds":
            line.update(_run(rank_folds(dist.group.WORLD), _ints(4)))
        elif case == "any_size":  # the same shapes at every world size
            line.update(_run(stage_ops(dist.group.WORLD, dist.group.WORLD), _ints(4, 3)))
        elif case == "constants":
            line.update(_run(rank_constants(dist.group.WORLD), torch.zeros(3)))
        elif case == "saved":
            fn = saved_across_clients(dist.group.WORLD)
            x, w = _ints(2, 3), _ints(3, 4)
            eager = _grads(fn, x, w)
            compiled_fn = torch.compile(fn, backend="neuron")
            # three steps: the second and third run the backward's planned call
            steps = [_grads(compiled_fn, x, w) for _ in range(3)]
            line["equal"] = [
                bool(torch.equal(e, c))
                for grads in steps
                for e, c in zip(eager, grads, strict=True)
            ]
            line["fallback"] = [r.fallback_ops for r in neuron_compile.metrics()]
            line["graphs"] = len(neuron_compile.metrics())
    line["log_warnings"] = logged.messages
    print(json.dumps(line), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(sys.argv[1])
