"""neuron-compile: a torch.compile backend for AWS Trainium.

``torch.compile(model, backend="neuron")`` works after ``pip install`` without importing this
package (entry point). Importing it gives the public API below.
"""

from __future__ import annotations

import logging
import os
import warnings

from .versions import __version__

# XLA's C++ INFO lines ("PjRt-IFRT device count ...") are read once when jaxlib loads; keep them
# out of users' terminals unless they asked for them.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

from . import ops  # noqa: E402, F401  (registers neuron_compile:: ops, e.g. for unpickling)
from .backend import neuron_backend  # noqa: E402
from .config import NeuronConfig, load_config  # noqa: E402
from .errors import NeuronCompileError  # noqa: E402
from .fallback import clear_fallback_ops, get_fallback_ops  # noqa: E402
from .frames import EagerFrame, eager_frames  # noqa: E402
from .metrics import BucketRecord, GraphRecord, bucket_metrics, metrics, reset_metrics  # noqa: E402
from .shapes import RecompileWarning, mark_warmup_done, recompiles  # noqa: E402
from .state import reset  # noqa: E402


def __getattr__(name: str) -> object:
    # ``nki_op`` lives in a module only kernel authors need: load it on first use so that
    # ``import neuron_compile`` stays as cheap as it is.
    if name == "nki_op":
        from .trainium.kernels.nki import nki_op

        return nki_op
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _log_level(text: str) -> int | None:
    """``NEURON_COMPILE_LOG``'s level: a ``logging`` name (``debug``, ``info``...), a number,
    or a switch (``1``, ``true``, ``on``, ``yes``: ``info``). None for anything else."""
    text = text.strip().upper()
    if text in ("1", "TRUE", "ON", "YES"):
        return logging.INFO
    if text.isdigit():
        return int(text)
    level = logging.getLevelName(text)
    return level if isinstance(level, int) else None


def _configure_logging() -> None:
    raw = os.environ.get("NEURON_COMPILE_LOG", "")
    if not raw.strip():
        return
    level = _log_level(raw)
    if level is None:  # `import neuron_compile` must not fail over a log setting
        warnings.warn(
            f"NEURON_COMPILE_LOG={raw!r} is not a logging level (debug, info, warning, error, "
            "a number, or 1/true for info): logging stays as it is",
            RuntimeWarning,
            stacklevel=3,
        )
        return
    logger = logging.getLogger("neuron_compile")
    logger.setLevel(level)
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[%(name)s] %(levelname)s %(message)s"))
        logger.addHandler(handler)


_configure_logging()

__all__ = [
    "BucketRecord",
    "EagerFrame",
    "GraphRecord",
    "NeuronCompileError",
    "NeuronConfig",
    "RecompileWarning",
    "__version__",
    "bucket_metrics",
    "clear_fallback_ops",
    "eager_frames",
    "get_fallback_ops",
    "load_config",
    "mark_warmup_done",
    "metrics",
    "neuron_backend",
    "nki_op",
    "recompiles",
    "reset",
    "reset_metrics",
]
