"""A one-process gloo group for tests that trace or run collectives without spawning ranks."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch.distributed as dist


@contextlib.contextmanager
def single_rank_group() -> Iterator[str]:
    """A world of one gloo rank on an in-memory store (no sockets); yields its group name.

    With one rank every collective returns its input, so a graph runs the same before and after
    a pass; the tests then check the graph itself (which nodes a pass kept, and in what order).
    """
    if dist.is_initialized():  # somebody else's group: use it, leave it
        yield dist.group.WORLD.group_name
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD.group_name
    finally:
        dist.destroy_process_group()
