"""What the graph passes buy on trn2, by the roofline cost model, and what they cost in compile time.

Run: ``python benchmarks/bench_passes.py [--repeats 5] [--markdown]``. For each model, the forward
and backward ATen graphs are captured once with AOTAutograd and the backend's trn2 decomposition
table (no Dynamo, nothing executed on a device), then each graph is, on a fresh deep copy:

* lowered to StableHLO without any pass ("before");
* run through ``neuron_compile.passes.pipeline_for("trn2")`` and lowered with ``neuron_calls``
  (the module neuronx-cc would receive, "after").

Reported per graph: StableHLO op count before/after (``ModuleCost.op_count``: every op of
``@main`` except ``return``), the estimated trn2 device time of one call before/after
(``cost_model.estimate_module``, one LNC=1 core; a first-order roofline that ranks rewrites, it
does not predict wall time), and medians over ``--repeats`` of: the passes, lowering the passed
graph, our whole lowering work (lower + verify + serialize) without and with the passes, and the
compile time the passes add as a fraction of our lowering work without them (a smaller graph
lowers, verifies and serializes faster, which pays part of the passes back).

Models: examples/train_gpt.py's TinyGPT and examples/conv_net.py's ConvNet, plus small versions of
public architectures defined below (no torchvision/transformers needed).
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._functorch.aot_autograd import aot_function, make_boxed_func
from torch._functorch.partitioners import default_partition
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from conv_net import ConvNet  # noqa: E402
from train_gpt import GPTConfig, TinyGPT  # noqa: E402

from neuron_compile import artifact  # noqa: E402
from neuron_compile.capture import decomposition_table  # noqa: E402
from neuron_compile.lowering import lower_graph  # noqa: E402
from neuron_compile.passes import pipeline_for, run_pipeline  # noqa: E402
from neuron_compile.targets import get_target  # noqa: E402
from neuron_compile.trainium.cost_model import estimate_module  # noqa: E402

TARGET = "trn2"


# ---- public architectures, small --------------------------------------------------------------
class RMSNorm(nn.Module):
    """Zhang & Sennrich 2019; as in meta-llama/llama ``model.py``."""

    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class LlamaBlock(nn.Module):
    """A Llama-2 decoder block (Touvron et al. 2023, arXiv:2307.09288; follows meta-llama/llama
    ``model.py`` / HF ``modeling_llama.py``): pre-RMSNorm, RoPE (Su et al. 2021) in the
    rotate-half form, causal SDPA, SwiGLU MLP (Shazeer 2020)."""

    def __init__(self, d: int = 64, heads: int = 4, hidden: int = 176, seq: int = 32) -> None:
        super().__init__()
        self.heads = heads
        self.attn_norm, self.mlp_norm = RMSNorm(d), RMSNorm(d)
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.w1 = nn.Linear(d, hidden, bias=False)
        self.w3 = nn.Linear(d, hidden, bias=False)
        self.w2 = nn.Linear(hidden, d, bias=False)
        hd = d // heads
        inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
        freqs = torch.outer(torch.arange(seq).float(), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.attn_norm(x)
        q, k, v = (
            w(h).view(b, t, self.heads, -1).transpose(1, 2) for w in (self.wq, self.wk, self.wv)
        )
        cos, sin = self.cos[:t], self.sin[:t]
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(y.transpose(1, 2).reshape(b, t, d))
        h = self.mlp_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class BertLayer(nn.Module):
    """A BERT encoder layer (Devlin et al. 2019, arXiv:1810.04805; follows HF
    ``modeling_bert.py`` ``BertLayer``): bidirectional attention, post-LayerNorm residuals,
    exact (erf) GELU. BERT-base is d=768/12 heads/3072; here d=64/4/256."""

    def __init__(self, d: int = 64, heads: int = 4, ff: int = 256) -> None:
        super().__init__()
        self.heads = heads
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ln1, self.ln2 = nn.LayerNorm(d, eps=1e-12), nn.LayerNorm(d, eps=1e-12)
        self.inter, self.output = nn.Linear(d, ff), nn.Linear(ff, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // self.heads)
        y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d)
        x = self.ln1(x + self.out(y))
        return self.ln2(x + self.output(F.gelu(self.inter(x))))


def new_gelu(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's tanh GELU, written out as in openai/gpt-2 ``model.py`` and nanoGPT ``NewGELU``."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3.0))))


class GPT2Block(nn.Module):
    """A GPT-2 block (Radford et al. 2019; follows nanoGPT ``model.py`` without flash attention):
    pre-LayerNorm, fused c_attn projection, explicit causal mask + softmax, NewGELU MLP."""

    def __init__(self, d: int = 64, heads: int = 4, seq: int = 32) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.c_fc, self.mlp_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.register_buffer("mask", torch.tril(torch.ones(seq, seq)).view(1, 1, seq, seq))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.mask[:, :, :t, :t] == 0, float("-inf")).softmax(-1)
        x = x + self.c_proj((att @ v).transpose(1, 2).contiguous().view(b, t, d))
        return x + self.mlp_proj(new_gelu(self.c_fc(self.ln_2(x))))


class BasicBlock(nn.Module):
    """ResNet BasicBlock (He et al. 2016, arXiv:1512.03385; follows torchvision ``resnet.py``)."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.downsample(x))


class ResNetStack(nn.Module):
    """ResNet-18's stem and first two stages, one BasicBlock each, small width, 10 classes."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU()
        )
        self.layers = nn.Sequential(BasicBlock(width, width), BasicBlock(width, 2 * width, 2))
        self.fc = nn.Linear(2 * width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(F.adaptive_avg_pool2d(self.layers(self.stem(x)), 1).flatten(1))


# ---- capture ------------------------------------------------------------------------------------
@dataclass
class Case:
    name: str
    module: nn.Module
    inputs: tuple[Any, ...]
    loss: Callable[[Any], torch.Tensor]


def cases() -> list[Case]:
    torch.manual_seed(0)
    gpt = GPTConfig()
    idx = torch.randint(0, gpt.vocab_size, (4, gpt.block_size))
    x = torch.randn(2, 32, 64)

    def mse(y: torch.Tensor) -> torch.Tensor:
        return y.float().pow(2).mean()

    return [
        Case("TinyGPT", TinyGPT(gpt), (idx, torch.roll(idx, -1, 1)), lambda y: y),
        Case("ConvNet", ConvNet(), (torch.randn(8, 3, 16, 16),), mse),
        Case("Llama-2 block", LlamaBlock(), (x,), mse),
        Case("BERT layer", BertLayer(), (x,), mse),
        Case("GPT-2 block", GPT2Block(), (x,), mse),
        Case("ResNet-18 blocks", ResNetStack(), (torch.randn(4, 3, 32, 32),), mse),
    ]


def capture(case: Case) -> dict[str, torch.fx.GraphModule]:
    """Forward and backward ATen graphs of one training step (the backend's trn2 capture)."""
    graphs: dict[str, torch.fx.GraphModule] = {}

    def compiler(kind: str) -> Callable[..., Any]:
        def compile_fn(gm: torch.fx.GraphModule, _inputs: Any) -> Any:
            graphs[kind] = copy.deepcopy(gm)
            return make_boxed_func(gm)

        return compile_fn

    # Parameters and buffers are graph inputs, as under torch.compile (BatchNorm's running
    # stats are mutated inputs then, which AOTAutograd functionalizes).
    state = {**dict(case.module.named_parameters()), **dict(case.module.named_buffers())}

    def step(p: dict[str, torch.Tensor], *inputs: Any) -> torch.Tensor:
        return case.loss(torch.func.functional_call(case.module, p, inputs))

    fn = aot_function(
        step,
        compiler("forward"),
        compiler("backward"),
        partition_fn=default_partition,
        decompositions=decomposition_table(TARGET),
    )
    # As the backend does: the math SDPA path decomposes into bmm/softmax (the CPU flash
    # kernel's backward has no lowering).
    with sdpa_kernel(SDPBackend.MATH):
        fn(state, *case.inputs).backward()
    return graphs


# ---- measure ------------------------------------------------------------------------------------
@dataclass
class Row:
    model: str
    graph: str
    ops: tuple[int, int]
    est_us: tuple[float, float]
    passes_ms: float
    lowering_ms: float  # lower_graph of the passed graph
    plain_ms: float  # lower + verify + serialize, no passes
    full_ms: float  # passes + lower + verify + serialize

    @property
    def added(self) -> float:
        """Compile time the passes add, as a fraction of our lowering without them (lowering a
        smaller graph, and verifying and serializing a smaller module, pays some of it back)."""
        return (self.full_ms - self.plain_ms) / self.plain_ms if self.plain_ms else float("nan")


def _lower_verify_serialize(g: torch.fx.GraphModule) -> str:
    text = lower_graph(g, target=get_target(TARGET)).text
    artifact.verify(text)
    artifact.serialize(text, "portable")
    return text


def measure(model: str, kind: str, gm: torch.fx.GraphModule, repeats: int) -> Row:
    before = estimate_module(lower_graph(copy.deepcopy(gm)).text, TARGET)
    passes_s, lowering_s, plain_s, full_s, text = [], [], [], [], ""
    for _ in range(repeats):
        g = copy.deepcopy(gm)
        t0 = time.perf_counter()
        _lower_verify_serialize(g)
        plain_s.append(time.perf_counter() - t0)
        g = copy.deepcopy(gm)
        t0 = time.perf_counter()
        run_pipeline(g, pipeline_for(TARGET), recompile=False)  # as the compiler does
        t1 = time.perf_counter()
        text = lower_graph(g, target=get_target(TARGET)).text
        t2 = time.perf_counter()
        artifact.verify(text)
        artifact.serialize(text, "portable")
        t3 = time.perf_counter()
        passes_s.append(t1 - t0)
        lowering_s.append(t2 - t1)
        full_s.append(t3 - t0)
    after = estimate_module(text, TARGET)
    ms = [statistics.median(v) * 1e3 for v in (passes_s, lowering_s, plain_s, full_s)]
    return Row(
        model,
        kind,
        (before.op_count, after.op_count),
        (before.seconds * 1e6, after.seconds * 1e6),
        *ms,
    )


HEADER = (
    "model",
    "graph",
    "ops before",
    "ops after",
    "est. µs before",
    "est. µs after",
    "Δ est.",
    "passes ms",
    "lowering ms",
    "ours w/o passes ms",
    "ours with passes ms",
    "added by passes",
)


def _cells(r: Row) -> tuple[str, ...]:
    delta = (r.est_us[1] / r.est_us[0] - 1) * 100 if r.est_us[0] else 0.0
    return (
        r.model,
        r.graph,
        str(r.ops[0]),
        str(r.ops[1]),
        f"{r.est_us[0]:.2f}",
        f"{r.est_us[1]:.2f}",
        f"{delta:+.1f}%",
        f"{r.passes_ms:.1f}",
        f"{r.lowering_ms:.1f}",
        f"{r.plain_ms:.1f}",
        f"{r.full_ms:.1f}",
        f"{100 * r.added:+.0f}%",
    )


def render(rows: list[Row], markdown: bool) -> str:
    cells = [_cells(r) for r in rows]
    if markdown:
        lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * 2 + "---:|" * (len(HEADER) - 2)]
        lines += ["| " + " | ".join(c) + " |" for c in cells]
        return "\n".join(lines)
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(HEADER)]

    def line(c: tuple[str, ...]) -> str:
        return "  ".join(
            v.ljust(w) if i < 2 else v.rjust(w)
            for i, (v, w) in enumerate(zip(c, widths, strict=True))
        )

    return "\n".join([line(HEADER), line(tuple("-" * w for w in widths)), *map(line, cells)])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5, help="timed runs per graph (median)")
    p.add_argument("--markdown", action="store_true", help="print a Markdown table")
    p.add_argument("--models", help="comma list of model names to run (default: all)")
    args = p.parse_args(argv)
    wanted = {m.strip() for m in args.models.split(",")} if args.models else None
    rows = []
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for case in cases():
            if wanted and case.name not in wanted:
                continue
            for kind, gm in capture(case).items():
                rows.append(measure(case.name, kind, gm, args.repeats))
    print(render(rows, args.markdown))
    total_before = sum(r.est_us[0] for r in rows)
    total_after = sum(r.est_us[1] for r in rows)
    plain, full = sum(r.plain_ms for r in rows), sum(r.full_ms for r in rows)
    passes, lowering = sum(r.passes_ms for r in rows), sum(r.lowering_ms for r in rows)
    print(
        f"\ntotal estimated trn2 time of one call of every graph: {total_before:.2f} µs -> "
        f"{total_after:.2f} µs\n"
        f"our lowering work over every graph: {plain:.1f} ms without passes, {full:.1f} ms with "
        f"them: passes add {100 * (full - plain) / plain:+.0f}% (target <= +20%); the passes "
        f"alone are {100 * passes / lowering:.0f}% of lower_graph\n"
        f"medians of {args.repeats} runs; wall {time.perf_counter() - t0:.1f} s"
    )


if __name__ == "__main__":
    main()
