"""XLA's CPU client across the torchrun processes, for modules with collectives.

Every rank runs the very module neuronx-cc would receive: jaxlib's distributed runtime
connects the ranks, and its gloo collectives carry the module's ``all_reduce`` / ``all_gather``
/ ``reduce_scatter`` / ``all_to_all`` over TCP. One replica per rank: replica ``r`` is rank
``r``'s device, so the module's ``replica_groups`` are torch's global ranks.

Rendezvous rides on torch.distributed (which must be initialized: its store is where rank 0
publishes the address of jaxlib's coordination service; torchrun's ``MASTER_PORT`` belongs to
c10d). Connecting blocks until every rank has joined, so the client is created lazily, by the
first graph with collectives, which SPMD training compiles on every rank at the same point.
Graphs without collectives keep running on the local client (``xla_cpu._client``).

Environment: ``NEURON_COMPILE_XLA_COORDINATOR=host:port`` pins the coordination service's
address (default: rank 0's address towards ``MASTER_ADDR``, on a free port).
"""

from __future__ import annotations

import atexit
import logging
import os
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

_CLIENT: dict[int, Any] = {}  # world size -> Client (one world per process at a time)


def distributed_client(replicas: int) -> Any:
    """The distributed ``xla_cpu.Client`` for a module over ``replicas`` ranks (the world)."""
    client = _CLIENT.get(replicas)
    if client is None:
        client = _CLIENT[replicas] = _connect(replicas)
    return client


def _connect(replicas: int) -> Any:
    import torch.distributed as dist
    from jax._src.lib import _jax
    from jaxlib import xla_client

    rank, size = world()
    if size != replicas:
        raise ExecutorError(
            f"a module with collectives over {replicas} ranks, in a world of {size}",
            hint="initialize torch.distributed (torchrun) before running graphs with collectives",
        )
    store = dist.distributed_c10d._get_default_store()
    service = None
    if rank == 0:
        address = os.environ.get(COORDINATOR_ENV) or f"{_own_address()}:{_free_port()}"
        bind = f"[::]:{address.rsplit(':', 1)[1]}"
        service = _jax.get_distributed_runtime_service(bind, size)
        store.set(_STORE_KEY, address)
    address = store.get(_STORE_KEY).decode()
    log.info("rank %d: joining XLA's distributed runtime at %s (%d ranks)", rank, address, size)
    client = _jax.get_distributed_runtime_client(
        address, rank, init_timeout=_JOIN_TIMEOUT_S, shutdown_on_destruction=False
    )
    client.connect()
    collectives = _jax.make_gloo_tcp_collectives(distributed_client=client)
    backend = make_cpu_client(
        xla_client,
        distributed_client=client,
        node_id=rank,
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
    """Leave the runtime in order: every rank disconnects (a barrier), then rank 0 stops the
    service. A service gone first makes jaxlib abort the ranks still connected."""
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
