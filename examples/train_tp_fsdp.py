"""Train a Llama-style model on a 2 x 2 mesh (SimpleFSDP over "dp" x tensor parallel over "tp").

Run on CPU: ``torchrun --nproc-per-node 4 examples/train_tp_fsdp.py [--steps 3] [--target cpu]``.

Every rank trains the same seeded steps twice: compiled with ``torch.compile(backend="neuron")``
and eagerly, and asserts the losses and parameters match. Tensor parallel is DTensor's
``parallelize_module`` (Colwise/Rowwise/SequenceParallel, as torchtitan plans Llama); FSDP is
``simple_fsdp`` (examples/simple_fsdp.py). Both put their collectives inside the graphs: FSDP's
parameter all-gathers and gradient reduce-scatters over "dp", TP's activation all-gathers and
reduce-scatters over "tp". Rank 0 prints a summary: losses, the largest difference, graphs
compiled, and which collectives ran inside the compiled graphs vs. eagerly between them
(``neuron_compile.metrics()``).

``--target trn2`` compiles for trn2 (legality, NEFF) and, without a Trainium device, runs each graph
through its CPU stand-in. ``NEURON_COMPILE_*`` variables apply as usual (e.g. ``_DUMP_DIR``).
"""

from __future__ import annotations

import argparse
import os
from collections import Counter

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from simple_fsdp import simple_fsdp
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

import neuron_compile

VOCAB, DIM, HEADS, HIDDEN, LAYERS, SEQ, BATCH = 64, 32, 4, 64, 2, 8, 2


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head_dim = DIM // HEADS
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        # view(..., -1, head_dim): under TP each rank holds HEADS / tp heads (wq is column-sharded)
        q, k, v = (
            w(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
            for w in (self.wq, self.wk, self.wv)
        )
        scores = q @ k.transpose(-2, -1) / self.head_dim**0.5
        causal = torch.ones(seq, seq, dtype=torch.bool).triu(1)
        out = scores.masked_fill(causal, float("-inf")).softmax(-1) @ v
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


class FeedForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1, self.w3 = nn.Linear(DIM, HIDDEN, bias=False), nn.Linear(DIM, HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))  # SwiGLU


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention_norm, self.attention = RMSNorm(DIM), Attention()
        self.ffn_norm, self.feed_forward = RMSNorm(DIM), FeedForward()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm, self.output = RMSNorm(DIM), nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x))


def tensor_parallel(model: Llama, tp_mesh: DeviceMesh) -> Llama:
    """Megatron-style TP with sequence parallel norms (torchtitan's Llama plan)."""
    parallelize_module(
        model,
        tp_mesh,
        {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "norm": SequenceParallel(),
            "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
        },
    )
    for block in model.layers:
        seq_to_replicate = PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
        )
        parallelize_module(
            block,
            tp_mesh,
            {
                "attention_norm": SequenceParallel(),
                "attention": seq_to_replicate,
                "attention.wq": ColwiseParallel(),
                "attention.wk": ColwiseParallel(),
                "attention.wv": ColwiseParallel(),
                "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
                "ffn_norm": SequenceParallel(),
                "feed_forward": seq_to_replicate,
                "feed_forward.w1": ColwiseParallel(),
                "feed_forward.w3": ColwiseParallel(),
                "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
            },
        )
    return model


def batches(steps: int, dp_rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Next-token batches, one stream per dp rank (the tp ranks of a dp group share it)."""
    g = torch.Generator().manual_seed(1000 + dp_rank)
    data = [torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g) for _ in range(steps)]
    return [(d[:, :-1], d[:, 1:]) for d in data]


def train(model: nn.Module, data: list, forward: nn.Module, dp_size: int) -> list[float]:
    """SGD steps; returns the losses. ``forward`` is ``model`` or its compiled form."""
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for tokens, labels in data:
        opt.zero_grad()
        # simple_fsdp's reduce-scatter sums over dp: the loss is divided for a mean gradient
        loss = F.cross_entropy(forward(tokens).flatten(0, 1), labels.flatten()) / dp_size
        loss.backward()
        opt.step()
        losses.append(loss.item() * dp_size)
    return losses


def local_params(model: nn.Module) -> list[torch.Tensor]:
    return [p.to_local() if hasattr(p, "to_local") else p.detach() for p in model.parameters()]


def build(mesh: DeviceMesh) -> Llama:
    torch.manual_seed(0)  # the same initial model on every rank, and for both runs
    return simple_fsdp(tensor_parallel(Llama(), mesh["tp"]), mesh["dp"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--target", default=os.environ.get("NEURON_COMPILE_TARGET", "cpu"))
    args = parser.parse_args()

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2, dist.get_world_size() // 2), mesh_dim_names=("dp", "tp"))
    compiled_model, eager_model = (build(mesh) for _ in range(2))
    data = batches(args.steps, mesh["dp"].get_local_rank())

    neuron_compile.reset_metrics()
    forward = torch.compile(compiled_model, backend="neuron", options={"target": args.target})
    compiled = train(compiled_model, data, forward, mesh["dp"].size())
    eager = train(eager_model, data, eager_model, mesh["dp"].size())

    diff = max(
        (a - b).abs().max().item()
        for a, b in zip(local_params(compiled_model), local_params(eager_model), strict=True)
    )
    records = neuron_compile.metrics()
    if dist.get_rank() == 0:
        print(f"losses   eager    {[round(x, 5) for x in eager]}")
        print(f"losses   compiled {[round(x, 5) for x in compiled]}")
        print(f"max |param diff| {diff:.2e}; {len(records)} graphs compiled for {args.target}")
        inside = sum((Counter(r.collectives) for r in records), Counter())
        print(f"collectives inside graphs: {dict(inside) or 'none'}")
        eagerly = sum((Counter(r.fallback_ops) for r in records), Counter())
        print(f"ops run eagerly between graphs: {dict(eagerly) or 'none'}")
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)
    assert diff < 1e-5, f"parameters differ by {diff}"
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
