"""SimpleFSDP in ~80 lines: fully sharded data parallel whose collectives are traced into the graph.

``simple_fsdp(module, mesh)`` stores every parameter as a DTensor sharded on dimension 0 over the
1-D data-parallel ``mesh`` and registers a parametrization (``torch.nn.utils.parametrize``) that
gathers it back with ``redistribute(..., [Replicate()])`` each time the module reads it. Under
``torch.compile`` the gather is an ``all_gather_into_tensor`` inside the forward graph, and its
transpose, a ``reduce_scatter_tensor`` of the gradient (marked ``Partial(sum)``), lands in the
backward graph: the compiler sees, schedules and lowers the communication, instead of running it
in hooks between graphs as FSDP2 (``fully_shard``) does.

The design is torchtitan's SimpleFSDP (``torchtitan/experiments/simple_fsdp``, moved to
``torchtitan/experiments/graph_trainer/simple_fsdp.py`` in torchtitan 0.3.0; paper: "SimpleFSDP:
Simpler Fully Sharded Data Parallel with torch.compile", Zhang et al., 2024). We do not depend on
torchtitan: 0.3.0 installs beside torch 2.13, but pulls in ~60 packages (datasets, wandb,
tensorboard, spmd_types, ...) and its module imports torchtitan's model protocols. This file keeps
the core idea only: no mixed precision, no HSDP, no ``_StridedShard`` mesh concatenation.

Tensor parallel composes (a 2-D mesh): apply ``parallelize_module`` on the "tp" mesh first, then
``simple_fsdp(model, mesh["dp"])``. A parameter that is already a DTensor is sharded by its *local*
(TP) shard over dp; the forward gathers that over dp and re-wraps it as the TP DTensor it was, so
the TP plan's collectives (on the tp groups) and FSDP's (on the dp groups) both reach the graph.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.placement_types import Placement
from torch.nn.utils import parametrize


class ReplicateComputation(nn.Module):
    """The parametrization: a dp-sharded DTensor in, the tensor the module computes with out."""

    def __init__(
        self,
        dp_mesh: DeviceMesh,
        tp_mesh: DeviceMesh | None = None,
        tp_placements: tuple[Placement, ...] = (),
    ) -> None:
        super().__init__()
        self.dp_mesh = dp_mesh
        self.tp_mesh = tp_mesh  # set when the parameter was a TP DTensor before sharding
        self.tp_placements = tp_placements

    def forward(self, sharded: DTensor) -> torch.Tensor:
        # Forward: all-gather over dp. Backward: the gradient arrives as a Partial(sum) (each dp
        # rank saw its own batch), so Partial -> Shard(0) is a reduce-scatter over dp.
        full = sharded.redistribute(self.dp_mesh, [Replicate()])
        local = full.to_local(grad_placements=[Partial("sum")])
        if self.tp_mesh is None:
            return local
        return DTensor.from_local(local, self.tp_mesh, self.tp_placements, run_check=False)


def simple_fsdp(module: nn.Module, mesh: DeviceMesh) -> nn.Module:
    """Shard every parameter of ``module`` (in place) over the 1-D data-parallel ``mesh``.

    Gradients of the stored (sharded) parameters are the sum over dp ranks, as FSDP's
    reduce-scatter gives; divide the loss by the dp size for a mean. Returns ``module``.
    """
    if mesh.ndim != 1:
        raise ValueError(f"simple_fsdp shards over a 1-D mesh; got {mesh.ndim} dims ({mesh})")
    for owner in list(module.modules()):
        for name, param in list(owner.named_parameters(recurse=False)):
            tp_mesh, tp_placements, local = None, (), param.data
            if isinstance(param, DTensor):  # already tensor parallel: shard its local part
                tp_mesh, tp_placements = param.device_mesh, param.placements
                local = param.to_local()
            sharded = distribute_tensor(local.detach(), mesh, [Shard(0)])
            setattr(owner, name, nn.Parameter(sharded, requires_grad=param.requires_grad))
            parametrize.register_parametrization(
                owner, name, ReplicateComputation(mesh, tp_mesh, tp_placements), unsafe=True
            )
    return module
