"""The call plan of compiled_graph.py: from the second call on, a graph runs through C-level
gathers. Each test calls a graph several times and checks eager semantics on every call, plus
that the calls after the first really took the planned path."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from neuron_compile.compiled_graph import CompiledGraph, _FastPlan, gather
from neuron_compile.compiler import DowncastWarning


@pytest.fixture
def paths(monkeypatch):
    """Counts calls per path: general (the first call, or any call the plan does not hold for)
    and planned."""
    counts = {"general": 0, "planned": 0}
    real_general, real_args = CompiledGraph._call_general, _FastPlan.arguments_of

    def general(self, args):
        counts["general"] += 1
        return real_general(self, args)

    def arguments_of(self, graph, args):
        arguments = real_args(self, graph, args)
        counts["planned"] += arguments is not None
        return arguments

    monkeypatch.setattr(CompiledGraph, "_call_general", general)
    monkeypatch.setattr(_FastPlan, "arguments_of", arguments_of)
    return counts


def test_gather_returns_tuples_for_any_length():
    seq = ["a", "b", "c"]
    assert (gather([])(seq), gather([2])(seq), gather([2, 0])(seq)) == ((), ("c",), ("c", "a"))


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))


def _steps(model, xs, compiled: bool):
    run = torch.compile(model, backend="neuron") if compiled else model
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for x in xs:
        opt.zero_grad()
        loss = run(x).square().mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_training_steps_after_the_first_run_planned_and_match_eager(paths):
    xs = [torch.randn(5, 8) for _ in range(4)]
    got = _steps(_mlp(), xs, compiled=True)
    want = _steps(_mlp(), xs, compiled=False)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert paths == {"general": 2, "planned": 6}  # forward + backward: 1 general, 3 planned


def test_a_replaced_parameter_takes_the_general_path_once_then_plans_again(paths):
    model, ref = _mlp(), _mlp()
    run = torch.compile(model, backend="neuron")
    x = torch.randn(3, 8)
    with torch.no_grad():
        run(x)
        run(x)
        new = torch.randn(16, 8)
        for m in (model, ref):
            m[0].weight.data = new.clone()  # same Parameter, new storage
        torch.testing.assert_close(run(x), ref(x))
        torch.testing.assert_close(run(x), ref(x))
    assert paths == {"general": 2, "planned": 2}


def test_staged_token_ids_take_each_calls_values():
    torch.manual_seed(0)
    emb = torch.nn.Embedding(50, 6)
    run = torch.compile(lambda ids: emb(ids).sum(-1), backend="neuron")
    run(torch.randint(0, 50, (2, 5)))  # token ids are indices: narrowed exactly, no warning
    for _ in range(3):  # fresh ids each call: a stale staging buffer would repeat old rows
        ids = torch.randint(0, 50, (2, 5))
        torch.testing.assert_close(run(ids), emb(ids).sum(-1))


def test_staged_inputs_are_per_call_even_when_the_caller_reuses_the_tensor(paths):
    f = torch.compile(lambda i, x: (x * i).sum() + i.sum(), backend="neuron")
    i, x = torch.arange(4), torch.ones(4)
    results = []
    with pytest.warns(UserWarning, match="int64"):
        for _ in range(3):
            results.append(f(i, x).item())
            i.add_(1)  # the caller edits its tensor in place between calls
    assert results == [12.0, 20.0, 28.0] and paths["planned"] == 2


def test_outputs_of_every_kind_on_planned_calls():
    def f(x, flags):
        x.mul_(2)  # a mutated input
        return x.view(2, 3), (x + 1).argmax(), flags.logical_not(), None, 7

    run = torch.compile(f, backend="neuron")
    for step in range(3):
        x, ref = torch.arange(6.0) + step, torch.arange(6.0) + step
        flags = torch.tensor([True, False, step % 2 == 0])
        view, arg, neg, none, seven = run(x, flags)
        want = f(ref, flags)
        torch.testing.assert_close(x, ref)
        x[0] = -5.0
        assert view[0, 0].item() == -5.0  # still a view of the caller's tensor
        assert arg.dtype == torch.int64 and arg.item() == want[1].item()
        assert torch.equal(neg, want[2]) and none is None and seven == 7


def test_none_gradients_and_non_contiguous_inputs_on_planned_calls():
    def f(a, b, c):
        return (a * b.t()).sum()

    run = torch.compile(f, backend="neuron")
    for _ in range(3):
        a = torch.randn(3, 4, requires_grad=True)
        b = torch.randn(4, 3, requires_grad=True)
        c = torch.randn(2, requires_grad=True)
        run(a, b, c).backward()
        torch.testing.assert_close(a.grad, b.detach().t())
        torch.testing.assert_close(b.grad, a.detach().t())
        assert c.grad is None


def test_dropout_draws_a_fresh_mask_each_planned_call_and_manual_seed_replays():
    drop = torch.compile(lambda x: F.dropout(x, 0.5, training=True), backend="neuron")
    x = torch.ones(256)
    torch.manual_seed(1)
    first = [drop(x) for _ in range(3)]
    torch.manual_seed(1)
    second = [drop(x) for _ in range(3)]
    assert not torch.equal(first[1], first[2])
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


def test_saved_tensor_hooks_on_planned_calls_see_real_tensors(paths):
    model, ref = _mlp(), _mlp()
    xs = [torch.randn(4, 8) for _ in range(3)]
    _steps(model, xs[:1], compiled=True)  # plans exist for both graphs
    shapes = []

    def pack(t):
        shapes.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        got = _steps(model, xs[1:], compiled=True)
    _steps(ref, xs[:1], compiled=False)
    want = _steps(ref, xs[1:], compiled=False)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert shapes and (0,) not in shapes  # no device token reached a hook
    # The backward has no token under hooks, so it takes the general path.
    assert paths["general"] >= 3 and paths["planned"] >= 2


def test_compiled_autograd_traces_real_saved_tensors():
    # With compiled autograd on, the backward is traced into its own graph with the saved
    # tensors as inputs: the forward must hand over real activations, not a device token.
    import neuron_compile

    model, ref = _mlp(), _mlp()
    xs = [torch.randn(4, 8) for _ in range(3)]
    got, want = [], []
    with torch._dynamo.config.patch(compiled_autograd=True):  # read by torch.compile itself
        step = torch.compile(lambda x: _step_inside(model, x), backend="neuron")
        for x in xs:
            model.zero_grad(), ref.zero_grad()
            got.append(step(x))
            want.append(_step_inside(ref, x))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)
    names = [r.name for r in neuron_compile.metrics()]
    assert any(n.startswith("CompiledAutograd") for n in names), names


def _step_inside(model, x):
    loss = model(x).square().mean()
    loss.backward()
    return loss.detach()


def test_small_float_inputs_are_staged_and_gradients_match(paths, monkeypatch):
    plans = []
    real_init = _FastPlan.__init__

    def init(self, graph):
        real_init(self, graph)
        plans.append(self)

    monkeypatch.setattr(_FastPlan, "__init__", init)
    f = torch.compile(lambda x, y: (x * y).sin().sum(), backend="neuron")
    for _ in range(3):
        x = torch.randn(5, requires_grad=True)
        y = torch.randn(5, requires_grad=True)
        f(x, y).backward()
        torch.testing.assert_close(x.grad, (x * y).cos().detach() * y.detach())
    buffers = [buf for plan in plans for _, buf in plan.staging]
    assert buffers and not any(buf.requires_grad for buf in buffers)
    assert paths["planned"] == 4


def test_threads_calling_one_graph_never_share_a_staging_buffer(paths):
    import threading

    torch.manual_seed(0)
    emb = torch.nn.Embedding(1000, 64)
    run = torch.compile(lambda ids: emb(ids).sum(-1), backend="neuron")
    with torch.no_grad():  # token ids are indices: narrowed exactly, no DowncastWarning
        run(torch.zeros(4, 64, dtype=torch.int64))
    errors = []

    def worker(seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for _ in range(40):
                ids = torch.randint(0, 1000, (4, 64), generator=gen)
                if not torch.allclose(run(ids), emb(ids).sum(-1), rtol=1e-4, atol=1e-4):
                    errors.append(seed)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert paths["planned"] > 0


@pytest.mark.parametrize("calls", [1, 3])
def test_a_narrowed_result_saved_and_returned_is_one_tensor(calls):
    # max's int64 indices run as int32 (the 64-bit policy), are a user output and a saved
    # value: both slots must hold one tensor, so an in-place edit trips autograd as in eager.
    f = torch.compile(lambda x: x.max(1), backend="neuron")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DowncastWarning)  # the saved indices narrow exactly
        for _ in range(calls - 1):
            f(torch.randn(3, 4, requires_grad=True))[0].sum().backward()
        values, indices = f(torch.randn(3, 4, requires_grad=True))
    assert indices.dtype == torch.int64
    indices.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        values.sum().backward()
