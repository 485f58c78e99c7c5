"""What the executor needs of an XLA client: shared by the local and the distributed one."""

from __future__ import annotations

import ctypes
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


#: Up to how many MiB a freed block stays in malloc's heap for the next call (0: malloc as is).
RETAIN_ENV = "NEURON_COMPILE_MALLOC_RETAIN_MB"
DEFAULT_RETAIN_MB = 1024
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8  # glibc's mallopt parameters


def retain_freed_blocks() -> bool:
    """Have glibc's malloc keep blocks up to ``NEURON_COMPILE_MALLOC_RETAIN_MB`` in its heap.

    XLA allocates each execution's temporaries as one block and frees it after the call. glibc
    serves a block over 32 MiB from fresh kernel pages (``mmap``) and unmaps it on ``free``, so
    every call page-faulted its whole temporary buffer again: ResNeXt's backward, 40 MiB of
    temporaries, took 10,000 page faults and 20 of its 39 ms in the kernel per call. With the
    mmap threshold (and the heap's trim threshold) above the block, the same pages serve every
    call (an occasional call still faults it in; the median call does not). One arena serves
    all threads, as the block may be allocated on XLA's worker threads. It applies process-wide,
    to eager's tensors too: freed memory up to that size stays mapped instead of returning to
    the system, and threads share one malloc lock. Returns whether malloc was tuned (glibc
    only)."""
    value = os.environ.get(RETAIN_ENV, "").strip()
    if value and not value.isdigit():
        from ..errors import OptionsError

        raise OptionsError(
            f"invalid {RETAIN_ENV}={value!r}", hint="a whole number of MiB, 0 to leave malloc as is"
        )
    megabytes = int(value) if value else DEFAULT_RETAIN_MB
    if megabytes <= 0:
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - glibc's mallopt parameters only
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    largest = 2**31 - 1  # mallopt takes an int
    size = min(megabytes << 20, largest)
    tuned = all(
        mallopt(parameter, value)
        for parameter, value in (
            (_M_MMAP_THRESHOLD, size),
            (_M_TRIM_THRESHOLD, min(2 * size, largest)),
            (_M_ARENA_MAX, 1),
        )
    )
    log.debug("malloc keeps freed blocks up to %d MiB: %s", size >> 20, tuned)
    return tuned


def make_cpu_client(xla_client: Any, threads: int | None = None, **kwargs: Any) -> Any:
    """``xla_client.make_cpu_client`` with ``threads`` (default: ``intra_op_threads()``) threads.
    jaxlib has no parameter for it: the variable is set for the constructor's call and restored
    after it."""
    threads = threads or intra_op_threads()
    retain_freed_blocks()  # before the client's threads first allocate, so they share the arena
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
