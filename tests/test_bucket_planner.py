"""Bucket planner: exact DP equals brute force, respects alignment, beats powers of two."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from neuron_compile.bucket_planner import (
    compare_plans,
    cost_coefficients,
    cost_from_model,
    cost_from_module,
    evaluate_buckets,
    fixed_step_buckets,
    length_histogram,
    plan_buckets,
    power_of_two_buckets,
)

# At most 9 lengths (so at most 2**8 subsets for brute force), duplicates likely.
lengths_st = st.lists(st.integers(1, 120), min_size=1, max_size=9)
align_st = st.sampled_from([1, 1, 2, 4, 8, 16, 32])
cost_st = st.sampled_from(["linear", "attention", (1.0, 0.5), (0.0, 1.0), (3.0, 0.01)])


def brute_force(lengths, k, align, cost, compile_cost=0.0) -> float:
    """Minimum over every set of at most k aligned candidate boundaries."""
    cands = sorted({-(-n // align) * align for n in lengths})
    best = math.inf
    for r in range(min(k, len(cands))):
        for rest in itertools.combinations(cands[:-1], r):
            plan = evaluate_buckets(lengths, [*rest, cands[-1]], cost)
            best = min(best, plan.cost + compile_cost * (r + 1))
    return best


@settings(max_examples=200, derandomize=True, deadline=None)
@given(lengths_st, st.integers(1, 6), align_st, cost_st)
def test_planner_equals_brute_force_and_respects_alignment(lengths, k, align, cost):
    plan = plan_buckets(lengths, k, align=align, cost=cost)
    assert math.isclose(plan.cost, brute_force(lengths, k, align, cost), rel_tol=1e-9)
    assert math.isclose(plan.cost, plan.meta["dp_cost"], rel_tol=1e-9)
    assert 1 <= len(plan.buckets) <= k
    assert all(b % align == 0 for b in plan.boundaries)
    assert plan.boundaries[-1] >= max(lengths) and plan.boundaries == sorted(plan.boundaries)
    assert sum(b.count for b in plan.buckets) == len(lengths)
    assert plan.real_tokens == sum(lengths)


@settings(max_examples=100, derandomize=True, deadline=None)
@given(lengths_st, st.floats(0, 500), align_st)
def test_compile_cost_weight_equals_brute_force(lengths, compile_cost, align):
    plan = plan_buckets(lengths, None, compile_cost=compile_cost, align=align)
    total = plan.cost + compile_cost * len(plan.buckets)
    assert math.isclose(
        total, brute_force(lengths, 100, align, "linear", compile_cost), rel_tol=1e-9
    )


@settings(max_examples=200, derandomize=True, deadline=None)
@given(
    st.lists(st.integers(1, 5000), min_size=1, max_size=300),
    st.integers(1, 16),
    st.sampled_from([1, 8, 64, 128]),
)
def test_waste_never_worse_than_powers_of_two_or_fixed_step(lengths, k, align):
    plans = compare_plans(lengths, k, align=align)
    planner, pow2 = plans["planner"], plans["powers of two"]
    fixed = plans[f"multiples of {align if align > 1 else 128}"]
    assert len(pow2.buckets) <= k and len(fixed.buckets) <= k
    assert planner.padded_tokens <= pow2.padded_tokens
    assert planner.waste <= pow2.waste + 1e-12
    if align > 1:  # fixed-step boundaries are then aligned candidates too
        assert planner.padded_tokens <= fixed.padded_tokens


def test_small_known_instance():
    plan = plan_buckets([1, 2, 3, 10], 2)
    assert plan.boundaries == [3, 10] and plan.cost == 19.0 and plan.padded_tokens == 19
    assert [(b.count, b.max_len, b.padded_tokens) for b in plan.buckets] == [(3, 3, 9), (1, 10, 10)]
    assert plan.buckets[0].waste == pytest.approx(1 - 6 / 9) and plan.waste == pytest.approx(3 / 19)
    assert plan.bucket_for(2) == 3 and plan.bucket_for(4) == 10
    aligned = plan_buckets([1, 2, 3, 10], 2, align=8)
    assert aligned.boundaries == [8, 16]
    assert plan_buckets([5, 5, 5], 4).boundaries == [5]  # never more buckets than lengths


def test_attention_cost_prefers_tighter_long_buckets():
    # Split at 10: the 50s pad to 100 (linear 4*50 = 200, quadratic 4*7500 = 30000).
    # Split at 50: the 10s pad to 50 (linear 6*40 = 240, quadratic 6*2400 = 14400).
    lengths = [10] * 6 + [50] * 4 + [100]
    assert plan_buckets(lengths, 2, cost="linear").boundaries == [10, 100]
    assert plan_buckets(lengths, 2, cost=(0.0, 1.0)).boundaries == [50, 100]


def test_compile_cost_trades_buckets_for_padding():
    lengths = [10] * 5 + [20] * 5 + [40] * 5
    assert plan_buckets(lengths, compile_cost=0.0).boundaries == [10, 20, 40]
    assert plan_buckets(lengths, compile_cost=49.0).boundaries == [10, 20, 40]
    assert plan_buckets(lengths, compile_cost=51.0).boundaries == [20, 40]
    assert plan_buckets(lengths, compile_cost=1e6).boundaries == [40]


def test_histogram_sources():
    assert length_histogram([3, 3, 5]) == Counter({3: 2, 5: 1})
    assert length_histogram(Counter({4: 2, 7: 0})) == Counter({4: 2})
    data = [torch.zeros(n) for n in (2, 2, 9)]
    assert length_histogram(data) == Counter({2: 2, 9: 1})
    pairs = [(torch.zeros(n), torch.zeros(n)) for n in (1, 4)]
    assert length_histogram(pairs) == Counter({1: 1, 4: 1})
    loader = DataLoader(data, batch_size=2, collate_fn=list)
    assert length_histogram(loader) == Counter({2: 2, 9: 1})
    assert length_histogram(["ab", "abcd"], length_fn=lambda s: 2 * len(s)) == Counter({4: 1, 8: 1})
    plan = plan_buckets(data, 1)
    assert plan.boundaries == [9]
    with pytest.raises(ValueError, match="positive"):
        length_histogram([0, 3])
    with pytest.raises(ValueError, match="no lengths"):
        length_histogram([])


def test_baselines_and_validation():
    assert power_of_two_buckets(300, 4) == [64, 128, 256, 512]
    assert power_of_two_buckets(300, 8, align=128) == [128, 256, 512]
    assert fixed_step_buckets(300, 8) == [128, 256, 384]
    assert fixed_step_buckets(1000, 4) == [256, 512, 768, 1024]
    assert fixed_step_buckets(1000, 4, step=100) == [300, 600, 900, 1200]
    with pytest.raises(ValueError, match="exceeds the largest bucket"):
        evaluate_buckets([10], [8])
    with pytest.raises(ValueError):
        plan_buckets([3], 0)
    with pytest.raises(ValueError):
        cost_coefficients("cubic")
    assert cost_coefficients("attention") == (1.0, 1 / 4608)


# ---- cost coefficients from the roofline cost model -------------------------------------------
class _TinyBlock(torch.nn.Module):
    """Pre-norm-free transformer block: causal attention (quadratic in L) plus an MLP."""

    def __init__(self, d: int = 64, heads: int = 4, attention: bool = True) -> None:
        super().__init__()
        self.heads, self.attention = heads, attention
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.out = torch.nn.Linear(d, d)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.attention:
            b, t, d = x.shape
            qkv = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
            y = torch.nn.functional.scaled_dot_product_attention(*qkv, is_causal=True)
            x = x + self.out(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(x)


def test_cost_from_model_fits_a_quadratic_term_only_for_attention():
    sizes = (32, 64, 128, 256)
    a, b = cost_from_module(_TinyBlock(), lambda n: torch.randn(1, n, 64), sizes)
    assert a > 0 and b > 0
    a_mlp, b_mlp = cost_from_module(
        _TinyBlock(attention=False), lambda n: torch.randn(1, n, 64), sizes
    )
    assert a_mlp > 0 and b_mlp * 128 < 1e-6 * a_mlp  # b·L² negligible next to a·L at L=128
    plan = plan_buckets([10, 50, 100, 200, 250], 2, cost=(a, b))
    assert plan.boundaries[-1] == 250


def test_cost_from_model_recovers_exact_coefficients():
    # The fit recovers a·L + b·L² + c (a, b, c >= 0) and drops the per-call constant c.
    from neuron_compile.bucket_planner import _fit_nonnegative

    lengths = np.array([16.0, 32.0, 64.0, 128.0])
    a, b = _fit_nonnegative(lengths, 2e-9 * lengths + 3e-12 * lengths**2 + 5e-7)
    assert a == pytest.approx(2e-9, rel=1e-6) and b == pytest.approx(3e-12, rel=1e-6)
    with pytest.raises(ValueError, match="two distinct"):
        cost_from_model(lambda n: "", [8, 8])


class _Attention(torch.nn.Module):
    """Two heads of 64 at the caller's sequence length: qualifies for the flash op on trn."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.qkv = torch.nn.Linear(128, 3 * 128)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 2, 64).permute(2, 0, 3, 1, 4)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


@pytest.mark.filterwarnings("ignore:neuron-compile. target trn2 without neuronx-cc")
def test_inference_graph_text_lowers_what_the_backend_compiles_for_trn(monkeypatch):
    # The planner's trace routes SDPA to the flash op and passes the LNC to the lowering, as the
    # backend does for trn targets: with the NKI toolchain (TEST DOUBLES here) the module holds
    # the flash_fwd kernel call on the LNC's launch grid, not the math path.
    from neuron_compile.bucket_planner import inference_graph_text
    from neuron_compile.trainium import lowering as neuron_calls
    from neuron_compile.trainium.kernels import nki as nki_mod
    from tests import nki_double

    monkeypatch.setattr(nki_mod, "_WARNED", set())
    monkeypatch.setattr(nki_mod, "_CONFIGS", {})
    monkeypatch.setattr(neuron_calls, "_SKIPPED", set())
    nki_double.install(monkeypatch)
    kernels = nki_double.install_flash_kernels(monkeypatch)
    model, x = _Attention(), torch.randn(1, 512, 128)

    text = inference_graph_text(model, (x,), "trn2", lnc=2)
    assert text.count("AwsNeuronCustomNativeKernel") == 1
    assert text.count("stablehlo.dot_general") == 1  # the projection; no attention matmuls left
    ((_, grid),) = kernels.flash_fwd.traced
    assert grid == (1, nki_double.NcDim(2, 1))

    # Without the routing: the math path (bmm, softmax), and the flash kernel is not traced again.
    off = inference_graph_text(model, (x,), "trn2", lnc=2, flash_attention=False)
    cpu = inference_graph_text(model, (x,), "cpu")
    assert off.count("stablehlo.dot_general") == cpu.count("stablehlo.dot_general") == 3
    assert "AwsNeuron" not in cpu and "stablehlo.exponential" in cpu
    assert len(kernels.flash_fwd.traced) == 1


def test_dict_samples_are_measured_by_their_sequence_not_their_keys():
    """A Hugging Face-style dataset of dicts was measured as len(dict), the number of keys: the
    plan was [2] whatever the lengths."""
    ds = [{"input_ids": torch.arange(n), "labels": torch.arange(n)} for n in (5, 17, 40, 33)]
    assert length_histogram(ds) == {5: 1, 17: 1, 40: 1, 33: 1}
    assert plan_buckets(ds, 2).boundaries == [17, 40]
    with pytest.raises(ValueError, match="no field of the sample has a length"):
        length_histogram([{"label": torch.tensor(3)}])
