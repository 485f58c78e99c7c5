"""Greedy generation with a static KV cache: one compiled prefill graph per prompt bucket, one
compiled decode graph for every generated token.

Run: ``python examples/generate_kv_cache.py [--new-tokens 12] [--prompts 3,5,9,14]``.

The decoder reuses ``TinyGPT``'s weights (``examples/train_gpt.py``), trained for a few eager steps
on the repeating-motif data so its greedy choices are clear-cut. Every shape is static:

- the cache is preallocated: per layer a key and a value tensor ``(batch, heads, max_len,
  head_dim)`` with ``max_len = block_size``;
- **prefill** runs the prompt padded at the end to its bucket (``pad_to_bucket``); it writes the
  bucket's keys/values into cache rows ``0..bucket-1`` and returns every position's logits (the
  caller reads the last real one). Rows past the real prompt hold padding's keys, but decode
  overwrites row ``pos`` before attending to it and masks rows ``> pos``, so they are never seen;
- **decode** takes one token, its position ``pos`` as a 1-element int64 tensor, and the cache; it
  writes the new key/value at row ``pos`` with ``index_copy`` and attends to rows ``<= pos``. The
  position is data, not a shape, so the decode graph is compiled once.

Checks: the compiled run produces the same tokens (and logits to float32 rounding) as the same code
run eagerly, and the same tokens as a no-cache reference that recomputes full causal attention over
the whole sequence each step (``TinyGPT.forward``); ``neuron_compile.metrics()`` shows one
inference graph per prompt bucket used plus one decode graph.
"""

from __future__ import annotations

import argparse
import math
import time
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F
from train_gpt import GPTConfig, TinyGPT, make_batches

import neuron_compile
from neuron_compile.bucketing import bucket_size, pad_to_bucket

Cache = tuple[torch.Tensor, ...]  # (k_0, v_0, k_1, v_1, ...), each (b, heads, max_len, head_dim)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Softmax attention of ``q`` (b, h, tq, hd) over ``k``/``v`` (b, h, tk, hd); ``keep`` is a
    bool (tq, tk) mask of the keys each query may see."""
    scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(q.shape[-1]))
    scores = scores.masked_fill(~keep, float("-inf"))
    return F.softmax(scores, dim=-1) @ v


class KVCacheGPT(nn.Module):
    """``TinyGPT``'s weights run with a preallocated KV cache (shared parameters, not a copy)."""

    def __init__(self, gpt: TinyGPT) -> None:
        super().__init__()
        self.gpt = gpt
        self.cfg = gpt.cfg
        self.head_dim = gpt.cfg.d_model // gpt.cfg.n_head

    def empty_cache(self, batch: int) -> Cache:
        c = self.cfg
        shape = (batch, c.n_head, c.block_size, self.head_dim)
        return tuple(torch.zeros(shape) for _ in range(2 * c.n_layer))

    def _qkv(self, block: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        b, t, d = x.shape
        q, k, v = block.attn.qkv(block.ln1(x)).split(d, dim=2)
        return tuple(
            z.view(b, t, self.cfg.n_head, self.head_dim).transpose(1, 2) for z in (q, k, v)
        )

    def _finish(self, block: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        b, _, t, _ = y.shape
        x = x + block.attn.proj(y.transpose(1, 2).reshape(b, t, self.cfg.d_model))
        return x + block.mlp(block.ln2(x))

    def forward_prefill(self, idx: torch.Tensor, cache: Cache) -> tuple[torch.Tensor, Cache]:
        """``idx`` (b, bucket): logits (b, bucket, vocab) and the cache with rows ``0..bucket-1``
        written. Causal attention within the prompt, so end padding does not affect real rows."""
        t, max_len = idx.shape[1], self.cfg.block_size
        pos = torch.arange(t, device=idx.device)
        x = self.gpt.tok_emb(idx) + self.gpt.pos_emb(pos)
        causal = pos[:, None] >= pos[None, :]
        new_cache = []
        for i, block in enumerate(self.gpt.blocks):
            q, k, v = self._qkv(block, x)
            x = self._finish(block, x, _attend(q, k, v, causal))
            for kv, old in ((k, cache[2 * i]), (v, cache[2 * i + 1])):
                new_cache.append(torch.cat([kv, old[:, :, t:max_len]], dim=2))
        return self.gpt.lm_head(self.gpt.ln_f(x)), tuple(new_cache)

    def forward_decode(
        self, token: torch.Tensor, pos: torch.Tensor, cache: Cache
    ) -> tuple[torch.Tensor, Cache]:
        """``token`` (b, 1) at position ``pos`` (1-element int64): logits (b, vocab) and the cache
        with row ``pos`` written. Same shapes for every position: one compiled graph."""
        x = self.gpt.tok_emb(token) + self.gpt.pos_emb(pos)
        keep = (torch.arange(self.cfg.block_size, device=token.device) <= pos)[None, :]
        new_cache = []
        for i, block in enumerate(self.gpt.blocks):
            q, k, v = self._qkv(block, x)
            k_all = cache[2 * i].index_copy(2, pos, k)
            v_all = cache[2 * i + 1].index_copy(2, pos, v)
            x = self._finish(block, x, _attend(q, k_all, v_all, keep))
            new_cache += [k_all, v_all]
        return self.gpt.lm_head(self.gpt.ln_f(x))[:, -1], tuple(new_cache)


class _Prefill(nn.Module):
    def __init__(self, m: KVCacheGPT) -> None:
        super().__init__()
        self.m = m

    def forward(self, idx: torch.Tensor, cache: Cache) -> tuple[torch.Tensor, Cache]:
        return self.m.forward_prefill(idx, cache)


class _Decode(nn.Module):
    def __init__(self, m: KVCacheGPT) -> None:
        super().__init__()
        self.m = m

    def forward(
        self, token: torch.Tensor, pos: torch.Tensor, cache: Cache
    ) -> tuple[torch.Tensor, Cache]:
        return self.m.forward_decode(token, pos, cache)


class Generator:
    """Greedy decoding with a static cache; ``backend=None`` runs the same code eagerly."""

    def __init__(self, gpt: TinyGPT, buckets: list[int], backend: str | None = "neuron") -> None:
        m = KVCacheGPT(gpt)
        self.model, self.buckets = m, buckets
        self.prefill: nn.Module = _Prefill(m)
        self.decode: nn.Module = _Decode(m)
        if backend is not None:
            self.prefill = torch.compile(self.prefill, backend=backend, dynamic=False)
            self.decode = torch.compile(self.decode, backend=backend, dynamic=False)

    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, new_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``prompt`` (b, n): the ``new_tokens`` greedy tokens (b, new_tokens) and the logits
        (new_tokens, b, vocab) they were chosen from."""
        n = prompt.shape[1]
        if n + new_tokens > self.model.cfg.block_size:
            raise ValueError(
                f"{n} + {new_tokens} tokens exceed max_len {self.model.cfg.block_size}"
            )
        padded, _ = pad_to_bucket(prompt, 1, self.buckets)
        logits, cache = self.prefill(padded, self.model.empty_cache(prompt.shape[0]))
        step_logits = [logits[:, n - 1]]
        tokens = [step_logits[-1].argmax(-1, keepdim=True)]
        for p in range(n, n + new_tokens - 1):
            logits, cache = self.decode(tokens[-1], torch.tensor([p]), cache)
            step_logits.append(logits)
            tokens.append(logits.argmax(-1, keepdim=True))
        return torch.cat(tokens, dim=1), torch.stack(step_logits)


@torch.no_grad()
def generate_no_cache(gpt: TinyGPT, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Reference: rerun ``TinyGPT.forward`` (full causal attention) on the whole sequence."""
    seq = prompt
    for _ in range(new_tokens):
        seq = torch.cat([seq, gpt(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return seq[:, prompt.shape[1] :]


def trained_gpt(cfg: GPTConfig, steps: int = 60, seed: int = 0) -> TinyGPT:
    """A TinyGPT after a few eager AdamW steps on the motif data (clear-cut greedy choices).

    Runs on one thread: for a model this small that is faster, and much faster on a busy machine
    where OpenMP threads would wait for each other."""
    torch.manual_seed(seed)
    gpt = TinyGPT(cfg)
    opt = torch.optim.AdamW(gpt.parameters(), lr=3e-3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for idx, targets in make_batches(cfg, steps, seed=seed):
            opt.zero_grad(set_to_none=True)
            gpt(idx, targets).backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    return gpt.eval()


def prompts_of(cfg: GPTConfig, lengths: list[int], batch: int = 2, seed: int = 1) -> list:
    """One ``(batch, n)`` prompt per length: the start of a motif-repeating sequence."""
    data = make_batches(cfg, len(lengths), batch=batch, seed=seed)
    return [idx[:, :n] for (idx, _), n in zip(data, lengths, strict=True)]


def run(
    lengths: list[int],
    new_tokens: int,
    buckets: list[int],
    cfg: GPTConfig,
    train_steps: int = 150,
    gpt: TinyGPT | None = None,
) -> dict:
    """Generate from one prompt per length, compiled and eager; return tokens, logits, graphs."""
    gpt = gpt if gpt is not None else trained_gpt(cfg, train_steps)
    prompts = prompts_of(cfg, lengths)
    neuron_compile.reset_metrics()
    compiled, eager = Generator(gpt, buckets), Generator(gpt, buckets, backend=None)
    out = {"compiled": [], "eager": [], "no_cache": [], "compiled_logits": [], "eager_logits": []}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", neuron_compile.RecompileWarning)  # a new prompt bucket
        for prompt in prompts:
            tokens, logits = compiled.generate(prompt, new_tokens)
            out["compiled"].append(tokens)
            out["compiled_logits"].append(logits)
    for prompt in prompts:
        tokens, logits = eager.generate(prompt, new_tokens)
        out["eager"].append(tokens)
        out["eager_logits"].append(logits)
        out["no_cache"].append(generate_no_cache(gpt, prompt, new_tokens))
    records = [r for r in neuron_compile.metrics() if r.kind == "inference"]
    out["prefill_graphs"] = [r for r in records if "Prefill" in r.name]
    out["decode_graphs"] = [r for r in records if "Decode" in r.name]
    out["graphs"] = records
    out["buckets_used"] = sorted({bucket_size(n, buckets) for n in lengths})
    out["prompts"] = prompts
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", default="3,5,9,14", help="prompt lengths")
    parser.add_argument("--new-tokens", type=int, default=12)
    parser.add_argument("--buckets", default="8,16")
    args = parser.parse_args(argv)
    lengths = [int(s) for s in args.prompts.split(",")]
    buckets = [int(s) for s in args.buckets.split(",")]
    t0 = time.perf_counter()
    out = run(lengths, args.new_tokens, buckets, GPTConfig())
    for n, prompt, toks in zip(lengths, out["prompts"], out["compiled"], strict=True):
        print(f"prompt ({n:>2} tokens, bucket {bucket_size(n, buckets):>2}): {prompt[0].tolist()}")
        print(f"  generated: {toks[0].tolist()}")
    for r in out["graphs"]:
        fallback = ", ".join(r.fallback_ops) or "none"
        print(
            f"  graph {r.name:<24} {r.node_count:>4} nodes {r.calls:>4} calls, "
            f"CPU fallback: {fallback}"
        )
    print(f"{time.perf_counter() - t0:.1f} s")
    for got, eager, ref in zip(out["compiled"], out["eager"], out["no_cache"], strict=True):
        assert torch.equal(got, eager), (got, eager)
        assert torch.equal(got, ref), (got, ref)
    for got, eager in zip(out["compiled_logits"], out["eager_logits"], strict=True):
        torch.testing.assert_close(got, eager, rtol=1e-4, atol=1e-4)
    assert len(out["prefill_graphs"]) == len(out["buckets_used"]), out["graphs"]
    assert len(out["decode_graphs"]) == 1, out["graphs"]
    calls = sum(r.calls for r in out["decode_graphs"])
    assert calls == len(lengths) * (args.new_tokens - 1), calls
    print(
        f"OK: {len(out['prefill_graphs'])} prefill graphs (buckets {out['buckets_used']}), "
        f"1 decode graph run {calls} times; tokens equal eager and the no-cache reference"
    )
    return out


if __name__ == "__main__":
    main()
