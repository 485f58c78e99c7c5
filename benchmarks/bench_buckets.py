"""Bucket planner on a real length distribution: the token counts of Python's standard library.

Run: ``python benchmarks/bench_buckets.py [--ks 4 8 16] [--plot waste.png] [--json out.json]``.

* Lengths: one per ``.py`` file under ``sysconfig.get_paths()["stdlib"]`` (``site-packages``
  excluded), counted with ``tokenize`` (all tokens except ENCODING/ENDMARKER; empty files and the
  few files that do not tokenize are skipped). Nobody here wrote them; they ship with Python.
  ``--context N`` additionally splits files into chunks of at most N tokens, as LM data
  pipelines do.
* For each K: padding waste of the planner (exact DP, linear cost) vs powers of two vs multiples
  of 128, all with at most K buckets.
* Total cost = compiles × compile seconds + padded tokens × per-token step seconds, both
  measured in this run on examples/train_gpt.py's TinyGPT trained with ``backend="neuron"``
  (medians over several sequence lengths; compile = first step minus a steady step). The last
  rows also let the planner pick K itself, weighing one compile as ``compile_s / token_s``
  padded tokens.

The script checks that the planner's plan is the DP optimum and strictly better than powers of
two at every K.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import sysconfig
import time
import tokenize
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from train_gpt import GPTConfig, TinyGPT  # noqa: E402

import neuron_compile  # noqa: E402
from neuron_compile.bucket_planner import (  # noqa: E402
    BucketPlan,
    compare_plans,
    evaluate_buckets,
    plan_buckets,
)


def stdlib_token_counts() -> tuple[list[int], str]:
    """Token count of every tokenizable, non-empty ``.py`` file of the standard library."""
    root = Path(sysconfig.get_paths()["stdlib"])
    counts = []
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        try:
            with open(path, "rb") as f:
                skip = (tokenize.ENCODING, tokenize.ENDMARKER)
                n = sum(1 for tok in tokenize.tokenize(f.readline) if tok.type not in skip)
        except (tokenize.TokenError, SyntaxError, UnicodeDecodeError):
            continue
        if n:
            counts.append(n)
    return counts, str(root)


def chunk(lengths: list[int], context: int) -> list[int]:
    """Split each length into pieces of at most ``context``."""
    out = []
    for n in lengths:
        full, rest = divmod(n, context)
        out.extend([context] * full + ([rest] if rest else []))
    return out


def measure_tinygpt(
    lengths: tuple[int, ...] = (64, 128, 192, 256), batch: int = 4, reps: int = 5
) -> tuple[float, float]:
    """Median compile seconds (per new shape) and per-token train-step seconds, backend=neuron."""
    torch.manual_seed(0)
    cfg = GPTConfig(block_size=max(lengths))
    model = TinyGPT(cfg)
    step_model = torch.compile(model, backend="neuron", dynamic=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(idx: torch.Tensor) -> float:
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        step_model(idx, idx).backward()
        opt.step()
        return time.perf_counter() - t0

    # Pay one-time process costs (jax import, XLA client) before timing anything.
    warm = torch.compile(lambda x: x * 2, backend="neuron")
    warm(torch.ones(2))
    compile_s, token_s = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", neuron_compile.RecompileWarning)
        for n in lengths:
            idx = torch.randint(0, cfg.vocab_size, (batch, n))
            first = step(idx)
            steady = statistics.median(step(idx) for _ in range(reps))
            compile_s.append(first - steady)
            token_s.append(steady / (batch * n))
    return statistics.median(compile_s), statistics.median(token_s)


def _row(k: object, plan: BucketPlan, compile_s: float, token_s: float) -> dict:
    total = plan.used * compile_s + plan.padded_tokens * token_s
    return {
        "K": k,
        "strategy": plan.name,
        "compiles": plan.used,
        "padded_tokens": plan.padded_tokens,
        "waste": plan.waste,
        "compile_cost_s": plan.used * compile_s,
        "step_cost_s": plan.padded_tokens * token_s,
        "total_s": total,
        "boundaries": plan.boundaries,
    }


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ks", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--context", type=int, default=0, help="chunk files to this many tokens")
    parser.add_argument("--plot", help="write waste vs K to this PNG (needs matplotlib)")
    parser.add_argument("--json", help="write the rows to this file")
    parser.add_argument(
        "--compile-s",
        type=float,
        help="use this compile time per shape instead of the measured one (e.g. 300 for a "
        "multi-minute neuronx-cc compile); the per-token time is still measured",
    )
    args = parser.parse_args(argv)

    t0 = time.perf_counter()
    lengths, root = stdlib_token_counts()
    if args.context:
        lengths = chunk(lengths, args.context)
    print(
        f"{len(lengths)} sequences (token counts of {root}/**/*.py"
        f"{f', chunked to {args.context}' if args.context else ''}): "
        f"median {statistics.median(lengths):.0f}, max {max(lengths)}, "
        f"{len(set(lengths))} distinct; {sum(lengths):,} real tokens "
        f"[{time.perf_counter() - t0:.1f} s to tokenize]"
    )
    compile_s, token_s = measure_tinygpt()
    print(
        f"TinyGPT on backend=neuron (XLA CPU): compile {compile_s:.2f} s per new shape, "
        f"{1e6 * token_s:.2f} µs per token per train step (medians)"
    )
    if args.compile_s is not None:
        compile_s = args.compile_s
        print(f"costing compiles at --compile-s {compile_s:.1f} s instead")
    print()

    rows = []
    header = (
        f"{'K':>4}  {'strategy':<17} {'compiles':>8} {'padded tokens':>14} {'waste %':>8} "
        f"{'compile s':>10} {'step s':>10} {'total s':>10}"
    )
    print(header)
    for k in args.ks:
        t1 = time.perf_counter()
        plans = compare_plans(lengths, k, align=1, step=128)
        planner = plans["planner"]
        assert planner.cost == planner.meta["dp_cost"], "plan is not the DP optimum"
        assert planner.padded_tokens < plans["powers of two"].padded_tokens, (
            "planner is not strictly better than powers of two"
        )
        aligned = plan_buckets(lengths, k, align=128)
        aligned = evaluate_buckets(lengths, aligned.boundaries, name="planner, align 128")
        plan_s = time.perf_counter() - t1
        for plan in (*plans.values(), aligned):
            row = _row(k, plan, compile_s, token_s)
            rows.append(row)
            print(
                f"{k:>4}  {plan.name:<17} {row['compiles']:>8} {row['padded_tokens']:>14,} "
                f"{100 * row['waste']:>8.2f} {row['compile_cost_s']:>10.1f} "
                f"{row['step_cost_s']:>10.1f} {row['total_s']:>10.1f}"
            )
        print(f"      (planned K={k} in {plan_s:.2f} s)")
    best = plan_buckets(lengths, None, compile_cost=compile_s / token_s)
    row = _row("opt", best, compile_s, token_s)
    rows.append({**row, "strategy": "planner, free K"})
    print(
        f"{'opt':>4}  {'planner, free K':<17} {row['compiles']:>8} {row['padded_tokens']:>14,} "
        f"{100 * row['waste']:>8.2f} {row['compile_cost_s']:>10.1f} {row['step_cost_s']:>10.1f} "
        f"{row['total_s']:>10.1f}"
    )
    print(
        "\nplanner boundaries: "
        + "; ".join(f"K={r['K']}: {r['boundaries']}" for r in rows if r["strategy"] == "planner")
    )

    if args.plot:
        _plot(args.plot, lengths, max(args.ks))
        print(f"wrote {args.plot}")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"compile_s": compile_s, "token_s": token_s, "n": len(lengths), "rows": rows},
                indent=2,
            )
        )
    return rows


def _plot(path: str, lengths: list[int], k_max: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    ks = list(range(1, k_max + 1))
    series: dict[str, list[float]] = {}
    for k in ks:
        for name, plan in compare_plans(lengths, k, step=128).items():
            series.setdefault(name, []).append(100 * plan.waste)
        aligned = plan_buckets(lengths, k, align=128)
        series.setdefault("planner, align 128", []).append(100 * aligned.waste)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for (name, ys), marker in zip(series.items(), "os^d", strict=True):
        ax.plot(ks, ys, marker=marker, label=name)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("buckets (K)")
    ax.set_ylabel("padding waste (% of padded tokens)")
    ax.set_title(f"token counts of {len(lengths)} stdlib .py files")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
