"""examples/generate_kv_cache.py: one prefill graph per prompt bucket, one decode graph, and the
static-cache tokens equal eager and a no-cache full-attention reference."""

from __future__ import annotations

import warnings

import pytest
import torch
from generate_kv_cache import (
    Generator,
    KVCacheGPT,
    generate_no_cache,
    prompts_of,
    run,
    trained_gpt,
)
from train_gpt import GPTConfig

import neuron_compile

CFG = GPTConfig(vocab_size=32, block_size=24, n_layer=2, n_head=2, d_model=32)


@pytest.fixture(scope="module")
def gpt():
    return trained_gpt(CFG, steps=40)


def _inference_graphs(part: str) -> list[neuron_compile.GraphRecord]:
    return [r for r in neuron_compile.metrics() if r.kind == "inference" and part in r.name]


def test_one_prefill_graph_per_bucket_one_decode_graph_tokens_match_eager_and_no_cache(gpt):
    lengths, new_tokens = [3, 6, 11, 9], 7
    out = run(lengths, new_tokens, [8, 16], CFG, gpt=gpt)
    assert out["buckets_used"] == [8, 16]
    assert len(out["prefill_graphs"]) == 2
    assert [r.calls for r in out["prefill_graphs"]] == [2, 2]
    (decode,) = out["decode_graphs"]
    assert decode.calls == len(lengths) * (new_tokens - 1)
    assert len(out["graphs"]) == 3 and not any(r.fallback_ops for r in out["graphs"])
    for got, eager, ref in zip(out["compiled"], out["eager"], out["no_cache"], strict=True):
        assert got.shape == (2, new_tokens)
        assert torch.equal(got, eager)
        assert torch.equal(got, ref)
    for got, eager in zip(out["compiled_logits"], out["eager_logits"], strict=True):
        torch.testing.assert_close(got, eager, rtol=1e-4, atol=1e-4)


def test_decode_graph_count_does_not_grow_with_generated_tokens(gpt):
    gen = Generator(gpt, [16])
    prompt = prompts_of(CFG, [5])[0]
    short, _ = gen.generate(prompt, 2)
    long, _ = gen.generate(prompt, 12)
    assert torch.equal(long[:, :2], short)
    assert torch.equal(long, generate_no_cache(gpt, prompt, 12))
    (decode,) = _inference_graphs("Decode")
    assert decode.calls == 1 + 11
    assert len(_inference_graphs("Prefill")) == 1
    assert neuron_compile.recompiles() == []


def test_decode_masks_cache_rows_after_pos_and_reads_rows_before(gpt):
    """Rows > pos (prefill padding, stale values) must not matter; rows < pos must."""
    m = KVCacheGPT(gpt)
    prompt = prompts_of(CFG, [5])[0]
    padded = torch.cat([prompt, torch.zeros(2, 3, dtype=prompt.dtype)], dim=1)  # bucket 8
    with torch.no_grad():
        _, cache = m.forward_prefill(padded, m.empty_cache(2))
        token, pos = prompt[:, -1:], torch.tensor([5])
        ref, _ = m.forward_decode(token, pos, cache)
        g = torch.Generator().manual_seed(0)
        after = tuple(c.clone() for c in cache)
        before = tuple(c.clone() for c in cache)
        for a, b in zip(after, before, strict=True):
            a[:, :, 6:] = 100 * torch.randn(a[:, :, 6:].shape, generator=g)
            b[:, :, 2] = 100 * torch.randn(b[:, :, 2].shape, generator=g)
        torch.testing.assert_close(m.forward_decode(token, pos, after)[0], ref)
        assert not torch.allclose(m.forward_decode(token, pos, before)[0], ref, atol=1e-3)


def test_generate_rejects_more_tokens_than_the_cache_holds(gpt):
    gen = Generator(gpt, [8, 16], backend=None)
    with pytest.raises(ValueError, match="exceed max_len 24"):
        gen.generate(prompts_of(CFG, [16])[0], 9)


def test_compiled_prefill_writes_the_same_cache_as_eager(gpt):
    m = KVCacheGPT(gpt)
    prompt = prompts_of(CFG, [8])[0]
    compiled = Generator(gpt, [8]).prefill
    with torch.no_grad(), warnings.catch_warnings():
        # no FallbackWarning (the prefill is one compiled graph), no DowncastWarning (token ids
        # and cache positions are indices: narrowed exactly)
        warnings.simplefilter("error")
        logits, cache = compiled(prompt, m.empty_cache(2))
        ref_logits, ref_cache = m.forward_prefill(prompt, m.empty_cache(2))
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
    assert len(cache) == 2 * CFG.n_layer and cache[0].shape == (2, 2, 24, 16)
    for c, r in zip(cache, ref_cache, strict=True):
        torch.testing.assert_close(c, r, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("target", ["trn2", "trn3"])
@pytest.mark.filterwarnings("ignore:neuron-compile. target trn. without neuronx-cc")
def test_prefill_and_decode_graphs_are_legal_for_trn(gpt, monkeypatch, target):
    """Every graph passes the trn legality rules (a violation raises), and the tokens are the
    cpu target's."""
    from neuron_compile.trainium import legality

    checked = []
    check = legality.check_legality

    def spy(gm, lowered, target_, **kw):
        checked.append(target_.name)
        return check(gm, lowered, target_, **kw)

    monkeypatch.setattr(legality, "check_legality", spy)
    monkeypatch.setenv("NEURON_COMPILE_TARGET", target)
    torch._dynamo.reset()
    out = run([3, 9], 4, [8, 16], CFG, gpt=gpt)
    assert len(out["graphs"]) == 3 and not any(r.fallback_ops for r in out["graphs"])
    assert checked == [target] * 3
    for got, eager in zip(out["compiled"], out["eager"], strict=True):
        assert torch.equal(got, eager)
