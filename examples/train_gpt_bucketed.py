"""Train TinyGPT on variable-length sequences with planner-chosen buckets: one compile per bucket.

Run: ``python examples/train_gpt_bucketed.py [--samples 240] [--buckets 4]``.

1. Scan the dataset's lengths and let ``plan_buckets`` pick at most ``--buckets`` boundaries
   (multiples of 8) minimizing padded tokens; print the plan against powers of two.
2. ``bucket_batches`` groups samples of the same bucket into batches; ``bucketed_collate`` pads
   each batch's sequence dim to its bucket (labels with -100) and the batch dim to the batch size
   (so a short last batch of a bucket is not a new shape).
3. ``torch.compile(model, backend="neuron", dynamic=False)`` trains on the padded batches while an
   eager copy trains on the *unpadded* sequences (loss = summed token CE / real tokens).

Checks: the compiled model compiled exactly one forward and one backward graph per bucket used
(``neuron_compile.metrics()``), no recompile beyond those (``max_recompiles``), and its losses
match eager's on the unpadded data.
"""

from __future__ import annotations

import argparse
import copy
import math
import time
from collections import Counter

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from train_gpt import MOTIF, GPTConfig, TinyGPT

import neuron_compile
from neuron_compile.bucket_planner import compare_plans, length_histogram, plan_buckets
from neuron_compile.bucketing import bucket_batches, bucketed_collate


def make_dataset(cfg: GPTConfig, n: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``(inputs, next tokens)`` of motif-repeating sequences with random lengths: a mix of
    short (around 14) and long (around 44) sequences, like prompts and documents."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        center = 14.0 if torch.rand(1, generator=g).item() < 0.6 else 44.0
        length = int(center + 5 * torch.randn(1, generator=g).item())
        length = max(2, min(cfg.block_size, length))
        motif = torch.randint(0, cfg.vocab_size, (MOTIF,), generator=g)
        seq = motif.repeat(math.ceil((length + 1) / MOTIF))[: length + 1]
        out.append((seq[:-1].clone(), seq[1:].clone()))
    return out


def unpadded_loss(
    model: torch.nn.Module, samples: list[tuple[torch.Tensor, torch.Tensor]]
) -> torch.Tensor:
    """Mean next-token CE over the real tokens of ``samples``, each run at its own length."""
    total = sum(F.cross_entropy(model(x[None])[0], y, reduction="sum") for x, y in samples)
    return total / sum(len(x) for x, _ in samples)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=240)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--buckets", type=int, default=4, help="bucket budget K")
    args = parser.parse_args(argv)
    neuron_compile.reset_metrics()

    torch.manual_seed(0)
    cfg = GPTConfig(block_size=64)
    data = make_dataset(cfg, args.samples)
    hist = length_histogram(data)  # scans the dataset: len(sample[0])
    plan = plan_buckets(hist, args.buckets, align=8)
    print(f"{len(data)} sequences, lengths {min(hist)}..{max(hist)}; planner buckets:")
    for b in plan.buckets:
        print(f"  {b.size:>4}: {b.count:>4} sequences, waste {100 * b.waste:5.1f} %")
    for name, p in compare_plans(hist, args.buckets, align=8).items():
        print(f"  {name:<16} {p.boundaries}  waste {100 * p.waste:5.1f} %")

    batches = bucket_batches([len(x) for x, _ in data], plan.boundaries, args.batch, seed=1)
    loader = DataLoader(data, batch_sampler=batches, collate_fn=lambda samples: samples)
    collate = bucketed_collate(plan.boundaries, batch_buckets=[args.batch])

    model = TinyGPT(cfg)
    eager, neuron = copy.deepcopy(model), copy.deepcopy(model)
    compiled = torch.compile(
        neuron, backend="neuron", dynamic=False, options={"max_recompiles": args.buckets - 1}
    )
    opt_e = torch.optim.AdamW(eager.parameters(), lr=3e-3)
    opt_n = torch.optim.AdamW(neuron.parameters(), lr=3e-3)
    losses_e, losses_n, used = [], [], Counter()
    t0 = time.perf_counter()
    for samples in loader:
        idx, targets = collate(samples)
        used[idx.shape[1]] += 1
        for opt, run, losses in (
            (opt_e, lambda s=samples: unpadded_loss(eager, s), losses_e),
            (opt_n, lambda i=idx, t=targets: compiled(i, t), losses_n),
        ):
            opt.zero_grad(set_to_none=True)
            loss = run()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    elapsed = time.perf_counter() - t0

    records = neuron_compile.metrics()
    forward = [r for r in records if r.kind == "forward"]
    backward = [r for r in records if r.kind == "backward"]
    print(f"\n{'step':>5} {'eager (unpadded)':>17} {'neuron (bucketed)':>18}")
    for i in sorted({*range(0, len(losses_e), 8), len(losses_e) - 1}):
        print(f"{i:>5} {losses_e[i]:>17.5f} {losses_n[i]:>18.5f}")
    print(
        f"\nbatches per bucket: {dict(sorted(used.items()))}; compiled graphs: "
        f"{len(forward)} forward + {len(backward)} backward; "
        f"recompiles: {len(neuron_compile.recompiles())}; {elapsed:.1f} s"
    )
    assert len(forward) == len(backward) == len(used), (len(forward), len(backward), used)
    assert sum(r.recompile for r in forward) == len(used) - 1
    torch.testing.assert_close(losses_n[0], losses_e[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.tensor(losses_n), torch.tensor(losses_e), rtol=1e-3, atol=1e-4)
    print("OK: one compile per bucket; bucketed losses match eager on the unpadded data")
    return {"buckets_used": sorted(used), "forward_graphs": len(forward), "losses": losses_n}


if __name__ == "__main__":
    main()
