"""What the executor needs of an XLA client: shared by the local and the distributed one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple


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
