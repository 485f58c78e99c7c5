"""What makes an AOTAutogradCache entry trustworthy for aot_cache.py (docs/cache-security.md).

* The directory it is unpickled from (``directory_is_ours``). Entries are pickles, and loading a
  pickle runs whatever code it names. So the directory (``TORCHINDUCTOR_CACHE_DIR``, by default
  ``<tmp>/torchinductor_<user>``, which another local user can create first) and everything under
  its ``aotautograd/`` must be ours, writable by nobody else, with no symlink; otherwise the tier
  is skipped with one NC404 warning (warm starts still use our own disk cache, which never
  pickles). ``NEURON_COMPILE_CACHE_ALLOW_SHARED`` does not relax this.
* The frame it was saved for (``frame_key``). PyTorch does not tell ``post_compile`` the key an
  entry was found under, and nothing in the entry names it: another frame's entry copied under
  this frame's key would run the other frame's graphs. So an entry records a digest of what the
  key is made from, which the loading frame recomputes and compares (aot_cache._load).
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx

from .warn_once import first_time, once_set

log = logging.getLogger("neuron_compile.aot_cache")

_verified: set[str] = set()
_warned_unsafe: set[str] = once_set()


def directory_is_ours() -> bool:
    """Whether the AOTAutograd cache directory of this process is safe to unpickle from; warns
    (NC404, once per reason) when it is not."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    root = cache_dir()
    if root in _verified:  # once verified, no other (non-root) user can write below it
        return True
    why = unsafe_pickle_tree(root)
    if why is None:
        _verified.add(root)
    else:
        if first_time(_warned_unsafe, why):
            log.warning(
                "[NC404] not using PyTorch's AOTAutograd cache for warm starts: %s; frames are "
                "traced every process (give the directory to your user only: chmod 700, or set "
                "TORCHINDUCTOR_CACHE_DIR to a directory of your own)",
                why,
            )
    return why is None


def unsafe_pickle_tree(root: str) -> str | None:
    """Why ``root`` or its ``aotautograd/`` subtree is not safe to unpickle from, or None."""
    from .cache.store import unsafe_reason

    why = unsafe_reason(Path(root), allow_shared=False)
    if why is not None:
        return f"{root}: {why}"
    tree = Path(root) / "aotautograd"
    # Below a root only we can enter (PyTorch writes with the umask: 002 makes files group-
    # writable), modes cannot let anyone else in; owners and links still count.
    private = os.stat(root).st_mode & 0o077 == 0
    try:
        for top, dirs, files in os.walk(tree):
            for name in (top, *(os.path.join(top, n) for n in (*dirs, *files))):
                st = os.lstat(name)
                if stat.S_ISLNK(st.st_mode):
                    return f"{name} is a symlink"
                if st.st_uid != os.geteuid():
                    return f"{name} is owned by uid {st.st_uid}, not by you"
                if st.st_mode & 0o022 and not private:
                    return f"{name} is writable by group or others"
    except OSError as exc:
        return f"cannot inspect {tree}: {exc}"
    return None


def frame_key(gm: fx.GraphModule, args: Sequence[Any], tag: str, artifact: str) -> str | None:
    """Digest of what AOTAutograd's cache key is made from, recomputed cheaply (~1 ms on
    TinyGPT) by the frame that loads an entry: the Dynamo graph (``fx_index.index_key``: every
    node's op, target and arguments with their literal constants, small inline ``get_attr``
    constants by value; Dynamo's nodes carry ``example_value``, not the ``val`` it reads, so the
    argument specs below stand for the types), its nested graphs (higher-order ops) and the
    modules it calls (``repr``: their hyperparameters), each argument's dtype, shape, strides,
    ``requires_grad`` and device, the grad mode, and the cache key tag (config, toolchain and
    entry format). None when the graph cannot be keyed: nothing is then stored nor loaded."""
    from .cache.fx_index import index_key

    try:
        nested = _nested(gm, artifact)
        if nested is None:
            return None
        options = {
            "tag": tag,
            "grad": torch.is_grad_enabled(),
            "args": [_frame_arg(a) for a in args],
            "nested": nested,
        }
        return index_key(gm, artifact, options)
    except Exception as exc:  # an unusual graph or argument: never fail the compile for it
        log.debug("frame not keyed for the AOTAutograd cache: %s", exc)
        return None


def _nested(gm: fx.GraphModule, artifact: str) -> dict[str, str] | None:
    """Per submodule ``gm`` uses: a nested graph's key (its own nested graphs included), or a
    module's ``repr``; None if a nested graph cannot be keyed."""
    from .cache.fx_index import index_key

    nested: dict[str, str] = {}
    for node in gm.graph.nodes:
        if node.op not in ("get_attr", "call_module"):
            continue
        call = node.op == "call_module"
        sub = gm.get_submodule(node.target) if call else _graph_attr(gm, node.target)
        if isinstance(sub, fx.GraphModule):
            inner = _nested(sub, artifact)
            key = None if inner is None else index_key(sub, artifact, {"nested": inner})
            if key is None:
                return None
            nested[node.target] = key
        elif sub is not None:
            nested[node.target] = repr(sub)
    return nested


def _graph_attr(gm: fx.GraphModule, target: str) -> torch.nn.Module | None:
    """The submodule a ``get_attr`` names (a higher-order op's body), None for a tensor."""
    try:
        return gm.get_submodule(target)
    except AttributeError:
        return None


def _frame_arg(value: Any) -> Any:
    from .cache.fx_index import arg_spec

    if isinstance(value, torch.Tensor):
        shape, stride = (
            [d if isinstance(d, int) else -1 for d in t] for t in (value.shape, value.stride())
        )
        return [str(value.dtype), shape, stride, value.requires_grad, value.device.type]
    return arg_spec(value)
