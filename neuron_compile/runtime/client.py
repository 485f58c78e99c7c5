"""What the executor needs of an XLA client: shared by the local and the distributed one."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any, NamedTuple

log = logging.getLogger(__name__)


class Client(NamedTuple):
    """An XLA client and what compiling for it takes."""

    backend: Any
    device: Any  # this process's device: inputs are placed, and results read, there
    devices: Any  # DeviceList an executable is compiled for
    options: Callable[[], Any]  # fresh CompileOptions


#: ``make_cpu_client(asynchronous=...)`` for every client we make. Asynchronous execution runs
#: each call on XLA's worker threads, which then release the call's inputs there: torch tensors
#: imported through dlpack, whose release takes the GIL. A process that exits while a worker still
#: holds one aborts ("terminate called without an active exception": the worker thread, asking
#: for the GIL of a finalizing interpreter, is unwound through C++ frames). Run synchronously,
#: the call and the release both happen on the calling thread, inside the Python call.
ASYNCHRONOUS_EXECUTION = False


#: Environment variables jaxlib's CPU client reads, once, when it is created, for the size of
#: its intra-op thread pool (``DefaultThreadPoolSize`` in XLA's ``cpu_client.cc``: the first of
#: them that is set, else every schedulable core).
THREAD_ENV_VARS = ("PJRT_NPROC", "NPROC")


def intra_op_threads() -> int:
    """How many threads a client made now runs each execution on: the user's ``PJRT_NPROC`` or
    ``NPROC`` when set, else ``torch.get_num_threads()``, so a graph runs on as many threads as
    eager PyTorch in the same process would (``torch.set_num_threads`` before the first compile
    applies to both)."""
    for name in THREAD_ENV_VARS:
        value = os.environ.get(name, "")
        if value.strip().isdigit():
            return max(1, int(value))
    import torch

    return max(1, torch.get_num_threads())


def make_cpu_client(xla_client: Any, **kwargs: Any) -> Any:
    """``xla_client.make_cpu_client`` with ``intra_op_threads()`` threads. jaxlib has no
    parameter for it: the variable is set for the constructor's call and restored after it."""
    threads = intra_op_threads()
    saved = os.environ.get(THREAD_ENV_VARS[0])
    os.environ[THREAD_ENV_VARS[0]] = str(threads)
    try:
        backend = xla_client.make_cpu_client(asynchronous=ASYNCHRONOUS_EXECUTION, **kwargs)
    finally:
        if saved is None:
            del os.environ[THREAD_ENV_VARS[0]]
        else:
            os.environ[THREAD_ENV_VARS[0]] = saved
    log.debug("XLA CPU client: %d intra-op threads", threads)
    return backend
