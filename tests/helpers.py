"""Test helpers: lower a function to StableHLO text, compile and compare with eager."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import subprocess
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from neuron_compile import artifact
from neuron_compile.capture import decomposition_table
from neuron_compile.lowering import lower_graph
from neuron_compile.passes import PIPELINE, run_pipeline

REPO_ROOT = Path(__file__).resolve().parents[1]


def trace_aten(fn: Callable[..., Any], *args: Any) -> torch.fx.GraphModule:
    """ATen graph of ``fn`` with the backend's decompositions and ``meta['val']`` on nodes."""

    def positional(*a: Any) -> Any:  # make_fx counts parameters; F.silu(x, inplace=False) has 2
        return fn(*a)

    return make_fx(positional, decomposition_table=decomposition_table(), tracing_mode="fake")(
        *args
    )


def lower_to_text(fn: Callable[..., Any], *args: Any, pretty: bool = True) -> str:
    """StableHLO text of ``fn`` as the backend emits it (verified; pretty-printed by MLIR)."""
    gm = trace_aten(fn, *args)
    run_pipeline(gm, PIPELINE)
    text = lower_graph(gm).text
    return artifact.pretty(text) if pretty else text


def assert_close_tree(actual: Any, expected: Any, **tol: Any) -> None:
    if isinstance(expected, (tuple, list)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected, strict=True):
            assert_close_tree(a, e, **tol)
    elif isinstance(expected, torch.Tensor):
        torch.testing.assert_close(actual, expected, **tol)
    else:
        assert actual == expected


def train_losses(
    model: torch.nn.Module,
    batches: Sequence[tuple[torch.Tensor, ...]],
    loss_fn: Callable[..., torch.Tensor],
    *,
    compile_backend: str | None,
    lr: float = 1e-2,
    options: dict[str, Any] | None = None,
    seed: int | None = None,
) -> list[float]:
    """Losses of SGD-with-momentum steps over ``batches`` on a deep copy of ``model`` (compiled
    with ``options``; ``seed``: ``torch.manual_seed`` before the first step, for random ops)."""
    model = copy.deepcopy(model)
    step_model = (
        torch.compile(model, backend=compile_backend, options=options) if compile_backend else model
    )
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    if seed is not None:
        torch.manual_seed(seed)
    losses = []
    for batch in batches:
        opt.zero_grad()
        loss = loss_fn(step_model, *batch)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def run_lowered(fn: Callable[..., Any], *args: Any) -> list[Any]:
    """Run ``fn`` through the backend's lowering + XLA CPU executor without Dynamo (fast).

    ``fallback="error"``: an op without a lowering raises instead of quietly running eagerly,
    so a numerics test that passes really exercised our lowering."""
    from neuron_compile.compiler import DowncastWarning, compile_graph
    from neuron_compile.config import NeuronConfig
    from neuron_compile.narrowing import warned

    gm = trace_aten(fn, *args)
    cfg = NeuronConfig(fallback="error")
    # float64/int64 operands run narrowed (the 64-bit policy these numerics tests measure): its
    # warning is expected, and only when the graph narrows something the user must hear about.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DowncastWarning)
        compiled = compile_graph(gm, args, name="test", kind="inference", cfg=cfg)
    for w in caught:
        if issubclass(w.category, DowncastWarning):
            assert warned(compiled.record.downcasts), w.message
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return compiled(list(args))


# --------------------------------------------------------------------------- cold and warm runs
# Shared by the cold/warm modes of the conformance runner (tests/conformance/warm.py) and of the
# fuzzer (tests/fuzz/warm.py): a cold process fills both caches, a warm one on the same
# directories must load every stored frame and reproduce the cold results bit for bit.

AOT_COUNTERS = ("hit", "miss", "saved", "bypass")
#: ``GraphRecord.cache_source`` values of a graph that was read from our cache, not compiled.
CACHE_READS = ("memory", "disk", "remote")


def index_roundtrip(lowered: Any) -> Any:
    """``lowered`` written to an FX index entry and read back (cache/fx_index.py)."""
    from neuron_compile.cache.fx_index import dump_index, load_index
    from neuron_compile.cache.key import graph_key

    key = graph_key(
        lowered.text,
        io_specs=[[vars(s) for s in lowered.inputs], [vars(o) for o in lowered.outputs]],
        artifact_form="portable",
    )
    return load_index(dump_index(key, lowered))[1]


def cache_env(root: Path) -> dict[str, str]:
    """Environment of a cold or warm child process: both caches under ``root``, set explicitly
    (tests/conftest.py gives the parent fresh per-test directories, which children must not
    inherit), the repository root importable, and one string hash seed."""
    return {
        **os.environ,
        "NEURON_COMPILE_CACHE_DIR": str(root / "neuron"),
        "TORCHINDUCTOR_CACHE_DIR": str(root / "torch"),
        "PYTHONPATH": str(REPO_ROOT),
        # Set iteration order follows string hashes, which are salted per process: OpInfo sample
        # generators that loop over a set (meshgrid's {'xy', 'ij'}) would give the cold and the
        # warm process different samples, hence different graphs.
        "PYTHONHASHSEED": "0",
    }


def run_child(code: str, root: Path, *args: str, **env: str) -> tuple[dict[str, Any], str]:
    """Run ``code`` (with ``args``) in a fresh process on the caches under ``root``
    (``cache_env`` plus ``env``): its last stdout line as JSON, and its stderr."""
    out = subprocess.run(
        [sys.executable, "-c", code, *args],
        env={**cache_env(root), **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def aot_counts() -> dict[str, int]:
    """PyTorch's AOTAutogradCache counters (``autograd_cache_hit`` ...) of this process."""
    from torch._dynamo.utils import counters

    aot = counters["aot_autograd"]
    return {k: int(aot[f"autograd_cache_{k}"]) for k in AOT_COUNTERS}


class CacheProbe:
    """What the caches did between construction and ``facts()``: AOTAutogradCache counter deltas
    and the ``cache_source`` of every graph record added meanwhile."""

    def __init__(self) -> None:
        import neuron_compile

        self._aot = aot_counts()
        self._records = len(neuron_compile.metrics())

    def facts(self) -> dict[str, Any]:
        import neuron_compile

        now = aot_counts()
        records = neuron_compile.metrics()[self._records :]
        return {
            "aot": {k: now[k] - self._aot[k] for k in AOT_COUNTERS},
            "sources": [f"{r.kind}:{r.cache_source}" for r in records],
        }


def warm_cache_problems(cold: dict[str, Any], warm: dict[str, Any]) -> list[str]:
    """Why the warm run of a case did not load what its cold run stored ([] if it did).

    Each AOTAutogradCache lookup of the warm run repeats one of the cold run: a cold hit stays a
    hit, a cold miss that was saved must become a hit, a miss whose save was bypassed (a graph
    that is never stored, e.g. with CPU-fallback regions) stays a miss and a bypass. So the warm
    counters are exactly predictable, and a load refused warm (counted as a bypass, then traced
    and saved again) or a changed key (a miss) shows up as a difference. Every graph the warm
    run compiles must come from our cache, except graphs that compiled nothing cold either (no
    source: every op of the graph runs on the CPU)."""
    c = cold["aot"]
    expected = {"hit": c["hit"] + c["saved"], "miss": c["miss"] - c["saved"], "saved": 0}
    expected["bypass"] = c["bypass"]
    problems = []
    if warm["aot"] != expected:
        problems.append(
            f"AOTAutogradCache counters warm {_counts(warm['aot'])}, expected "
            f"{_counts(expected)} after cold {_counts(c)}"
        )
    excused = sum(1 for s in cold["sources"] if s.endswith(":"))  # compiled nothing cold
    compiled = []
    for s in warm["sources"]:
        if s.endswith(":") and excused > 0:
            excused -= 1
        elif s.split(":", 1)[1] not in CACHE_READS:
            compiled.append(s)
    if compiled:
        problems.append(f"graphs not read from our cache warm: {', '.join(compiled)}")
    return problems


def _counts(c: dict[str, int]) -> str:
    return " ".join(f"{k}={c[k]}" for k in AOT_COUNTERS)


def tensor_digest(value: Any) -> list[Any]:
    """Bit-exact fingerprint of every leaf of ``value``: ``[dtype, shape, sha256 of the bytes]``
    for a tensor (NaN payloads and signed zeros included), ``repr`` for anything else."""
    if isinstance(value, (list, tuple)):
        return [x for item in value for x in tensor_digest(item)]
    if isinstance(value, dict):
        return [x for k in sorted(value, key=str) for x in tensor_digest(value[k])]
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        try:
            data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        except (RuntimeError, TypeError):  # layouts without plain storage: compare the values
            data = repr(t.tolist()).encode()
        digest = hashlib.sha256(data).hexdigest()[:16]
        return [[str(t.dtype).removeprefix("torch."), list(t.shape), digest]]
    return [repr(value)]
