"""Recompile accounting: counted under dynamic=False and None, budget (NC202), strict mode."""

from __future__ import annotations

import functools
import warnings

import pytest
import torch

import neuron_compile
from neuron_compile.compiler import DowncastWarning
from neuron_compile.config import load_config
from neuron_compile.errors import NeuronCompileError, OptionsError
from neuron_compile.fallback import FallbackWarning
from neuron_compile.shapes import RecompileWarning, bucket_for


def _recompile_warnings(fn, *sizes: int) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in sizes:
            x = torch.randn(3, n)
            torch.testing.assert_close(fn(x), x * 2 + 1)
    return [str(w.message) for w in caught if issubclass(w.category, RecompileWarning)]


def _twice_plus_one(x):
    return x * 2 + 1


def _call_error(fn, n: int) -> NeuronCompileError:
    """The coded error a call raised, as itself (not wrapped by Dynamo)."""
    with pytest.raises(NeuronCompileError) as info:
        fn(torch.randn(3, n))
    return info.value


def test_dynamic_false_recompiles_are_counted_and_name_the_changed_dim():
    f = torch.compile(_twice_plus_one, backend="neuron", dynamic=False)
    msgs = _recompile_warnings(f, 4, 4, 6, 4)
    assert len(msgs) == 1, msgs
    assert "x dim 1=6 (was 4)" in msgs[0] and "dim 0" not in msgs[0]
    assert "recompile 1 of" in msgs[0] and "pad variable dimensions to fixed buckets" in msgs[0]
    assert [r.recompile for r in neuron_compile.metrics()] == [False, True]
    assert len(neuron_compile.recompiles()) == 1 and "dim 1=6" in neuron_compile.recompiles()[0]


def test_diagnosis_compares_with_the_closest_previous_shape():
    f = torch.compile(_twice_plus_one, backend="neuron", dynamic=False)
    msgs = _recompile_warnings(f, 4, 9, 5)
    assert len(msgs) == 2
    assert "dim 1=9 (was 4)" in msgs[0] and "dim 1=5 (was 9)" in msgs[1]


def test_distinct_functions_are_separate_frames():
    f = torch.compile(_twice_plus_one, backend="neuron", dynamic=False)
    g = torch.compile(lambda x: x * 2 + 1, backend="neuron", dynamic=False)
    assert _recompile_warnings(f, 4) == [] and _recompile_warnings(g, 5) == []
    assert [r.recompile for r in neuron_compile.metrics()] == [False, False]


def test_a_frame_compiled_after_dynamo_reset_is_not_compared_with_an_older_one():
    # torch._dynamo.reset() restarts Dynamo's frame ids: the new frame 0 must not inherit the
    # shape history (and recompile count) of the frame 0 compiled before the reset.
    torch.compile(lambda x: x - 1, backend="neuron", dynamic=False)(torch.randn(2, 7))
    torch._dynamo.reset()
    f = torch.compile(_twice_plus_one, backend="neuron", dynamic=False)
    assert _recompile_warnings(f, 4) == []  # a first compile
    msgs = _recompile_warnings(f, 5)
    assert len(msgs) == 1 and "dim 1=5 (was 4)" in msgs[0] and "recompile 1 of" in msgs[0]
    assert "was 7" not in msgs[0] and "gone" not in msgs[0]


def _passing_through(forward):
    """A decorator like Hugging Face's ``deprecate_kwarg``: every decorated forward runs through
    one shared code object, ``wrapped_func(*args, **kwargs)``."""

    @functools.wraps(forward)
    def wrapped_func(*args, **kwargs):
        return forward(*args, **kwargs)

    return wrapped_func


class _Llama(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    @_passing_through
    def forward(self, x):
        return self.proj(x)


class _Qwen(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(4, 8)

    @_passing_through
    def forward(self, x):
        return self.up(x).relu()


def test_models_sharing_a_decorated_forward_are_separate_frames():
    # Two models whose forwards share one wrapper code object are two first compiles, named
    # after their classes, even under max_recompiles=0; a new shape of one is still a recompile.
    options = {"max_recompiles": 0}
    llama = torch.compile(_Llama(), backend="neuron", dynamic=False, options=options)
    qwen = torch.compile(_Qwen(), backend="neuron", dynamic=False, options=options)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        llama(torch.randn(2, 4))
        qwen(torch.randn(2, 4))
    assert not [w for w in caught if issubclass(w.category, RecompileWarning)]
    names = [r.name for r in neuron_compile.metrics()]
    assert names[0].startswith("_Llama_") and names[1].startswith("_Qwen_"), names
    err = _call_error(qwen, 4)  # batch 3, was 2
    assert err.code == "NC202" and "_Qwen" in str(err)


def test_a_shape_compiled_first_is_no_recompile_when_the_dynamic_entry_meets_it():
    # dynamic=None: shape 4 compiles statically; from shape 5 on Dynamo's automatic-dynamic entry
    # takes every call, shape 4 included. Compiling 4 again there spends no recompile budget.
    f = torch.compile(_twice_plus_one, backend="neuron", options={"max_recompiles": 2})
    msgs = _recompile_warnings(f, 4, 5, 6, 4, 5)
    assert len(msgs) == 2 and "dim 1=5" in msgs[0] and "dim 1=6" in msgs[1]
    assert [r.recompile for r in neuron_compile.metrics()] == [False, True, True, False]


def test_after_going_dynamic_a_recompile_for_another_guard_still_counts():
    # Shape 4 and 5 make the frame dynamic; switching dropout to eval recompiles the frame
    # (another guard): its shape-5 graph is new, not a shape compiled before.
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5))
    f = torch.compile(model, backend="neuron")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        f(torch.randn(4, 4))
        f(torch.randn(5, 4))
        model.eval()
        f(torch.randn(5, 4))
    msgs = [str(w.message) for w in caught if issubclass(w.category, RecompileWarning)]
    assert len(msgs) == 2, msgs
    assert "same input shapes as an earlier compile" in msgs[1]
    assert "no input shape changed" in msgs[1] and "model.train()/eval()" in msgs[1]


def test_grad_mode_change_is_a_recompile_with_its_reason():
    f = torch.compile(_twice_plus_one, backend="neuron", dynamic=False)
    _recompile_warnings(f, 4)
    with torch.no_grad():  # during warm-up: an expected compile (evaluation), said at INFO
        assert _recompile_warnings(f, 4) == []
    assert "grad mode=False (was True)" in neuron_compile.recompiles()[0]
    g = torch.compile(lambda x: x * 2 + 1, backend="neuron", dynamic=False)
    _recompile_warnings(g, 4)
    neuron_compile.mark_warmup_done()
    with torch.no_grad():  # after warm-up: a recompile to hear about
        msgs = _recompile_warnings(g, 4)
    assert len(msgs) == 1 and "grad mode=False (was True)" in msgs[0]
    # No shape changed: the advice is about modes, not about padding to buckets.
    assert "no input shape changed" in msgs[0] and "pad variable dimensions" not in msgs[0]


@pytest.mark.parametrize("dynamic", [False, None])
def test_max_recompiles_trips_exactly_one_past_the_budget(dynamic):
    f = torch.compile(
        _twice_plus_one, backend="neuron", dynamic=dynamic, options={"max_recompiles": 2}
    )
    assert len(_recompile_warnings(f, 2, 3, 4)) == 2  # recompiles 1 and 2 are within budget
    err = _call_error(f, 5)
    assert err.code == "NC202"
    assert "x dim 1=5" in str(err) and "max_recompiles=2" in err.reason
    assert err.recompiles == 3
    # Shapes compiled before the budget ran out keep working, without new compiles.
    assert _recompile_warnings(f, 3, 4) == []
    assert len(neuron_compile.recompiles()) == 2


def test_max_recompiles_zero_allows_the_first_compile_only():
    f = torch.compile(
        _twice_plus_one, backend="neuron", dynamic=False, options={"max_recompiles": 0}
    )
    assert _recompile_warnings(f, 7, 7) == []
    assert _call_error(f, 8).code == "NC202"


def test_max_recompiles_from_env(monkeypatch):
    monkeypatch.setenv("NEURON_COMPILE_MAX_RECOMPILES", "1")
    f = torch.compile(_twice_plus_one, backend="neuron", dynamic=False)
    assert len(_recompile_warnings(f, 2, 3)) == 1
    assert _call_error(f, 4).code == "NC202"


def test_strict_mode_allows_warmup_then_fails_on_any_recompile():
    f = torch.compile(
        _twice_plus_one, backend="neuron", dynamic=False, options={"strict_recompile": True}
    )
    assert len(_recompile_warnings(f, 2, 3)) == 1  # warm-up: recompiles are only warnings
    neuron_compile.mark_warmup_done()
    assert _recompile_warnings(f, 2, 3, 2) == []  # already compiled shapes run
    err = _call_error(f, 6)
    assert err.code == "NC202" and "strict_recompile" in err.reason and "dim 1=6" in str(err)
    neuron_compile.mark_warmup_done(False)
    assert len(_recompile_warnings(f, 6)) == 1


def test_strict_mode_under_automatic_dynamic_raises_at_the_call():
    f = torch.compile(_twice_plus_one, backend="neuron", options={"strict_recompile": True})
    _recompile_warnings(f, 2, 3)
    neuron_compile.mark_warmup_done()
    with pytest.raises(NeuronCompileError, match=r"NC202.*dim 1=4"):
        f(torch.randn(3, 4))


def test_warning_names_the_bucket_that_would_absorb_the_shape():
    f = torch.compile(_twice_plus_one, backend="neuron", dynamic=False, options={"buckets": [4, 8]})
    msgs = _recompile_warnings(f, 3, 6, 9)
    assert "dim 1=6 (was 3), bucket 8 would have absorbed it" in msgs[0]
    assert "dim 1=9 (was 6), larger than the largest bucket 8" in msgs[1]


def test_reset_metrics_forgets_history_and_warmup():
    f = torch.compile(_twice_plus_one, backend="neuron", dynamic=False)
    _recompile_warnings(f, 2, 3)
    neuron_compile.mark_warmup_done()
    neuron_compile.reset_metrics()
    assert neuron_compile.recompiles() == []
    torch._dynamo.reset()
    f = torch.compile(
        _twice_plus_one, backend="neuron", dynamic=False, options={"strict_recompile": True}
    )
    assert len(_recompile_warnings(f, 2, 3)) == 1  # warm-up again: no error


def test_bucket_for():
    assert [bucket_for(n, (4, 8)) for n in (1, 4, 5, 8, 9)] == [4, 4, 8, 8, None]


def test_recompile_options_parse_and_validate():
    env = {"NEURON_COMPILE_MAX_RECOMPILES": "3", "NEURON_COMPILE_STRICT_RECOMPILE": "1"}
    env["NEURON_COMPILE_BUCKETS"] = "128, 256,512"
    cfg = load_config({}, env=env)
    assert (cfg.max_recompiles, cfg.strict_recompile, cfg.buckets) == (3, True, (128, 256, 512))
    assert load_config({}, env={}).max_recompiles is None
    for bad in ({"max_recompiles": -1}, {"max_recompiles": True}, {"buckets": [256, 128]}):
        with pytest.raises(OptionsError, match="NC001"):
            load_config(bad, env={})
    with pytest.raises(OptionsError, match="NC001"):
        load_config({}, env={"NEURON_COMPILE_MAX_RECOMPILES": "many"})


def _with_graph_break(x):
    y = x.sin()
    torch._dynamo.graph_break()
    return y.cos() + 1


def test_graph_break_frames_are_counted_separately():
    f = torch.compile(_with_graph_break, backend="neuron", dynamic=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (4, 4, 6, 6, 4):
            x = torch.randn(n)
            torch.testing.assert_close(f(x), _with_graph_break(x))
    msgs = [str(w.message) for w in caught if issubclass(w.category, RecompileWarning)]
    assert len(msgs) == 2
    assert "x dim 0=6 (was 4)" in msgs[0] and "y dim 0=6 (was 4)" in msgs[1]
    assert [r.recompile for r in neuron_compile.metrics()] == [False, False, True, True]


class _Tempered(torch.nn.Module):
    """A softmax whose temperature (a Python float attribute) changes with the batch size."""

    def __init__(self) -> None:
        super().__init__()
        self.lin, self.temp = torch.nn.Linear(3, 4), 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.lin(x) / self.temp).softmax(-1)


def test_floats_that_change_with_the_batch_size_compile_per_shape_like_eager():
    """Automatic dynamic shapes with a Python float that changes too: Dynamo passes the float as a
    0-d tensor read by ``item()``, which the per-shape static compile must trace with a ShapeEnv
    (it raised DataDependentOutputException from the second call on, every call after)."""
    torch.manual_seed(0)
    model = _Tempered()
    compiled = torch.compile(model, backend="neuron")
    scale = torch.compile(lambda x, s, k: x * s + k, backend="neuron")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecompileWarning)
        warnings.simplefilter("ignore", DowncastWarning)  # the float, as a float64 0-d tensor
        warnings.simplefilter("error", FallbackWarning)  # + k of a changing int: compiled too
        for batch, temp, k in [(2, 1.0, 1), (3, 0.5, -2), (4, 2.0, 3), (3, 0.7, 5)]:
            model.temp = temp
            x = torch.randn(batch, 3)
            torch.testing.assert_close(compiled(x), model(x))
            torch.testing.assert_close(scale(x, temp, k), x * temp + k)


def test_while_loop_with_changing_batch_size_compiles_per_shape():
    from torch._higher_order_ops.while_loop import while_loop

    def f(x: torch.Tensor) -> torch.Tensor:
        def cond(i, acc):
            return i < 3

        def body(i, acc):
            return i + 1, acc * 2 + 1

        return while_loop(cond, body, (torch.tensor(0), x))[1]

    compiled = torch.compile(f, backend="neuron")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecompileWarning)
        warnings.simplefilter("ignore", FallbackWarning)  # while_loop runs eagerly
        for batch in (2, 3, 4):
            x = torch.randn(batch, 3)
            torch.testing.assert_close(compiled(x), f(x))


def test_trn2_size_ints_of_automatic_dynamic_graphs_are_constants(monkeypatch):
    """Dynamo passes a symbolic size as a Python int input; each per-shape trn2 graph must take it
    as a constant (the ShapeEnv AOTAutograd traces with made it a symbol: NC501 on trn2)."""
    monkeypatch.setenv("NEURON_COMPILE_TARGET", "trn2")

    def f(x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0] * 2, -1).sum(1) * x.shape[0]

    compiled = torch.compile(f, backend="neuron")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecompileWarning)
        warnings.simplefilter("error", FallbackWarning)
        for batch in (2, 3, 4, 3):
            x = torch.randn(batch, 6)
            torch.testing.assert_close(compiled(x), f(x))
    assert [r.recompile for r in neuron_compile.metrics()] == [False, True, True]


@pytest.mark.filterwarnings("ignore::neuron_compile.shapes.RecompileWarning")
def test_a_graph_for_inputs_sharing_storage_serves_only_the_same_sharing():
    """After automatic dynamic shapes, the static graph compiled for two views of one tensor was
    served to separate tensors of those shapes (RuntimeError: size of tensor a (8) must match
    ... (4)) and to views at other offsets of the base (wrong values)."""

    def fn(a, b):
        a.mul_(2)
        return b + 1

    torch._dynamo.reset()
    f = torch.compile(fn, backend="neuron")
    f(torch.zeros(2), torch.zeros(2))
    f(torch.zeros(3), torch.zeros(3))  # the frame goes dynamic: static graphs per signature
    for k, n in ((2, 8), (1, 8), (3, 8), (4, 8), (2, 8), (2, 16)):
        base, ref = torch.arange(float(n)), torch.arange(float(n))
        out = f(base[:4], base[k : k + 4])
        expected = fn(ref[:4], ref[k : k + 4])
        assert torch.equal(out, expected) and torch.equal(base, ref), k
    a, b = torch.zeros(4), torch.ones(4)
    assert torch.equal(f(a, b), torch.full((4,), 2.0)) and torch.equal(a, torch.zeros(4))


def _recompiles(calls) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for call in calls:
            call()
    return [str(w.message) for w in caught if issubclass(w.category, RecompileWarning)]


def test_a_python_number_that_changes_is_named_and_advised_on():
    """Each value of a Python int argument is a compile: the warning names the argument as the
    user does and says to pass it as a tensor, not that a mode changed."""

    def f(x, step):
        return x * step + 1

    g = torch.compile(f, backend="neuron")
    x = torch.ones(3)
    msgs = _recompiles([functools.partial(g, x, step) for step in range(4)])
    assert len(msgs) == 3, msgs
    assert "step=3 (was 2)" in msgs[-1], msgs
    for msg in msgs:
        assert "torch.tensor(n)" in msg and "depends on a mode" not in msg, msg


def test_a_dtype_change_is_advised_on_as_one():
    model = torch.nn.Linear(4, 4)
    g = torch.compile(model, backend="neuron")
    x = torch.randn(2, 4)
    msgs = _recompiles([lambda: g(x), lambda: model.bfloat16(), lambda: g(x.bfloat16())])
    assert len(msgs) == 1, msgs
    assert "dtype torch.bfloat16 (was torch.float32)" in msgs[0]
    assert "an input's dtype changed" in msgs[0] and "depends on a mode" not in msgs[0]


def test_a_single_long_reason_is_not_cut():
    """A recompile for a guard on a global flag: the one long reason stays whole."""
    flag = {"on": False}
    k = torch.compile(lambda x: x * (3 if flag["on"] else 2), backend="neuron")
    x = torch.ones(3)
    msgs = _recompiles([lambda: k(x), lambda: flag.update(on=True), lambda: k(x)])
    assert len(msgs) == 1, msgs
    assert "TORCH_LOGS=recompiles shows which" in msgs[0], msgs
