"""Zero-size and rank-0 edges of every OpInfo entry, generated from its own samples.

Shape rules at the edges are where lowering rules break: an empty dimension, a 0-d tensor, a
reduction over nothing. For each entry in scope, the first sample with tensor inputs
(``--samples N``: the first N) is reshaped into edge variants, and each variant that eager
accepts runs through the harness (``run_sample``, forward only) like any conformance sample:

- ``zero``:  every tensor input of rank >= 1 gets size 0 in its first dimension;
- ``empty``: the first tensor input (the op's ``input``) alone gets size 0 in its last dimension;
- ``scalar``: every tensor input becomes 0-d (its first element).

An edge may fall back, or match eager; it may never be a bug of ours (an ``error`` naming NC102,
NC103 or any non-NC exception), and never a mismatch. ``python -m tests.conformance.edges``
prints every failing edge; ``tests/conformance/test_edges.py`` runs the sweep in CI.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

from tests.conformance.harness import Result, run_sample
from tests.conformance.opinfo import load_op_db, scope_reason, select_ops
from tests.conformance.outcomes import OpTimeout, _time_limit

#: Outcomes an edge may have: it compiled and matched, it fell back, or it was not applicable.
ACCEPTED = ("pass", "fallback", "skip", "xfail")
#: Entries whose edges crash eager PyTorch itself (the process dies; nothing of ours runs).
EAGER_CRASHES = {
    "_segment_reduce": "torch 2.13 segfaults on empty data with offsets and unsafe=True",
}


def _map_tensors(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_tensors(o, fn) for o in obj)
    if isinstance(obj, dict):
        return {k: _map_tensors(v, fn) for k, v in obj.items()}
    return obj


def _resized(t: torch.Tensor, dim: int) -> torch.Tensor:
    shape = list(t.shape)
    shape[dim] = 0
    return t.new_empty(shape).detach()


def _zero(t: torch.Tensor) -> torch.Tensor:
    return _resized(t, 0) if t.dim() >= 1 else t.detach().clone()


def _scalar(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(-1)[0].clone() if t.numel() else t.detach().clone()


def variants(sample: Any) -> Iterator[tuple[str, Any]]:
    """The edge variants of one ``SampleInput`` (see the module docstring)."""
    SampleInput = type(sample)  # noqa: N806 - torch.testing's, imported by load_op_db
    parts = (sample.input, sample.args, sample.kwargs)
    zero = _map_tensors(parts, _zero)
    yield "zero", SampleInput(zero[0], args=zero[1], kwargs=zero[2])
    if isinstance(sample.input, torch.Tensor) and sample.input.dim() >= 1:
        first = _resized(sample.input, -1)
        yield "empty", SampleInput(first, args=sample.args, kwargs=sample.kwargs)
    scalar = _map_tensors(parts, _scalar)
    yield "scalar", SampleInput(scalar[0], args=scalar[1], kwargs=scalar[2])


def _samples(op: Any, dtype: torch.dtype, count: int) -> list[Any]:
    """The first ``count`` samples with a tensor input (``out=`` samples are not edges)."""
    picked = []
    for sample in op.sample_inputs("cpu", dtype, requires_grad=False):
        if "out" not in sample.kwargs and isinstance(sample.input, torch.Tensor):
            picked.append(sample)
            if len(picked) == count:
                break
    return picked


def sweep(
    names: list[str] | None = None,
    dtype: torch.dtype = torch.float32,
    timeout: float = 60.0,
    samples: int = 1,
) -> Iterator[tuple[str, Result]]:
    """``(edge, result)`` for every edge variant of the first ``samples`` samples of every
    selected entry at ``dtype``."""
    for op in select_ops(load_op_db(), names):
        if scope_reason(op) or op.name in EAGER_CRASHES or dtype not in op.supported_dtypes("cpu"):
            continue
        try:
            picked = _samples(op, dtype, samples)
        except Exception:  # noqa: BLE001 - an OpInfo whose samples cannot be built here
            continue
        for edge, variant in (pair for sample in picked for pair in variants(sample)):
            try:
                with _time_limit(timeout):
                    result = run_sample(op, variant, dtype, backward=False)["forward"]
            except OpTimeout as e:
                result = Result(
                    op.name, op.variant_test_name, str(dtype), "forward", "error", str(e)
                )
            finally:
                torch._dynamo.reset()
            yield edge, result


def failures(results: Iterator[tuple[str, Result]]) -> list[str]:
    """One line per edge whose outcome is not in ``ACCEPTED``."""
    return [
        f"{r.op}{'.' + r.variant if r.variant else ''} [{edge}]: {r.outcome}: {r.reason}"
        for edge, r in results
        if r.outcome not in ACCEPTED
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", help="comma-separated OpInfo names; default all")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--samples", type=int, default=1, help="edges of the first N samples")
    args = p.parse_args(argv)
    names = args.ops.split(",") if args.ops else None
    bad = []
    for edge, result in sweep(names, getattr(torch, args.dtype), samples=args.samples):
        line = failures(iter([(edge, result)]))
        bad += line
        print(*(line or [f"{result.op} [{edge}]: {result.outcome}"]), flush=True)
    print(f"{len(bad)} failing edge(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
