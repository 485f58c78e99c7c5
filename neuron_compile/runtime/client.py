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
