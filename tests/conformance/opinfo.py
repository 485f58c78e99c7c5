"""PyTorch's OpInfo database for the conformance harness: loading, selection, scope, samples,
and the expectations file."""

from __future__ import annotations

import itertools
import re
import sys
import tomllib
import types
import unittest
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

EXPECTATIONS = Path(__file__).with_name("expectations.toml")
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int32": torch.int32,
    "int64": torch.int64,
    "bool": torch.bool,
}
# OpInfo names whose outputs are random or uninitialized: eager parity is not defined for them
# (RNG ops are checked statistically elsewhere, as issue 3 allows).
_NONDETERMINISTIC = re.compile(
    r"(^|[._])(rand|randn|randint|bernoulli|normal|uniform|multinomial|exponential|geometric|"
    r"cauchy|log_normal|dropout\w*|rrelu|empty\w*|new_empty\w*|feature_alpha_dropout\w*|"
    r"alpha_dropout|fractional_max_pool\dd|svd_lowrank|pca_lowrank)(_like)?($|[._])"
)
_OUT_OF_SCOPE_NAME = re.compile(r"sparse|quantiz|complex|view_as_real|\bpolar\b|mkldnn")
_OUT_OF_SCOPE_VARIANT = re.compile(r"sparse|complex|quantiz")

# --------------------------------------------------------------------------- OpInfo database


def _call_op(op: Callable, *args: Any, **kwargs: Any) -> Any:
    return op(*args, **kwargs)


def load_op_db() -> list[Any]:
    """PyTorch's OpInfo list. ``torch.testing._internal`` imports ``expecttest`` for its TestCase
    base class only; when that test-only package is absent a stand-in module is registered.

    Some OpInfos (SDPA, multi-head attention, ...) call their op through ``wrapper_set_seed``,
    which Dynamo refuses to trace (it saves and restores the RNG state). The harness seeds the RNG
    itself and skips random samples, so that wrapper is replaced by a plain call."""
    try:
        import expecttest  # noqa: F401
    except ImportError:
        stub = types.ModuleType("expecttest")
        stub.TestCase = unittest.TestCase
        stub.ACCEPT = False
        sys.modules["expecttest"] = stub
    from torch.testing._internal import common_methods_invocations as cmi

    cmi.wrapper_set_seed = _call_op
    return list(cmi.op_db)


def full_name(op: Any) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def select_ops(op_db: Iterable[Any], names: Iterable[str] | None = None) -> list[Any]:
    """OpInfos by name, in the order given: ``softmax`` selects every variant of softmax,
    ``softmax.with_dtype`` only that variant. ``None`` selects all, in database order."""
    ops = list(op_db)
    if names is None:
        return ops
    chosen: list[Any] = []
    for name in names:
        hits = [op for op in ops if name in (op.name, full_name(op))]
        if not hits:
            raise KeyError(f"no OpInfo named {name!r}")
        chosen.extend(op for op in hits if op not in chosen)
    return chosen


def scope_reason(op: Any) -> str | None:
    """Why ``op`` is out of scope for parity testing, or ``None``."""
    if _OUT_OF_SCOPE_NAME.search(op.name) or _OUT_OF_SCOPE_VARIANT.search(op.variant_test_name):
        return "out of scope: sparse/complex/quantized variant"
    if _NONDETERMINISTIC.search(op.name):
        return "random or uninitialized output: no eager parity (statistical tests instead)"
    return None


# --------------------------------------------------------------------------- expectations


def load_expectations(path: Path | str | None = EXPECTATIONS) -> list[dict[str, str]]:
    """Entries of ``[[xfail]]`` tables: ``op`` (name or name.variant), ``reason``, optional
    ``dtype`` and ``phase`` (default: any)."""
    if path is None or not Path(path).exists():
        return []
    with open(path, "rb") as f:
        data = tomllib.load(f)
    entries = data.get("xfail", [])
    for e in entries:
        if not e.get("op") or not e.get("reason"):
            raise ValueError(f"{path}: every [[xfail]] needs op and reason: {e}")
    return entries


def expected_failure(
    expectations: list[dict[str, str]], op: str, variant: str, dtype: str, phase: str
) -> str | None:
    """The reason ``op`` is expected to fail, or ``None``. An entry's ``op`` is an OpInfo name
    (all its variants) or ``name.variant`` (that variant only)."""
    name = f"{op}.{variant}" if variant else op
    for e in expectations:
        if e["op"] not in (op, name):
            continue
        if e.get("dtype", "*") in ("*", dtype) and e.get("phase", "*") in ("*", phase):
            return e["reason"]
    return None


# --------------------------------------------------------------------------- samples


def split_tensors(obj: Any, tensors: list[torch.Tensor]) -> Callable[[tuple], Any]:
    """Return a builder that re-creates ``obj`` from a tuple of tensors; collects the tensors.
    Containers without tensors (``torch.Size``, dtypes, ...) are closed over untouched."""
    if isinstance(obj, torch.Tensor):
        i = len(tensors)
        tensors.append(obj)
        return lambda ts: ts[i]
    if isinstance(obj, (list, tuple)) and _has_tensor(obj):
        parts = [split_tensors(x, tensors) for x in obj]
        if isinstance(obj, list):
            return lambda ts: [p(ts) for p in parts]
        if hasattr(obj, "_fields"):  # namedtuple
            cls = type(obj)
            return lambda ts: cls(*[p(ts) for p in parts])
        return lambda ts: tuple(p(ts) for p in parts)
    if isinstance(obj, dict) and _has_tensor(obj):
        items = [(k, split_tensors(v, tensors)) for k, v in obj.items()]
        return lambda ts: {k: p(ts) for k, p in items}
    return lambda ts: obj


def _has_tensor(obj: Any) -> bool:
    if isinstance(obj, torch.Tensor):
        return True
    if isinstance(obj, (list, tuple)):
        return any(_has_tensor(x) for x in obj)
    if isinstance(obj, dict):
        return any(_has_tensor(x) for x in obj.values())
    return False


def copy_leaf(t: torch.Tensor, grad: bool) -> torch.Tensor:
    """A fresh leaf with the same values and strides (non-contiguous samples stay so)."""
    with torch.no_grad():
        try:
            c = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
            c.copy_(t)
        except RuntimeError:  # overlapping (expanded) layouts cannot be written to
            c = t.detach().clone()
    return c.requires_grad_(grad and t.requires_grad)


def pick_samples(op: Any, dtype: torch.dtype, grad: bool, k: int) -> list[Any]:
    """``k`` samples spread over the first ``4k`` (the first few are often all scalars)."""
    samples = list(itertools.islice(op.sample_inputs("cpu", dtype, requires_grad=grad), 4 * k))
    if len(samples) <= k:
        return samples
    step = len(samples) / k
    return [samples[int(i * step)] for i in range(k)]


# Ops whose documented result may pick any of several equal values (sort unless stable=True;
# topk, kthvalue, median, mode never promise which): name -> (position of the index output, -1
# when the output is the indices, None when there are none; position of ``dim`` in args; default).
_TIE_ORDER_FREE = {
    "sort": (1, 0, -1),
    "argsort": (-1, 0, -1),
    "msort": (None, 0, 0),
    "topk": (1, 1, -1),
    "kthvalue": (1, 1, -1),
    "median": (1, 0, -1),
    "nanmedian": (1, 0, -1),
    "mode": (1, 0, -1),
}


def unordered_ties(op: Any, sample: Any) -> tuple[int | None, int] | None:
    """``(index output position, dim)`` when ``op`` may order equal values of this sample's input
    arbitrarily (it has duplicates and ``stable`` is not set); position -1 means the output is
    the index tensor itself, ``None`` that there are no indices (values only)."""
    spec = _TIE_ORDER_FREE.get(op.name)
    x = sample.input
    if spec is None or sample.kwargs.get("stable") is True or not isinstance(x, torch.Tensor):
        return None
    if x.numel() < 2 or x.detach().unique().numel() == x.numel():
        return None
    pos, dim_at, default = spec
    args = sample.args
    dim = sample.kwargs.get("dim", args[dim_at] if len(args) > dim_at else default)
    return pos, dim
