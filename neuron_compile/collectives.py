"""Collectives in compiled graphs: which ranks take part in each one.

A functional collective names its process group by a string (``_c10d_functional.all_reduce(x,
"sum", "3")``); StableHLO names the replicas of every group at once (``replica_groups =
[[0, 1], [2, 3]]``), the same list in every rank's module, so that all ranks compile one module
and share one cache entry. ``replica_groups`` turns the name into that partition of the world:

1. the world group is one group of every rank;
2. a group of a live ``DeviceMesh`` (one of its dimensions, or a flattened set of them) takes its
   siblings from the mesh, as torch itself does when it creates them (``DeviceMesh._layout``);
3. any other group: its translates by whole group offsets, the layout every ``new_subgroups``
   and row-major mesh produces. When they do not tile the world the partition is unknown, and
   the collective is not lowered (``GroupPartitionError`` names the group).

Group order inside a group is the group's rank order (``get_process_group_ranks``), which is the
order ``all_gather`` concatenates in, both in c10d and in StableHLO.
"""

from __future__ import annotations

import gc
import logging
from functools import lru_cache

log = logging.getLogger(__name__)

Groups = tuple[tuple[int, ...], ...]


class GroupPartitionError(ValueError):
    """The partition of the world a process group belongs to cannot be established."""


def world() -> tuple[int, int]:
    """``(rank, world_size)`` of this process; ``(0, 1)`` without an initialized default group."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return 0, 1
    return dist.get_rank(), dist.get_world_size()


def reachable_ranks(partitions: list[Groups], rank: int) -> tuple[int, ...]:
    """The ranks ``rank`` exchanges data with, directly or through others, over the groups of
    ``partitions`` (each a partition of the world): its connected component, sorted. Every rank of
    the component computes the same one. A module's collectives only ever wait for these ranks,
    so only they must join the runtime that carries them (``runtime/distributed.py``): a pipeline
    stage's tensor-parallel group need not wait for the other stages."""
    reached, frontier = {rank}, [rank]
    while frontier:
        r = frontier.pop()
        for groups in partitions:
            for group in groups:
                if r in group:
                    new = set(group) - reached
                    reached |= new
                    frontier.extend(new)
    return tuple(sorted(reached))


def group_ranks(group_name: str) -> tuple[int, ...]:
    """Global ranks of the group named ``group_name``, in the group's rank order."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _resolve_process_group

    try:
        group = _resolve_process_group(group_name)
    except (RuntimeError, ValueError, KeyError) as e:
        raise GroupPartitionError(f"no process group named {group_name!r} ({e})") from None
    return tuple(dist.get_process_group_ranks(group))


def replica_groups(group_name: str) -> Groups:
    """The partition of the world ``group_name`` belongs to (see the module docstring)."""
    _, size = world()
    return _partition(group_name, group_ranks(group_name), size, _world_token())


def _world_token() -> int:
    """Tells worlds apart: each ``init_process_group`` makes a new default group object."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return 0
    return id(dist.distributed_c10d._get_default_group())


@lru_cache(maxsize=256)
def _partition(group_name: str, own: tuple[int, ...], world_size: int, _world: int) -> Groups:
    # Cached per world (``_world``): c10d reuses group names after destroy_process_group, and
    # resolving a mesh group scans the live objects, once per group and world.
    if len(own) == world_size:
        return (own,)
    for source, groups in ((_mesh_groups, "a DeviceMesh"), (_translated_groups, "translates")):
        found = source(group_name, own, world_size)
        if found is not None:
            log.debug(
                "process group %s %s: replica groups %s from %s", group_name, own, found, groups
            )
            _check_partition(group_name, own, found, world_size)
            return found
    raise GroupPartitionError(
        f"process group {group_name!r} (ranks {list(own)}) is not a DeviceMesh dimension and its "
        f"translates do not tile the {world_size} ranks, so the other ranks' groups are unknown; "
        "create it with init_device_mesh (or new_subgroups) so every rank's group is known"
    )


def _check_partition(name: str, own: tuple[int, ...], groups: Groups, world_size: int) -> None:
    flat = sorted(r for g in groups for r in g)
    if flat != list(range(world_size)) or own not in groups or len({len(g) for g in groups}) != 1:
        raise GroupPartitionError(
            f"process group {name!r} (ranks {list(own)}): derived groups {groups} do not "
            f"partition the {world_size} ranks into equal groups containing it"
        )


def _mesh_groups(name: str, own: tuple[int, ...], world_size: int) -> Groups | None:
    """The sibling groups of ``name`` in a live DeviceMesh that created it, else None."""
    from torch.utils._python_dispatch import _disable_current_modes

    try:
        from torch.distributed._mesh_layout import _MeshLayout
        from torch.distributed.device_mesh import DeviceMesh
    except ImportError:  # pragma: no cover - a torch without DeviceMesh layouts
        return None
    # By MRO, not isinstance: DeviceMesh's metaclass hook runs on every object of the process
    # otherwise, and touches deprecated torch objects (FutureWarnings) on the way.
    for mesh in (o for o in gc.get_objects() if DeviceMesh in type(o).__mro__):
        names = getattr(mesh, "_dim_group_names", None) or []
        if name not in names:
            continue
        layout = mesh._layout[names.index(name)]
        # Called from the compiler, under AOTAutograd's FakeTensorMode: the mesh's rank map is
        # a real tensor, read outside every dispatch mode.
        with _disable_current_modes():
            ranks = _MeshLayout([layout]).remap_to_tensor(mesh._rank_map)
            rows = ranks.reshape(-1, layout.numel()).tolist()
        # new_group sorts a group's ranks: that is its rank order, the order all_gather uses.
        groups = tuple(tuple(sorted(int(r) for r in row)) for row in rows)
        if own in groups:
            return groups
    return None


def _translated_groups(name: str, own: tuple[int, ...], world_size: int) -> Groups | None:
    """Translates of ``own`` tiling ``range(world_size)`` (greedy from the smallest free rank),
    else None. Exact for every row-major mesh: its groups along a set of dimensions are the
    translates of the one through rank 0 by the other dimensions' offsets."""
    offsets = [r - own[0] for r in own]
    free = set(range(world_size))
    groups = []
    while free:
        start = min(free)
        group = tuple(start + o for o in offsets)
        if not free.issuperset(group):
            return None
        free.difference_update(group)
        groups.append(group)
    return tuple(sorted(groups))


def group_name_of(node: object) -> str | None:
    """The ``group_name`` argument of a collective FX node, else None. Dynamo's graphs call the
    op packet (``_c10d_functional.all_reduce``), AOTAutograd's the overload (``.default``)."""
    from torch._ops import OpOverloadPacket

    target = getattr(node, "target", None)
    if isinstance(target, OpOverloadPacket):
        target = getattr(target, "default", None)
    schema = getattr(target, "_schema", None)
    if schema is None or getattr(node, "op", None) != "call_function":
        return None
    for i, argument in enumerate(schema.arguments):
        if argument.name == "group_name":
            args, kwargs = node.args, node.kwargs  # type: ignore[attr-defined]
            return str(args[i] if i < len(args) else kwargs.get("group_name"))
    return None


def graph_replica_groups(gm: object) -> list[object]:
    """What each collective of ``gm`` (in graph order) resolves to now: its partition, or why
    none (the FX-level cache key: a group name is a per-process handle)."""
    found: list[object] = []
    for node in gm.graph.nodes:  # type: ignore[attr-defined]
        name = group_name_of(node)
        if name is None:
            continue
        try:
            found.append(replica_groups(name))
        except GroupPartitionError as e:
            found.append(str(e))
    return found
