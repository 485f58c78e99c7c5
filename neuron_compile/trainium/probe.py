"""Is there a Trainium device here, and which generation? (standard library only)

The core calls ``detect`` through the ``neuron_compile.device_probes`` entry point when the target
is ``auto``; it must stay cheap and import nothing of ours, so that a cpu run never loads the
Trainium package beyond this module.
"""

from __future__ import annotations

import ctypes.util
import functools
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

#: EC2 instance-family prefix -> target (family from the DMI product name, i.e. the instance
#: type; docs/trainium-reference.md §R4).
FAMILY_TO_TARGET = {"trn2": "trn2", "trn3": "trn3"}


def has_device() -> bool:
    return os.path.exists("/dev/neuron0")


@functools.lru_cache(maxsize=1)
def runtime_library() -> str | None:
    """Path or soname of the Neuron runtime (``libnrt``), or None when it is not installed."""
    for candidate in ("/opt/aws/neuron/lib/libnrt.so.1", "/opt/aws/neuron/lib/libnrt.so"):
        if os.path.exists(candidate):
            return candidate
    return ctypes.util.find_library("nrt")


def instance_family() -> str | None:
    """``trn2`` / ``trn3`` / ... from the DMI product name (``trn2.48xlarge`` -> ``trn2``)."""
    try:
        product = Path("/sys/devices/virtual/dmi/id/product_name").read_text().strip()
    except OSError:
        return None
    family = product.split(".", 1)[0].rstrip("nu")  # trn2n / trn2u -> trn2
    return family or None


def detect() -> str | None:
    """The local device's target when a device *and* the runtime are present, else None. A
    device of a family without a target here (trn1, inf2) also yields None (the cpu target)."""
    if not (has_device() and runtime_library()):
        return None
    family = instance_family()
    target = FAMILY_TO_TARGET.get(family or "")
    if target is None:
        log.warning(
            "Neuron device found but instance family %r has no neuron-compile target; using cpu",
            family,
        )
    return target
