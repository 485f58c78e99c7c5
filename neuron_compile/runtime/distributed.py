"""XLA's CPU client across the torchrun processes, for modules with collectives.

Every rank runs the very module neuronx-cc would receive: jaxlib's distributed runtime
connects the ranks, and its gloo collectives carry the module's ``all_reduce`` / ``all_gather``
/ ``reduce_scatter`` / ``all_to_all`` over TCP. One client per set of ranks a module's
collectives reach (``collectives.reachable_ranks``: the world for data parallelism, a pipeline
stage's tensor-parallel group alone), one replica per rank: replica ``i`` is ``ranks[i]``, and
for a set smaller than the world ``over_ranks`` renumbers the module's replica groups that way.

Rendezvous rides on torch.distributed (which must be initialized: its store is where the first
of the ranks publishes the address of jaxlib's coordination service; torchrun's
``MASTER_PORT`` belongs to c10d). Connecting blocks until every rank of the set has joined, so
a client is created lazily, by the first graph with collectives over its ranks, which each of
them compiles at the same point. Graphs without collectives keep running on the local client
(``xla_cpu._client``).

Environment: ``NEURON_COMPILE_XLA_COORDINATOR=host:port`` pins the world runtime's coordination
service address (default: rank 0's address towards ``MASTER_ADDR``, on a free port).
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import socket
from typing import Any

from ..collectives import world
from ..errors import ExecutorError
from .client import Client, make_cpu_client

log = logging.getLogger(__name__)

COORDINATOR_ENV = "NEURON_COMPILE_XLA_COORDINATOR"
_STORE_KEY = "neuron_compile/xla_coordinator"
#: seconds a rank waits for the others to join (jaxlib's default is 5 minutes)
_JOIN_TIMEOUT_S = 600

_CLIENT: dict[tuple[int, ...], Any] = {}  # reached ranks -> Client


def distributed_client(ranks: tuple[int, ...]) -> Any:
    """The distributed ``xla_cpu.Client`` that ``ranks`` (global, sorted, this rank among them)
    share: replica ``i`` is rank ``ranks[i]``."""
    client = _CLIENT.get(ranks)
    if client is None:
        client = _CLIENT[ranks] = _connect(ranks)
    return client


def over_ranks(module_text: str, ranks: tuple[int, ...]) -> str:
    """``module_text`` as XLA runs it on the client of ``ranks``: replica ids are positions in
    ``ranks`` (``mhlo.num_replicas`` their count), and the groups of other ranks, which this
    rank's collectives never reach, are dropped. Only the numbering changes, never a value."""
    position = {r: i for i, r in enumerate(ranks)}

    def groups(m: re.Match) -> str:
        rows = [[int(r) for r in row.split(",")] for row in re.findall(r"\[([\d,\s]+)\]", m[1])]
        kept = [[position[r] for r in row] for row in rows if row[0] in position]
        text = ", ".join("[" + ", ".join(map(str, row)) + "]" for row in kept)
        return f"replica_groups = dense<[{text}]> : tensor<{len(kept)}x{len(kept[0])}xi64>"

    text = _REPLICA_GROUPS.sub(groups, module_text)
    return _NUM_REPLICAS.sub(f"mhlo.num_replicas = {len(ranks)} : i32", text)


_REPLICA_GROUPS = re.compile(r"replica_groups = dense<\[(.*?)\]> : tensor<\d+x\d+xi64>")
_NUM_REPLICAS = re.compile(r"mhlo\.num_replicas = \d+ : i32")


def _connect(ranks: tuple[int, ...]) -> Any:
    import torch.distributed as dist
    from jax._src.lib import _jax
    from jaxlib import xla_client

    rank, world_size = world()
    if rank not in ranks or ranks[-1] >= world_size:
        raise ExecutorError(
            f"a module with collectives over ranks {list(ranks)}, on rank {rank} of a world of "
            f"{world_size}",
            hint="initialize torch.distributed (torchrun) before running graphs with collectives",
        )
    node, size = ranks.index(rank), len(ranks)
    store = dist.distributed_c10d._get_default_store()
    store_key = f"{_STORE_KEY}/{','.join(map(str, ranks))}"  # one runtime per set of ranks
    service = None
    if node == 0:
        address = os.environ.get(COORDINATOR_ENV) if size == world_size else None
        address = address or f"{_own_address()}:{_free_port()}"
        bind = f"[::]:{address.rsplit(':', 1)[1]}"
        service = _jax.get_distributed_runtime_service(bind, size)
        store.set(store_key, address)
    address = store.get(store_key).decode()
    log.info(
        "rank %d: joining XLA's distributed runtime at %s (ranks %s)", rank, address, list(ranks)
    )
    client = _jax.get_distributed_runtime_client(
        address, node, init_timeout=_JOIN_TIMEOUT_S, shutdown_on_destruction=False
    )
    client.connect()
    collectives = _jax.make_gloo_tcp_collectives(distributed_client=client)
    backend = make_cpu_client(
        xla_client,
        distributed_client=client,
        node_id=node,
        num_nodes=size,
        collectives=collectives,
    )
    atexit.register(_shutdown, client, service)
    # Replica r is rank r's device: the module's replica groups are torch's global ranks.
    devices = sorted(backend.devices(), key=lambda d: d.process_index)
    local = backend.local_devices()[0]
    ids = [[d.id] for d in devices]

    def options() -> Any:
        import numpy as np

        opts = xla_client.CompileOptions()
        opts.num_replicas = size
        opts.num_partitions = 1
        opts.device_assignment = xla_client.DeviceAssignment.create(np.array(ids, np.int32))
        # The collectives' barriers (lowering/stablehlo/collectives.py) must reach the
        # scheduler: this pass drops them right after CSE on XLA CPU.
        opts.executable_build_options.debug_options.xla_disable_hlo_passes = "cse_barrier_expander"
        return opts

    return Client(backend, local, xla_client.DeviceList(tuple(devices)), options)


def _shutdown(client: Any, service: Any) -> None:
    """Leave the runtime in order: every rank disconnects (a barrier), then the first rank stops
    the service. A service gone first makes jaxlib abort the ranks still connected."""
    try:
        client.shutdown()
    except Exception as e:  # another rank died: nothing left to leave cleanly
        log.debug("XLA distributed client shutdown: %s", e)
    if service is not None:
        service.shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _own_address() -> str:
    """This host's address as the other ranks reach it: the interface that routes to
    ``MASTER_ADDR`` (no packet is sent), or loopback on a single host."""
    master = os.environ.get("MASTER_ADDR", "127.0.0.1")
    if master in ("localhost", "127.0.0.1", "::1"):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((master, 1))
            return s.getsockname()[0]
        except OSError:
            return socket.gethostbyname(socket.gethostname())
