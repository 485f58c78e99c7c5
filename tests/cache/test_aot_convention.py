"""A loaded AOTAutogradCache entry must be called as it was compiled (aot_cache.Convention).

The warm-start crash of effectful graphs (``torch.linalg.inv``): AOTAutograd lifted the effect
token of ``_linalg_check_errors`` to a graph input, the cold path's ``EffectTokensWrapper`` passed
it, the cache-hit path (which rebuilds every runtime wrapper but that one) did not, and the loaded
graph indexed past its arguments. Graphs are now traced with unlifted tokens, and an entry whose
recorded convention does not fit the cache hit is refused at load: AOTAutograd traces again, and
the record says why (``aot_cache_refused``)."""

from __future__ import annotations

from pathlib import Path

import torch

from neuron_compile import aot_cache
from neuron_compile.lowering import lower_graph
from tests.helpers import run_child

_INV = """
import contextlib, dataclasses, json, sys, warnings, torch, neuron_compile
from torch._dynamo.utils import counters
from neuron_compile import aot_cache, backend
warnings.simplefilter("ignore")
if "lifted" in sys.argv[1:]:  # trace as before the fix: the effect token is a graph input
    backend._effect_tokens_inside_graphs = contextlib.nullcontext
if "store" in sys.argv[1:]:  # and store such graphs, as before the fix
    real = aot_cache._why_not_stored
    aot_cache._why_not_stored = lambda runner, c: real(runner, dataclasses.replace(c, tokens=0))
def f(x):
    return torch.linalg.inv(x) * 2
torch.manual_seed(0)
x = torch.randn(5, 5) + 3 * torch.eye(5)
cf = torch.compile(f, backend="neuron", dynamic=False)
out = cf(x)
xg = x.clone().requires_grad_()
cf(xg).sum().backward()
xe = x.clone().requires_grad_()
f(xe).sum().backward()
aot = counters["aot_autograd"]
print(json.dumps({
    "out": out.flatten().tolist(),
    "grad": xg.grad.flatten().tolist(),
    "err": max((out - f(x)).abs().max().item(), (xg.grad - xe.grad).abs().max().item()),
    "hit": aot["autograd_cache_hit"], "saved": aot["autograd_cache_saved"],
    "bypass": aot["autograd_cache_bypass"],
    "refused": [r.aot_cache_refused for r in neuron_compile.metrics()],
    "sources": [r.cache_source for r in neuron_compile.metrics()],
}))
"""


def _run(cache: Path, *modes: str) -> dict:
    return run_child(_INV, cache, *modes)[0]


def _values(run: dict) -> tuple:
    return run["out"], run["grad"]


def test_effectful_graphs_warm_start_as_cache_hits(tmp_path):
    cold, warm = _run(tmp_path), _run(tmp_path)
    assert cold["saved"] == 2 and warm["hit"] == 2 and warm["bypass"] == 0
    assert warm["sources"] == ["disk"] * 3 and warm["refused"] == [""] * 3
    assert _values(warm) == _values(cold) and warm["err"] < 1e-5


def test_entry_whose_graph_takes_an_effect_token_is_refused_at_load(tmp_path):
    # Entries as the code before the fix stored them; loaded with the same cache key.
    cold = _run(tmp_path, "lifted", "store")
    assert cold["saved"] == 2
    warm = _run(tmp_path, "lifted")
    # Refused, not called: AOTAutograd traced again (a bypass) and the record says why.
    assert warm["hit"] == 0 and warm["bypass"] == 2
    assert all("effect token" in reason for reason in warm["refused"])
    assert _values(warm) == _values(cold) and warm["err"] < 1e-5
    # Such graphs are no longer stored: nothing a later cache hit could not call.
    assert warm["saved"] == 0


def _inference(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return (x * y).sum(0), x.exp()


def _traced() -> tuple[torch.fx.GraphModule, list[torch.Tensor]]:
    from tests.helpers import trace_aten

    args = [torch.randn(3, 4), torch.randn(3, 4)]
    return trace_aten(_inference, *args), args


def test_convention_fits_the_graph_it_was_recorded_for():
    gm, args = _traced()
    specs = tuple(aot_cache.arg_spec(a) for a in args)
    convention = aot_cache.Convention.of(gm, specs)
    assert convention == aot_cache.Convention(specs, 2, 0, True)
    assert convention.mismatch(lower_graph(gm), "inference", args) is None
    # A backward is never compared with the frame's arguments (its inputs are saved tensors).
    assert convention.mismatch(lower_graph(gm), "backward", []) is None


def test_convention_refuses_what_does_not_fit():
    gm, args = _traced()
    lowered = lower_graph(gm)
    convention = aot_cache.Convention.of(gm, tuple(aot_cache.arg_spec(a) for a in args))
    wider = [torch.randn(3, 5), torch.randn(3, 5)]
    assert "arguments differ" in convention.mismatch(lowered, "forward", wider)
    assert "arguments differ" in convention.mismatch(lowered, "forward", args[:1])
    other_graph = aot_cache.Convention((("torch.float32", (3, 5)),) * 2, 2, 0, False)
    assert "input" in other_graph.mismatch(lowered, "forward", args)
    fewer_outputs = aot_cache.Convention(convention.inputs, 1, 0, True)
    assert "returns 2 values" in fewer_outputs.mismatch(lowered, "forward", args)
    with_token = aot_cache.Convention(convention.inputs, 2, 1, True)
    assert "effect token" in with_token.mismatch(lowered, "inference", args)
    # Not flat (deduplicated or synthetic-base arguments): the wrappers AOTAutograd rebuilds
    # map the arguments, so they are not compared one for one.
    assert (
        aot_cache.Convention(convention.inputs, 2, 0, False).mismatch(lowered, "forward", wider)
        is None
    )
