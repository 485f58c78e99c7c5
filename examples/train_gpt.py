"""Train a tiny GPT-2-style decoder with ``torch.compile(backend="neuron")``.

Run: ``python examples/train_gpt.py [--steps 300]``. Eager PyTorch and the neuron backend train
identical copies of the model on the same batches; the script prints both loss curves side by side,
checks that they agree, and prints what the backend compiled (``neuron_compile.metrics()``).

Without a Trainium device the compiled graphs run on XLA's CPU client, so the curves match eager to
float32 rounding; any drift would point at a lowering bug.

The data is a learnable synthetic language: each sequence repeats a random "motif" of 8 tokens, so
after the first motif every next token is predictable by attending 8 positions back (an induction
pattern the causal attention has to learn).
"""

from __future__ import annotations

import argparse
import copy
import math
import time
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

import neuron_compile


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 64
    block_size: int = 32
    n_layer: int = 2
    n_head: int = 4
    d_model: int = 64
    tie_weights: bool = True


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        assert cfg.d_model % cfg.n_head == 0
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        # (b, t, d) -> (b, heads, t, head_dim)
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, 4 * cfg.d_model),
            nn.GELU(),
            nn.Linear(4 * cfg.d_model, cfg.d_model),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """Token + position embeddings, pre-LN blocks, final LayerNorm, (tied) LM head.

    ``forward(idx, targets=None)`` returns logits, or the mean cross-entropy loss when ``targets``
    is given (the loss is then part of the compiled graph).
    """

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.block_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_weights:
            self.lm_head.weight = self.tok_emb.weight
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


MOTIF = 8


def loss_floor(cfg: GPTConfig, motif: int = MOTIF) -> float:
    """Best achievable mean loss: the first motif's tokens after the first are unpredictable."""
    return (motif - 1) / cfg.block_size * math.log(cfg.vocab_size)


def make_batches(
    cfg: GPTConfig, n_batches: int, batch: int = 8, motif: int = MOTIF, seed: int = 0
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(inputs, next-token targets)`` pairs of sequences that repeat a random motif."""
    g = torch.Generator().manual_seed(seed)
    reps = math.ceil((cfg.block_size + 1) / motif)
    out = []
    for _ in range(n_batches):
        m = torch.randint(0, cfg.vocab_size, (batch, motif), generator=g)
        seq = m.repeat(1, reps)[:, : cfg.block_size + 1]
        out.append((seq[:, :-1].contiguous(), seq[:, 1:].contiguous()))
    return out


def train(
    model: nn.Module,
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    *,
    backend: str | None,
    lr: float = 3e-3,
) -> list[float]:
    """AdamW steps over ``batches`` (``backend=None``: eager). Returns the per-step losses."""
    step_model = torch.compile(model, backend=backend) if backend else model
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    losses = []
    for idx, targets in batches:
        opt.zero_grad(set_to_none=True)
        loss = step_model(idx, targets)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _print_metrics() -> None:
    records = neuron_compile.metrics()
    print(f"\nneuron_compile.metrics(): {len(records)} graphs")
    print(
        f"  {'graph':<24} {'nodes':>5} {'passes+lower+verify':>20} {'XLA compile':>12} {'calls':>6}"
    )
    for r in records:
        print(
            f"  {r.name:<24} {r.node_count:>5} {1e3 * r.our_compile_s:>17.1f} ms "
            f"{1e3 * r.executor_compile_s:>9.1f} ms {r.calls:>6}"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=25, help="print every N steps")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    cfg = GPTConfig()
    model = TinyGPT(cfg)
    batches = make_batches(cfg, args.steps)
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"TinyGPT: {cfg.n_layer} layers, {cfg.n_head} heads, d={cfg.d_model}, "
        f"vocab={cfg.vocab_size}, block={cfg.block_size}, {n_params / 1e3:.1f}k parameters; "
        f"{args.steps} AdamW steps, batch {batches[0][0].shape[0]}"
    )

    t0 = time.perf_counter()
    eager = train(copy.deepcopy(model), batches, backend=None)
    t1 = time.perf_counter()
    compiled = train(copy.deepcopy(model), batches, backend="neuron")
    t2 = time.perf_counter()

    print(f"\n{'step':>5}  {'eager':>9}  {'neuron':>9}  {'rel diff':>9}")
    shown = sorted({*range(0, args.steps, args.every), args.steps - 1})
    for i in shown:
        rel = abs(eager[i] - compiled[i]) / abs(eager[i])
        print(f"{i:>5}  {eager[i]:>9.5f}  {compiled[i]:>9.5f}  {rel:>9.1e}")
    print(f"(best possible loss: {loss_floor(cfg):.3f}; the first motif in each row is random)")
    compile_s = sum(r.our_compile_s + r.executor_compile_s for r in neuron_compile.metrics())
    print(
        f"\nwall time: eager {t1 - t0:.2f} s, neuron {t2 - t1:.2f} s "
        f"(of which {compile_s:.2f} s compiling)"
    )
    _print_metrics()

    # Float32 rounding differences compound over hundreds of AdamW steps; 1e-3 relative at the
    # end is far below what a wrong lowering would produce.
    final_rel = abs(eager[-1] - compiled[-1]) / abs(eager[-1])
    assert final_rel < 1e-3, f"final losses differ: eager {eager[-1]}, neuron {compiled[-1]}"
    torch.testing.assert_close(torch.tensor(compiled), torch.tensor(eager), rtol=1e-3, atol=1e-4)
    assert eager[-1] < 0.5 * eager[0], "the model did not learn the repeating pattern"
    print("\nOK: eager and neuron loss curves agree")


if __name__ == "__main__":
    main()
