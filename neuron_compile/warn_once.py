"""Warn once per process: one helper for every "say this only the first time" in the package.

Each user keeps its own set of keys (``once_set()``), so its tests can reset or replace it;
``reset_warn_once()`` (called by ``neuron_compile.reset()``) clears every set made here.

Under torch.distributed every rank compiles the same graphs and would print the same warning N
times. ``warn`` (and so ``warn_once``) shows a warning on rank 0 only; on the other ranks of a
world of more than one rank it goes to the ``neuron_compile`` logger at INFO, prefixed with the
rank (``NEURON_COMPILE_LOG=info`` shows them). Filters such as ``-W error`` apply on rank 0.

Every warning is located at the user's line: the first frame outside torch, this package and the
standard library (the line that called the model, or ``loss.backward()``), not ours.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import sysconfig
import threading
import warnings
from collections.abc import Hashable
from types import FrameType

log = logging.getLogger("neuron_compile")
_lock = threading.Lock()
_sets: list[set] = []
_run_sets: list[set] = []


class NeuronCompileWarning(UserWarning):
    """Base of every warning neuron-compile shows: ``-W error::neuron_compile.warn_once.
    NeuronCompileWarning`` (or a pytest ``filterwarnings`` entry) selects them all."""


def once_set(*, per_run: bool = False) -> set:
    """A new, empty set of keys already reported; ``reset_warn_once()`` clears it, and with
    ``per_run`` so does ``reset_run_once()`` (``reset_metrics()``: a new run warns again)."""
    seen: set = set()
    with _lock:
        _sets.append(seen)
        if per_run:
            _run_sets.append(seen)
    return seen


def reset_run_once() -> None:
    """Forget the keys of every ``once_set(per_run=True)``."""
    with _lock:
        for seen in _run_sets:
            seen.clear()


def first_time(seen: set, key: Hashable) -> bool:
    """True the first time ``key`` is seen in ``seen`` (and records it), False after that."""
    with _lock:
        if key in seen:
            return False
        seen.add(key)
        return True


def warn(message: str, category: type[Warning] = NeuronCompileWarning) -> None:
    """``warnings.warn(message, category)`` on rank 0 (or without torch.distributed), located at
    the user's line (``user_frame()``); on the other ranks, an INFO log line."""
    from .collectives import world

    rank, size = world()
    if size > 1 and rank != 0:
        log.info("rank %d: %s: %s", rank, category.__name__, message)
        return
    frame = user_frame(sys._getframe(1))
    if frame is None:  # a worker thread of ours: the line the main thread waits in
        frame = user_frame(sys._current_frames().get(threading.main_thread().ident))
    if frame is None:  # nothing but library code anywhere: our caller
        warnings.warn(message, category, stacklevel=2)
        return
    f_globals = frame.f_globals
    # The frame's module registry, as warnings.warn uses: the "default" action shows a message
    # once per user line, and pytest.warns / catch_warnings reset it as they do for warn.
    warnings.warn_explicit(
        message,
        category,
        frame.f_code.co_filename,
        frame.f_lineno,
        module=f_globals.get("__name__", "<unknown>"),
        registry=f_globals.setdefault("__warningregistry__", {}),
        # No module_globals: with them, the source line is read through the module's loader,
        # which raises for `python -c` code (__main__'s BuiltinImporter); warnings.warn passes
        # none either and reads the line from the file.
    )


def warn_once(
    seen: set, key: Hashable, message: str, category: type[Warning] = NeuronCompileWarning
) -> bool:
    """``warn(message, category)`` the first time ``key`` is seen in ``seen``; returns whether it
    warned (on rank 0) or logged (other ranks)."""
    if not first_time(seen, key):
        return False
    warn(message, category)
    return True


@functools.cache
def _library_dirs() -> tuple[str, str, str]:
    """torch's directory, this package's and the standard library's (whose site-packages is
    not the standard library: a user's own libraries live there)."""
    import torch

    here = os.path.dirname(os.path.abspath(__file__))
    return (
        os.path.join(os.path.dirname(os.path.abspath(torch.__file__)), ""),
        os.path.join(here, ""),
        os.path.join(sysconfig.get_paths()["stdlib"], ""),
    )


def is_library_file(filename: str) -> bool:
    """Whether ``filename`` is torch's, this package's, the standard library's or generated
    code: never the user's (``user_frame``; ``frames.eager_frames`` skips such frames too)."""
    # <frozen importlib._bootstrap>, and the code FX generates for a GraphModule's forward
    if filename.startswith(("<frozen ", "<eval_with_key>")):
        return True
    torch_dir, our_dir, stdlib = _library_dirs()
    if filename.startswith((torch_dir, our_dir)):
        return True
    return filename.startswith(stdlib) and "-packages" not in filename[len(stdlib) :]


def user_frame(frame: FrameType | None) -> FrameType | None:
    """The first frame, from ``frame`` outwards, that is not torch's, ours or the standard
    library's: the user's line that triggered the compile (a warning there points at their
    code, as ``warnings.warn``'s ``skip_file_prefixes`` of Python 3.12 would)."""
    while frame is not None and is_library_file(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def reset_warn_once() -> None:
    """Forget every key of every ``once_set()``: each warning is shown again once."""
    with _lock:
        for seen in _sets:
            seen.clear()
