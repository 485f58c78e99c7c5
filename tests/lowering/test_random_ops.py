"""Random ops of ``stablehlo/random_draws.py``: randint, random, uniform, exponential, normal,
bernoulli(p tensor), multinomial and rrelu. Bits differ from eager's; distribution, dtype, shape,
range, reproducibility under ``torch.manual_seed`` and eval-mode rrelu (exactly eager) must hold.
Every graph compiles with ``fallback="error"``, so a CPU fallback fails the test."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import tensor_digest

N = 100_000
SE = 6 / math.sqrt(N)  # 6 standard errors of a mean of N draws with unit variance


def _compiled(fn):
    return torch.compile(fn, backend="neuron", dynamic=False, options={"fallback": "error"})


# ---- randint / random ------------------------------------------------------------------------
INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.uint8, torch.float32, torch.bfloat16)


def test_randint_low_high_range_dtype_and_uniformity():
    draws = _compiled(
        lambda: [torch.randint(2 if d == torch.uint8 else -3, 9, (N,), dtype=d) for d in INT_DTYPES]
    )()
    for dtype, r in zip(INT_DTYPES, draws, strict=True):
        lo = 2 if dtype == torch.uint8 else -3
        assert r.dtype == dtype and r.shape == (N,)
        assert r.min().item() == lo and r.max().item() == 8
        counts = torch.bincount(r.long() - lo)
        assert (counts.float() / N - 1 / (9 - lo)).abs().max() < 0.01, dtype


def test_randint_high_only_and_like_and_bool():
    f = _compiled(
        lambda x: (
            torch.randint(5, (3, 4000)),
            torch.randint_like(x, 10, 20),
            torch.randint(0, 2, (4000,), dtype=torch.bool),
        )
    )
    a, b, c = f(torch.empty(2, 3000, dtype=torch.int16))
    assert a.dtype == torch.int64 and a.shape == (3, 4000)
    assert set(a.unique().tolist()) == set(range(5))
    assert b.dtype == torch.int16 and b.shape == (2, 3000)
    assert set(b.unique().tolist()) == set(range(10, 20))
    assert c.dtype == torch.bool and 0.45 < c.float().mean().item() < 0.55


def test_randint_full_int32_range_covers_both_signs():
    r = _compiled(lambda: torch.randint(-(2**31), 2**31 - 1, (N,), dtype=torch.int32))()
    assert r.dtype == torch.int32
    assert abs((r < 0).float().mean().item() - 0.5) < 0.01
    assert r.double().std().item() > 2**30  # spread over the whole range, not a corner of it
    assert r.max().item() < 2**31 - 1


def test_randint_out_of_range_falls_back_to_eager():
    # Eager's 64-bit path (range >= 2**32) cannot run in 32 bits: the op must fall back, not
    # draw a wrong range.
    with pytest.raises(Exception, match="randint"):
        _compiled(lambda: torch.randint(0, 2**40, (8,)))()


def _lookup(fn, *args):
    """What the registry answers for the randint/multinomial/rrelu node of ``fn``'s graph."""
    from neuron_compile.lowering.registry import lookup
    from tests.helpers import trace_aten

    names = ("randint", "multinomial", "rrelu_with_noise_backward")
    nodes = trace_aten(fn, *args).graph.nodes
    (node,) = [n for n in nodes if getattr(n.target, "__name__", "").split(".")[0] in names]
    return lookup(node)


def test_cases_eager_rejects_or_cannot_thread_fall_back_with_a_reason():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(3, 4)
    reasons = {
        "Generator": _lookup(lambda: torch.randint(0, 5, (3,), generator=g)),
        "64-bit": _lookup(lambda: torch.randint(0, 2**33, (3,))),
        "out of bounds": _lookup(lambda: torch.randint(0, 300, (3,), dtype=torch.uint8)),
        "more samples": _lookup(lambda p: torch.multinomial(p, 5), x),
        "negative slope": _lookup(
            lambda a: torch.ops.aten.rrelu_with_noise_backward(a, a, a, -0.3, -0.1, False, True),
            x,
        ),
    }
    for word, why in reasons.items():
        assert isinstance(why, str) and word in why, (word, why)
    assert not isinstance(_lookup(lambda: torch.randint(0, 2**31, (3,))), str)


def test_random_functional_matches_eager_ranges():
    # Dynamo graph-breaks on Tensor.random_, so the functional op reaches the backend only from
    # traced code; lower it there, as AOTAutograd's functionalization hands it over.
    from tests.helpers import run_lowered

    x = torch.empty(N)
    # (aten.random.from cannot be traced at all: FX prints it as `random.from`, a syntax error.)
    to, full = run_lowered(
        lambda t: (
            torch.ops.aten.random.to(t, 7),
            torch.ops.aten.random.default(t.to(torch.bfloat16)),
        ),
        x,
    )
    assert to.dtype == torch.float32 and set(to.unique().tolist()) == set(range(7))
    assert full.dtype == torch.bfloat16 and full.min() >= 0 and full.max() <= 256
    assert full.max() > 200  # eager's bf16 range is [0, 2**8]


# ---- float draws -----------------------------------------------------------------------------
def test_uniform_range_mean_and_upper_end_excluded():
    dtypes = (torch.float32, torch.bfloat16)
    f = _compiled(
        lambda *xs: [x.uniform_(-2.0, 3.0) if i % 2 else x.uniform_() for i, x in enumerate(xs)]
    )
    draws = f(*[torch.empty(N, dtype=d) for d in dtypes for _ in range(2)])
    for k, dtype in enumerate(dtypes):
        v, u = draws[2 * k : 2 * k + 2]
        assert u.dtype == v.dtype == dtype
        assert u.min() >= -2 and u.max() < 3
        assert abs(u.float().mean().item() - 0.5) < SE * 5 / math.sqrt(12)
        # bf16 rounds 0.999 up to 1.0; eager's range is half open, so is ours
        assert v.min() >= 0 and v.max() < 1


def test_exponential_is_positive_with_mean_one_over_lambda():
    f = _compiled(lambda x, y: (x.exponential_(2.0), y.exponential_(2.0)))
    for z in f(torch.empty(N), torch.empty(N, dtype=torch.bfloat16)):
        assert (z > 0).all()
        assert abs(z.float().mean().item() - 0.5) < SE * 0.5
        assert abs((z.float() > 0.5).float().mean().item() - math.exp(-1)) < 0.01  # the tail
    assert z.dtype == torch.bfloat16


def test_normal_and_randn_with_no_generator():
    a, b = _compiled(
        lambda x: (x.normal_(3.0, 2.0), torch.randn(N, generator=None, dtype=torch.bfloat16))
    )(torch.empty(N))
    assert abs(a.mean().item() - 3) < 2 * SE and abs(a.std().item() - 2) < 0.02
    assert b.dtype == torch.bfloat16 and abs(b.float().std().item() - 1) < 0.02


def test_normal_overloads_cauchy_log_normal_and_geometric():
    def draws(x, m, sd):
        return (
            torch.normal(m, 2.0),  # Tensor_float: mean per element
            torch.normal(1.0, sd),  # float_Tensor
            torch.normal(m, sd),  # Tensor_Tensor
            torch.normal(-1.0, 0.5, (N,)),  # float_float
            x.clone().cauchy_(1.0, 2.0),
            x.clone().log_normal_(0.5, 0.25),
            x.clone().geometric_(0.25),
        )

    m = torch.full((N,), 3.0)
    sd = torch.full((N,), 0.5, dtype=torch.bfloat16).float()
    a, b, c, d, cau, logn, geo = _compiled(draws)(torch.empty(N), m, sd)
    for z, mu, sigma in ((a, 3, 2), (b, 1, 0.5), (c, 3, 0.5), (d, -1, 0.5)):
        assert z.shape == (N,) and abs(z.mean().item() - mu) < SE * sigma
        assert abs(z.std().item() - sigma) < 0.02 * sigma
    q = torch.quantile(cau[:50_000], torch.tensor([0.25, 0.5, 0.75]))
    torch.testing.assert_close(q, torch.tensor([-1.0, 1.0, 3.0]), atol=0.06, rtol=0)
    assert (logn > 0).all() and abs(logn.log().mean().item() - 0.5) < SE * 0.25
    assert geo.min() == 1 and torch.equal(geo, geo.round())
    assert abs(geo.mean().item() - 4) < 0.06  # 1/p
    assert abs((geo == 1).float().mean().item() - 0.25) < 0.01


def test_randperm_is_a_uniform_permutation():
    perms = _compiled(lambda: [torch.randperm(7) for _ in range(1)] + [torch.randperm(0)])()
    assert perms[0].dtype == torch.int64 and sorted(perms[0].tolist()) == list(range(7))
    assert perms[1].shape == (0,)
    f = _compiled(lambda x: torch.randperm(5, dtype=torch.int32) + x)
    firsts = torch.stack([f(torch.zeros(5, dtype=torch.int32)) for _ in range(400)])
    assert (firsts.sort(1).values == torch.arange(5)).all()
    counts = torch.bincount(firsts[:, 0].long(), minlength=5).float() / 400
    assert (counts - 0.2).abs().max() < 0.08


def test_bernoulli_with_a_probability_tensor_broadcasts_and_keeps_dtype():
    p = torch.tensor([0.0, 0.2, 0.7, 1.0])
    d = _compiled(lambda x, q: x.bernoulli_(q))(torch.empty(N // 4, 4, dtype=torch.bfloat16), p)
    assert d.dtype == torch.bfloat16 and set(d.unique().tolist()) <= {0.0, 1.0}
    torch.testing.assert_close(d.float().mean(0), p, atol=0.015, rtol=0)
    assert (d[:, 0] == 0).all() and (d[:, 3] == 1).all()


# ---- multinomial -----------------------------------------------------------------------------
P = torch.tensor([[0.0, 1.0, 3.0, 0.0, 4.0, 0.0], [2.0, 0.0, 0.0, 2.0, 0.0, 0.0]])


def test_multinomial_with_replacement_frequencies_and_no_zero_category():
    draws = _compiled(lambda p: torch.multinomial(p, N // 2, replacement=True))(P)
    assert draws.dtype == torch.int64 and draws.shape == (2, N // 2)
    for row in range(2):
        freq = torch.bincount(draws[row], minlength=6).float() / (N // 2)
        torch.testing.assert_close(freq, P[row] / P[row].sum(), atol=0.01, rtol=0)
        assert (freq[P[row] == 0] == 0).all()  # never, not just rarely


def test_multinomial_without_replacement_is_a_permutation_of_positive_categories():
    p = P[0].repeat(4000, 1)
    draws = _compiled(lambda q: torch.multinomial(q, 3))(p)
    assert draws.dtype == torch.int64 and draws.shape == (4000, 3)
    assert (draws.sort(1).values == torch.tensor([1, 2, 4])).all()  # all three positive, once
    # first draw ~ p, second given the first as sampling without replacement says
    first = torch.bincount(draws[:, 0], minlength=6).float() / 4000
    torch.testing.assert_close(first, P[0] / 8, atol=0.03, rtol=0)


def test_multinomial_one_dim_single_sample():
    p = torch.tensor([0.0, 0.0, 5.0, 0.0])
    f = _compiled(lambda q: (torch.multinomial(q, 1), torch.multinomial(q, 4, True)))
    a, b = f(p)
    assert a.shape == (1,) and a.item() == 2 and (b == 2).all()


# ---- reproducibility ---------------------------------------------------------------------------
def _draw_all(x, p):
    return (
        torch.randint(0, 100, (64,)),
        x.clone().uniform_(),
        x.clone().exponential_(),
        torch.multinomial(p, 3),
        torch.multinomial(p, 5, replacement=True),
        F.rrelu(x, training=True),
    )


def test_manual_seed_reproduces_and_successive_calls_differ():
    f = _compiled(_draw_all)
    x, p = torch.randn(64), torch.rand(2, 8) + 0.1
    torch.manual_seed(3)
    a = f(x, p)
    b = f(x, p)
    torch.manual_seed(3)
    c = f(x, p)
    assert all(torch.equal(u, v) for u, v in zip(a, c, strict=True))
    assert not torch.equal(a[0], b[0]) and not torch.equal(a[1], b[1])


def test_cached_executable_draws_the_same_numbers():
    # A fresh Dynamo compile of the same graph is served from our cache (memory or disk): the
    # seed argument, not state baked into the executable, must make its draws.
    import neuron_compile

    x, p = torch.linspace(-2, 2, 64), torch.linspace(0.1, 1, 16).reshape(2, 8)
    runs = []
    for _ in range(2):
        torch._dynamo.reset()
        before = len(neuron_compile.metrics())
        torch.manual_seed(11)
        runs.append((_compiled(_draw_all)(x, p), neuron_compile.metrics()[before:]))
    assert tensor_digest(runs[0][0]) == tensor_digest(runs[1][0])
    assert [r.cache_source for r in runs[1][1]] in (["memory"], ["disk"])


# ---- rrelu -------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rrelu_eval_forward_and_backward_equal_eager_exactly(dtype):
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(s, generator=g).to(dtype) * 3 for s in ((257,), (3, 4, 5), ())]
    xs[0][:4] = torch.tensor([0.0, -0.0, -1e-3, float("nan")])
    bounds = [(0.1, 0.4), (1 / 8, 1 / 3), (0.3, 0.3), (-0.2, 0.05)]

    def rrelus(*ts):
        return [F.rrelu(t, lo, hi, training=False) for t in ts for lo, hi in bounds]

    def run(fn):
        leaves = [x.clone().requires_grad_() for x in xs]
        ys = fn(*leaves)
        sum((y * (k + 1.5)).sum() for k, y in enumerate(ys)).backward()
        return [y.detach() for y in ys] + [t.grad for t in leaves]

    for got, want in zip(run(_compiled(rrelus)), run(rrelus), strict=True):
        assert got.dtype == want.dtype and torch.equal(got.nan_to_num(7), want.nan_to_num(7))


def test_rrelu_eval_module_and_default_bounds():
    m = torch.nn.RReLU().eval()
    x = torch.randn(4, 33)
    assert torch.equal(_compiled(m)(x), m(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rrelu_training_noise_in_bounds_and_backward_multiplies_by_it(dtype):
    lower, upper = 0.1, 0.4
    x = torch.randn(N, dtype=dtype).requires_grad_()
    y = _compiled(lambda t: F.rrelu(t, lower, upper, training=True))(x)
    assert y.dtype == dtype
    pos = x.detach() > 0
    assert torch.equal(y[pos], x.detach()[pos])
    slope = y.detach()[~pos].float() / x.detach()[~pos].float()
    assert slope.min() >= lower - 0.01 and slope.max() <= upper + 0.01
    assert abs(slope.mean().item() - (lower + upper) / 2) < 0.01
    assert slope.std().item() > 0.05  # drawn per element, not one slope
    y.sum().backward()
    assert (x.grad[pos] == 1).all()
    noise = x.grad[~pos].float()
    assert noise.min() >= lower - 0.01 and noise.max() <= upper + 0.01
    torch.testing.assert_close(
        y.detach()[~pos].float(), (x.detach()[~pos] * x.grad[~pos]).float(), atol=0, rtol=0.02
    )
