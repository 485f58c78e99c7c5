"""Warm starts that skip AOTAutograd tracing (neuron_compile/aot_cache.py), seen from real
processes: a cold process fills our disk cache and PyTorch's AOTAutogradCache, a warm one loads
both without tracing; a lost disk cache, a changed option, a CPU-fallback graph or the option
turned off never reuse an entry wrongly and never fail."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import pytest
import torch

from neuron_compile import aot_cache
from neuron_compile.config import load_config
from tests.helpers import run_child

_TRAIN_STEP = """
import json, sys, warnings, torch, neuron_compile
from torch._dynamo.utils import counters
from neuron_compile import compiler
warnings.simplefilter("ignore")
lowered, resident = [], {}
real_lower = compiler.lower_graph
compiler.lower_graph = lambda gm, **kw: lowered.append(1) or real_lower(gm, **kw)
real_keep, real_read = compiler.CompiledGraph.keep_saved_resident, compiler.CompiledGraph.read_saved_from
def keep(self, link):
    real_keep(self, link)
    resident["forward"] = list(link.resident)
def read(self, link):
    real_read(self, link)
    resident["backward_token_arg"] = self._token_arg
compiler.CompiledGraph.keep_saved_resident = keep
compiler.CompiledGraph.read_saved_from = read

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 4)
    def forward(self, x):
        return self.b(torch.nn.functional.gelu(self.a(x)).tanh() * 2)

if sys.argv[1] == "scan":  # PYTHONPATH is the repository root
    from tests.test_fallback import ScanNet as Net
torch.manual_seed(0)
model = Net()
x = torch.randn(5, 8)
compiled = torch.compile(model, backend="neuron")
loss = compiled(x).square().mean()
loss.backward(retain_graph=True)  # also checks no donated buffers are declared
loss2 = compiled(x).square().mean()  # a second call through the loaded graphs
loss2.backward()
torch.manual_seed(0)
eager = Net()  # the same weights, run eagerly: the reference for every run's gradients
eager_loss = eager(x).square().mean()
eager_loss.backward(retain_graph=True)
eager(x).square().mean().backward()
grads = dict(model.named_parameters())
eager_err = max(
    (grads[n].grad - p.grad).abs().max().item() for n, p in eager.named_parameters()
)
aot = counters["aot_autograd"]
print(json.dumps({
    "eager_err": eager_err,
    "loss": [loss.item(), loss2.item()],
    "grads": {n: p.grad.flatten().tolist() for n, p in model.named_parameters()},
    "hit": aot["autograd_cache_hit"],
    "miss": aot["autograd_cache_miss"],
    "bypass": aot["autograd_cache_bypass"],
    "saved": aot["autograd_cache_saved"],
    "lowerings": len(lowered),
    "resident": resident,
    "sources": [r.cache_source for r in neuron_compile.metrics()],
    "inductor_codegen": "torch._inductor.codegen.cpp" in sys.modules,
}))
"""


def _run(cache: Path, model: str = "net", **env: str) -> dict:
    return run_child(_TRAIN_STEP, cache, model, **env)[0]


@pytest.fixture(scope="module")
def cold(tmp_path_factory) -> tuple[Path, dict]:
    """One cold process, shared: each test copies its caches before running warm ones."""
    root = tmp_path_factory.mktemp("aot-cold")
    return root, _run(root)


def _copy(cold: tuple[Path, dict], tmp_path: Path) -> Path:
    shutil.copytree(cold[0], tmp_path / "c")
    return tmp_path / "c"


def _same_results(a: dict, b: dict) -> None:
    assert a["loss"] == b["loss"]
    assert a["grads"] == b["grads"]
    assert a["eager_err"] < 1e-5 and b["eager_err"] < 1e-5


def test_cold_process_traces_and_saves_an_entry(cold):
    _, run = cold
    assert run["miss"] == 1 and run["saved"] == 1 and run["hit"] == 0
    assert run["lowerings"] == 2 and run["sources"] == ["compiled", "compiled"]
    assert run["resident"]["forward"]  # saved activations stay resident (saved.py)


def test_warm_process_skips_aot_tracing_with_equal_loss_and_grads(cold, tmp_path):
    warm = _run(_copy(cold, tmp_path))
    assert warm["hit"] == 1 and warm["miss"] == 0 and warm["bypass"] == 0
    assert warm["lowerings"] == 0 and warm["sources"] == ["disk", "disk"]
    # The cache key is computed without importing Inductor's code generators (~0.75 s).
    assert not warm["inductor_codegen"] and not cold[1]["inductor_codegen"]
    # The saved-activation link is re-established exactly as the partitioner set it up.
    assert warm["resident"] == cold[1]["resident"]
    _same_results(warm, cold[1])


def test_emptied_disk_cache_falls_back_to_tracing_then_heals(cold, tmp_path):
    cache = _copy(cold, tmp_path)
    shutil.rmtree(cache / "neuron")
    warm = _run(cache)
    # The AOTAutograd entry is found but refers to graphs we no longer have: a bypass, i.e. a
    # normal trace and compile, which refills our cache.
    assert warm["hit"] == 0 and warm["bypass"] == 1
    assert warm["lowerings"] == 2 and warm["sources"] == ["compiled", "compiled"]
    _same_results(warm, cold[1])
    again = _run(cache)
    assert again["hit"] == 1 and again["lowerings"] == 0
    _same_results(again, cold[1])


@pytest.mark.parametrize(
    "env", [{"NEURON_COMPILE_FALLBACK": "error"}, {"NEURON_COMPILE_ARTIFACT": "hlo"}]
)
def test_changed_option_does_not_reuse_the_entry(cold, tmp_path, env):
    warm = _run(_copy(cold, tmp_path), **env)
    assert warm["hit"] == 0 and warm["miss"] == 1
    _same_results(warm, cold[1])


def test_option_off_leaves_the_aot_cache_alone(cold, tmp_path):
    warm = _run(_copy(cold, tmp_path), NEURON_COMPILE_AOT_CACHE="0")
    assert warm["hit"] == warm["miss"] == warm["bypass"] == warm["saved"] == 0
    assert warm["sources"] == ["disk", "disk"]  # our disk cache still serves the graphs
    _same_results(warm, cold[1])


def test_graphs_with_cpu_fallback_are_never_stored(tmp_path):
    first = _run(tmp_path, "scan")
    second = _run(tmp_path, "scan")
    assert first["saved"] == 0 and second["hit"] == 0
    _same_results(first, second)


# In-process checks of the pieces.


def test_cache_tag_names_backend_and_every_option():
    base = aot_cache.cache_tag(load_config({}, env={}))
    assert base.startswith("neuron_compile-")
    assert base == aot_cache.cache_tag(load_config({}, env={}))
    for options in ({"fallback": "error"}, {"artifact": "hlo"}, {"sixty_four_bit": "error"}):
        assert aot_cache.cache_tag(load_config(options, env={})) != base
    # Naming options do not split entries.
    assert aot_cache.cache_tag(load_config({"model_name": "m"}, env={})) == base


def test_frame_patches_the_key_tag_and_restores_it():
    cfg = load_config({}, env={})
    before = torch.compiler.config.cache_key_tag
    with aot_cache.frame(cfg, lambda kind: kind, 0.0, False):
        assert torch.compiler.config.cache_key_tag.startswith(aot_cache.cache_tag(cfg))
        assert torch._functorch.config.bundled_autograd_cache
    assert torch.compiler.config.cache_key_tag == before
    assert not torch._functorch.config.bundled_autograd_cache


def test_option_and_env_var():
    assert load_config({}, env={}).aot_cache is True
    assert load_config({}, env={"NEURON_COMPILE_AOT_CACHE": "0"}).aot_cache is False
    assert load_config({"aot_cache": False}, env={}).aot_cache is False


def test_output_code_pickles_small_and_without_the_runner():
    from torch._functorch._aot_autograd.autograd_cache import BypassAOTAutogradCache

    class Record:
        backend_s, cache_key, node_count = 0.5, "k" * 64, 12

    class Runner:
        record = Record()
        fx_key = "f" * 64

    pair = aot_cache.AotPair(3, resident=(0, 1), fx_keys=["f" * 64])
    convention = aot_cache.Convention((("torch.float32", (5, 8)),), 3, 0, True)
    code = aot_cache.NeuronOutputCode(Runner(), "forward", pair, None, convention)
    data = pickle.dumps(code)
    assert b"Runner" not in data and len(data) < 1024
    loaded = pickle.loads(data)
    assert loaded.runner is None and loaded.fx_key == "f" * 64 and loaded.pair.resident == (0, 1)
    assert loaded.convention == convention
    with pytest.raises(aot_cache.AotCacheMiss):  # outside a neuron_compile frame
        loaded.post_compile([], None, {})
    bad = aot_cache.NeuronOutputCode(Runner(), "forward", pair, "graph has constants", convention)
    with pytest.raises(BypassAOTAutogradCache, match="constants"):
        bad.prepare_for_serialization()
