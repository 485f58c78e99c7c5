"""An AOTAutogradCache entry is only loaded by the frame it was saved for: A's AOT entry placed
under B's key must never make B run A's graphs.

PyTorch stores our ``NeuronOutputCode`` under AOTAutograd's key and never tells ``post_compile``
which key that was; so each entry records the frame key of its Dynamo graph
(``aot_trust.frame_key``), which the loading frame recomputes. Real processes and real files:
model A and model B differ in one Python constant and take the same arguments (so the recorded
calling convention fits either); A's entry files are copied under B's key directories, as anyone
who can write there (or a careless copy) would. B must compute B's results from a trace, say why
the entry was refused, and an untouched warm start must still load every entry.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from neuron_compile import aot_cache
from neuron_compile.aot_trust import frame_key
from neuron_compile.config import load_config
from tests.helpers import run_child

_CHILD = """
import json, sys, warnings, torch, neuron_compile
from pathlib import Path
from torch._dynamo.utils import counters
from neuron_compile import aot_cache
from torch._inductor.runtime.cache_dir_utils import cache_dir
warnings.simplefilter("ignore")
SCALE = {"a": 2.0, "b": 3.0}[sys.argv[1]]  # the one constant models A and B differ in
if "unbound" in sys.argv[2:]:  # load as before the fix: an entry's frame key is not checked
    real_load = aot_cache._load
    def _load(code, loaded_with):
        code.frame_key = aot_cache._local.frame.key
        return real_load(code, loaded_with)
    aot_cache._load = _load

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 4)
    def forward(self, x):
        return torch.tanh(self.fc(x)) * SCALE

entries = Path(cache_dir()) / "aotautograd"
def new_keys(before):
    return sorted(set(p.name for p in entries.iterdir()) - before) if entries.exists() else []
def keys_now():
    return set(p.name for p in entries.iterdir()) if entries.exists() else set()

torch.manual_seed(0)
model, x = Net(), torch.randn(3, 6)
compiled = torch.compile(model, backend="neuron", dynamic=False)
before = keys_now()
with torch.no_grad():
    out = compiled(x)  # an inference frame
infer_keys, before = new_keys(before), keys_now()
loss = compiled(x).square().mean()  # a training frame (forward and backward)
loss.backward()
train_keys = new_keys(before)
eager_out = model(x)
model.zero_grad()
eager_loss = model(x).square().mean()
eager_loss.backward()
aot = counters["aot_autograd"]
print(json.dumps({
    "out": out.flatten().tolist(),
    "loss": loss.item(),
    "eager_out": eager_out.detach().flatten().tolist(),
    "eager_loss": eager_loss.item(),
    "keys": {"infer": infer_keys, "train": train_keys},
    "hit": aot["autograd_cache_hit"], "miss": aot["autograd_cache_miss"],
    "saved": aot["autograd_cache_saved"], "bypass": aot["autograd_cache_bypass"],
    "refused": [r.aot_cache_refused for r in neuron_compile.metrics()],
    "sources": [r.cache_source for r in neuron_compile.metrics()],
}))
"""


def _run(root: Path, model: str, *modes: str) -> dict:
    return run_child(_CHILD, root, model, *modes)[0]


@pytest.fixture(scope="module")
def colds(tmp_path_factory) -> tuple[Path, dict, dict]:
    """Models A then B, cold, on one cache root (shared: each test works on a copy)."""
    root = tmp_path_factory.mktemp("aot-binding")
    a = _run(root, "a")
    b = _run(root, "b")
    for run in (a, b):
        assert run["saved"] == 2 and run["hit"] == 0
        assert len(run["keys"]["infer"]) == len(run["keys"]["train"]) == 1
    assert a["out"] != b["out"] and a["loss"] != b["loss"]
    return root, a, b


def _copy(colds: tuple[Path, dict, dict], tmp_path: Path) -> Path:
    shutil.copytree(colds[0], tmp_path / "c")
    return tmp_path / "c"


def _forge(root: Path, a: dict, b: dict) -> None:
    """Replace the files under each of B's AOTAutograd key directories with A's files of the
    same kind (inference, training): what B's lookups then find is A's entry."""
    entries = root / "torch" / "aotautograd"
    for kind in ("infer", "train"):
        (a_key,), (b_key,) = a["keys"][kind], b["keys"][kind]
        for old in (entries / b_key).iterdir():
            old.unlink()
        for path in (entries / a_key).iterdir():
            shutil.copy2(path, entries / b_key / path.name)


def _results(run: dict) -> tuple:
    return run["out"], run["loss"]


def _eager(run: dict) -> tuple:
    return run["eager_out"], run["eager_loss"]


def _close(got: tuple, want: tuple) -> bool:
    out, loss = got
    return (
        torch.allclose(torch.tensor(out), torch.tensor(want[0]), atol=1e-5)
        and abs(loss - want[1]) < 1e-5
    )


def test_untouched_warm_starts_load_every_entry(colds, tmp_path):
    root = _copy(colds, tmp_path)
    for model, cold in (("a", colds[1]), ("b", colds[2])):
        warm = _run(root, model)
        assert warm["hit"] == 2 and warm["miss"] == warm["bypass"] == warm["saved"] == 0
        assert warm["refused"] == [""] * 3 and warm["sources"] == ["disk"] * 3
        assert _results(warm) == _results(cold) and _close(_results(warm), _eager(warm))


def test_without_the_frame_key_check_the_copied_entry_runs_the_other_models_graphs(colds, tmp_path):
    # The attack is real: loaded without the check, B's lookups load A's graphs.
    root, a, b = _copy(colds, tmp_path), colds[1], colds[2]
    _forge(root, a, b)
    warm = _run(root, "b", "unbound")
    assert warm["hit"] == 2
    assert _results(warm) == _results(a) and not _close(_results(warm), _eager(warm))


def test_another_frames_entry_under_this_key_is_refused_and_traced(colds, tmp_path):
    root, a, b = _copy(colds, tmp_path), colds[1], colds[2]
    _forge(root, a, b)
    warm = _run(root, "b")
    # B's results, not A's: both entries refused at load, AOTAutograd traced (a bypass each),
    # and the graphs came from our disk cache, which B's cold run filled.
    assert _close(_results(warm), _eager(warm)) and _results(warm) == _results(b)
    assert warm["hit"] == 0 and warm["bypass"] == 2
    assert warm["sources"] == ["disk"] * 3
    assert len(warm["refused"]) == 3
    assert all("saved for another frame" in reason for reason in warm["refused"])
    # A itself still loads its own (untouched) entries.
    again = _run(root, "a")
    assert again["hit"] == 2 and _results(again) == _results(a)


# In-process checks of the key.


def _dynamo_graph(fn, *args) -> tuple[torch.fx.GraphModule, list]:
    got = []

    def backend(gm, example_inputs):
        got.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=backend, dynamic=False)(*args)
    return got[0]


def test_frame_key_names_the_graph_its_constants_arguments_and_tag():
    x = torch.randn(3, 4)
    gm, args = _dynamo_graph(lambda t: t.tanh() * 2.0, x)
    key = frame_key(gm, args, "tag", "stablehlo")
    assert key is not None and key == frame_key(gm, args, "tag", "stablehlo")
    # The same code traced again (node names, targets, arguments): the same key.
    again, args2 = _dynamo_graph(lambda t: t.tanh() * 2.0, x)
    assert frame_key(again, args2, "tag", "stablehlo") == key
    other, _ = _dynamo_graph(lambda t: t.tanh() * 3.0, x)
    differs = [
        frame_key(other, args, "tag", "stablehlo"),  # one constant
        frame_key(gm, args, "other tag", "stablehlo"),  # config or toolchain
        frame_key(gm, args, "tag", "hlo"),
        frame_key(gm, [torch.randn(3, 5)], "tag", "stablehlo"),  # shape
        frame_key(gm, [x.double()], "tag", "stablehlo"),  # dtype
        frame_key(gm, [x.t().contiguous().t()], "tag", "stablehlo"),  # strides
        frame_key(gm, [x.clone().requires_grad_()], "tag", "stablehlo"),
    ]
    with torch.no_grad():
        differs.append(frame_key(gm, args, "tag", "stablehlo"))  # grad mode
    assert None not in differs and len({key, *differs}) == len(differs) + 1


def _branchy(scale: float):
    def fn(t):
        return torch.cond(t.sum() > 0, lambda u: u * scale, lambda u: u - 1.0, (t,))

    return fn


def test_frame_key_names_what_nested_graphs_compute():
    # A higher-order op's body is a submodule the Dynamo graph only names (get_attr).
    x = torch.randn(3, 4)
    gm, args = _dynamo_graph(_branchy(2.0), x)
    other, _ = _dynamo_graph(_branchy(3.0), x)
    assert any(n.op == "get_attr" for n in gm.graph.nodes)
    key = frame_key(gm, args, "tag", "stablehlo")
    assert None not in (key, frame_key(other, args, "tag", "stablehlo"))
    assert key != frame_key(other, args, "tag", "stablehlo")


def test_output_code_pickles_its_frame_key_and_an_unkeyed_frame_stores_nothing():
    import pickle

    convention = aot_cache.Convention((("torch.float32", (3, 4)),), 1, 0, True)
    code = aot_cache.NeuronOutputCode(
        None, "backward", None, None, convention, fx_key="f" * 64, frame_key="k" * 64
    )
    assert pickle.loads(pickle.dumps(code)).frame_key == "k" * 64
    assert aot_cache.FORMAT_VERSION >= 3
    # A frame entered without its graph has no key: a graph compiled there is never stored.
    cfg = load_config({}, env={})
    with aot_cache.frame(cfg, lambda kind: kind, 0.0, False):
        assert aot_cache._frame_key() is None
