"""Benchmark a dozen small public architectures on CPU: first call and train step, eager vs neuron.

Run: ``python benchmarks/bench_models.py [--models gpt2,resnet18] [--steps N] [--no-inductor]
[--markdown] [--json out.json]``. Per model, all in one process, one backend after the other,
each on a fresh ``copy.deepcopy`` of the model after ``torch._dynamo.reset()``:

* first call (forward + backward of one train step, wall time) for ``aot_eager``, ``neuron`` and
  ``inductor``, their on-disk caches in fresh temporary directories;
* neuron's first call split with ``neuron_compile.metrics()``: ours (backend minus XLA compile),
  XLA compile, first execution of each graph, and tracing (the rest: Dynamo + AOTAutograd);
* warm neuron: the same cold-Dynamo first call again, our on-disk cache now filled;
* steady train step (zero_grad + forward + backward + optimizer step) for eager, neuron and
  Inductor, in interleaved rounds; reported is the best round's median;
* correctness: each backend's first loss against eager's, its gradients against float64 eager.

Models are built in code (Hugging Face configs, no downloads) and sized so one eager train step
takes ~1-50 ms on 2 cores.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Before torch is imported: Inductor reads its cache location from the environment.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="bench_models_inductor_"))
os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
# Ours too: "cold" means an empty on-disk compilation cache; the warm run then reuses it.
os.environ.setdefault("NEURON_COMPILE_CACHE_DIR", tempfile.mkdtemp(prefix="bench_models_neuron_"))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from conv_net import ConvNet  # noqa: E402
from conv_net import make_data as conv_net_data  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
# bench_gpt.py's turn-taking step timer and process warm-up: one way to time a step.
from bench_gpt import _warm_up_process as warm_up_process  # noqa: E402
from bench_gpt import interleaved_step_ms  # noqa: E402

import neuron_compile  # noqa: E402
from neuron_compile.compiler import DowncastWarning  # noqa: E402

# Token ids < 256 narrowed to int32 are exact; and the one re-trace per model after a Dynamo reset
# is expected (compiles during the timed steps are detected and reported instead).
warnings.filterwarnings("ignore", category=DowncastWarning)
warnings.filterwarnings("ignore", category=neuron_compile.RecompileWarning)

# ratio -> (label, each model's target, the median's target)
TARGETS = {
    "first_ratio": ("first call neuron/aot_eager", 2.0, 1.5),
    "step_ratio": ("train step neuron/eager", 2.0, 1.2),
}
LOSS_TOL = {"rtol": 1e-4, "atol": 1e-4}
# Gradient error (relative to each gradient's largest entry) always tolerated: see bench_model.
GRAD_TOL = 1e-3
SEQ, BATCH, VOCAB = 32, 8, 256


class HFLoss(nn.Module):
    """A Hugging Face model's scalar ``.loss`` for an input (passed as ``key``) and labels."""

    def __init__(self, model: nn.Module, key: str) -> None:
        super().__init__()
        self.model, self.key = model, key

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.model(**{self.key: x}, labels=labels).loss


class CELoss(nn.Module):
    """Cross-entropy of a network's logits (per pixel when the logits are 4-D)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.net(x), y)


def _conv_bn(
    cin: int, cout: int, k: int = 3, stride: int = 1, groups: int = 1, act: type | None = nn.ReLU
) -> nn.Sequential:
    """Conv (no bias: BatchNorm cancels it) + BatchNorm + optional activation."""
    conv = nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False)
    return nn.Sequential(conv, nn.BatchNorm2d(cout), *([act(inplace=True)] if act else []))


class Residual(nn.Module):
    """``relu(body(x) + shortcut(x))``, the shortcut a strided 1x1 conv + BN when shapes change."""

    def __init__(self, body: nn.Module, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.body = body
        same = stride == 1 and cin == cout
        self.down = nn.Identity() if same else _conv_bn(cin, cout, 1, stride, act=None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + self.down(x))


def basic_block(cin: int, cout: int, stride: int) -> nn.Module:
    body = nn.Sequential(_conv_bn(cin, cout, 3, stride), _conv_bn(cout, cout, act=None))
    return Residual(body, cin, cout, stride)


def resnext_block(cin: int, cout: int, stride: int) -> nn.Module:
    """Bottleneck whose 3x3 conv is grouped (cardinality 8)."""
    w = cout // 2
    body = nn.Sequential(
        _conv_bn(cin, w, 1), _conv_bn(w, w, 3, stride, groups=8), _conv_bn(w, cout, 1, act=None)
    )
    return Residual(body, cin, cout, stride)


def resnet(block: Callable[..., nn.Module], widths: tuple[int, ...]) -> nn.Module:
    """Stem conv, two blocks per stage (stride 2 from the second stage on), pool, linear."""
    layers: list[nn.Module] = [_conv_bn(3, widths[0])]
    cin = widths[0]
    for i, w in enumerate(widths):
        layers += [block(cin, w, 1 if i == 0 else 2), block(w, w, 1)]
        cin = w
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 10))


class InvertedResidual(nn.Module):
    """MobileNetV2: 1x1 expand, depthwise 3x3, linear 1x1 projection (no activation)."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        h = cin * expand
        self.use_res = stride == 1 and cin == cout
        self.body = nn.Sequential(
            _conv_bn(cin, h, 1, act=nn.ReLU6),
            _conv_bn(h, h, 3, stride, groups=h, act=nn.ReLU6),
            _conv_bn(h, cout, 1, act=None),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x) if self.use_res else self.body(x)


def mobilenet_v2() -> nn.Module:
    layers: list[nn.Module] = [_conv_bn(3, 16, act=nn.ReLU6)]
    cin = 16
    for expand, cout, n, stride in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 2, 2), (6, 64, 1, 2)]:
        for i in range(n):
            layers.append(InvertedResidual(cin, cout, stride if i == 0 else 1, expand))
            cin = cout
    head = [_conv_bn(cin, 128, 1, act=nn.ReLU6), nn.AdaptiveAvgPool2d(1), nn.Flatten()]
    return nn.Sequential(*layers, *head, nn.Linear(128, 10))


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dw = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim)
        self.pw1, self.pw2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(1e-1 * torch.ones(dim))  # layer scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dw(x).permute(0, 2, 3, 1)  # channels-last for LayerNorm and the Linears
        y = self.pw2(F.gelu(self.pw1(self.norm(y))))
        return x + (self.gamma * y).permute(0, 3, 1, 2)


class ChannelsLayerNorm(nn.LayerNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def convnext(dims: tuple[int, ...] = (32, 64)) -> nn.Module:
    """4x4 patchify stem, two blocks per stage, LayerNorm + strided 2x2 conv between stages."""
    layers: list[nn.Module] = [nn.Conv2d(3, dims[0], 4, 4), ChannelsLayerNorm(dims[0])]
    for i, d in enumerate(dims):
        if i:
            layers += [ChannelsLayerNorm(dims[i - 1]), nn.Conv2d(dims[i - 1], d, 2, 2)]
        layers += [ConvNeXtBlock(d), ConvNeXtBlock(d)]
    head = [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.LayerNorm(dims[-1])]
    return nn.Sequential(*layers, *head, nn.Linear(dims[-1], 10))


class UNet(nn.Module):
    """Two down levels (max pool), ConvTranspose2d up-sampling with concatenated skips."""

    def __init__(self, n_classes: int = 4, w: int = 16) -> None:
        super().__init__()

        def double(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(_conv_bn(cin, cout), _conv_bn(cout, cout))

        self.enc1, self.enc2, self.mid = double(3, w), double(w, 2 * w), double(2 * w, 4 * w)
        self.up2, self.dec2 = nn.ConvTranspose2d(4 * w, 2 * w, 2, 2), double(4 * w, 2 * w)
        self.up1, self.dec1 = nn.ConvTranspose2d(2 * w, w, 2, 2), double(2 * w, w)
        self.out = nn.Conv2d(w, n_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e1 = self.enc1(x)
        e2 = self.enc2(F.max_pool2d(e1, 2))
        m = self.mid(F.max_pool2d(e2, 2))
        d2 = self.dec2(torch.cat([self.up2(m), e2], 1))
        return self.out(self.dec1(torch.cat([self.up1(d2), e1], 1)))


def _hf(name: str, g: torch.Generator) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Tiny Hugging Face models from configs. Every dropout probability is 0 rather than using
    eval(): BatchNorm in the conv nets needs train mode, and all models follow one convention."""
    import transformers as tf

    tf.logging.set_verbosity_error()  # tiny-vocab token-id warnings: irrelevant here
    ids, key = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g), "input_ids"
    bert_like = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4)
    bert_like |= dict(intermediate_size=128, hidden_dropout_prob=0.0)
    bert_like |= dict(attention_probs_dropout_prob=0.0)
    if name == "gpt2":
        zero = dict.fromkeys(("resid_pdrop", "embd_pdrop", "attn_pdrop"), 0.0)
        cfg = tf.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, **zero)
        cls, inputs = tf.GPT2LMHeadModel, (ids, ids)
    elif name == "llama":
        kw = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2)
        cfg = tf.LlamaConfig(vocab_size=VOCAB, num_attention_heads=4, num_key_value_heads=2, **kw)
        cls, inputs = tf.LlamaForCausalLM, (ids, ids)
    elif name == "bert":
        cfg = tf.BertConfig(vocab_size=VOCAB, max_position_embeddings=64, **bert_like)
        labels = torch.where(torch.rand(ids.shape, generator=g) < 0.15, ids, -100)
        labels[:, 0] = ids[:, 0]  # at least one predicted position per row
        cls, inputs = tf.BertForMaskedLM, (ids, labels)
    elif name == "t5":
        t5 = dict(d_model=64, d_kv=16, d_ff=128, num_heads=4, num_layers=2, dropout_rate=0.0)
        cfg = tf.T5Config(vocab_size=VOCAB, decoder_start_token_id=0, **t5)
        cls, inputs = tf.T5ForConditionalGeneration, (ids, ids[:, : SEQ // 2].flip(1))
    elif name == "vit":
        # problem_type set up front: the loss sets it at the first call otherwise, a config
        # change that makes Dynamo recompile at the second call.
        cfg = tf.ViTConfig(image_size=32, patch_size=4, num_labels=10, **bert_like)
        cfg.problem_type = "single_label_classification"
        x, y = (
            torch.randn(BATCH, 3, 32, 32, generator=g),
            torch.randint(0, 10, (BATCH,), generator=g),
        )
        cls, inputs, key = tf.ViTForImageClassification, (x, y), "pixel_values"
    else:
        raise KeyError(name)
    cfg.use_cache = False  # training: no KV cache outputs
    # SDPA where the model has it (it compiles with every backend here); T5 only has eager.
    model = cls._from_config(cfg, attn_implementation="eager" if name == "t5" else "sdpa")
    return HFLoss(model, key), inputs


def _classify(
    net: Callable[[], nn.Module], x: tuple[int, ...], y: tuple[int, ...], n: int = 10
) -> Callable[[torch.Generator], Any]:
    """A builder: ``net`` under cross-entropy, a random batch of shape ``x``, labels ``y`` < n."""
    return lambda g: (
        CELoss(net()),
        (torch.randn(x, generator=g), torch.randint(0, n, y, generator=g)),
    )


def mlp() -> nn.Module:
    return nn.Sequential(
        nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 10)
    )


IMG, LABELS = (16, 3, 32, 32), (16,)
# name -> (builder of (loss module, batch) from a generator, optimizer)
MODELS: dict[str, tuple[Callable[[torch.Generator], Any], str]] = {
    **{n: (lambda g, n=n: _hf(n, g), "adamw") for n in ("gpt2", "llama", "bert", "t5", "vit")},
    "resnet18": (_classify(lambda: resnet(basic_block, (16, 32, 64, 128)), IMG, LABELS), "sgd"),
    "mobilenetv2": (_classify(mobilenet_v2, IMG, LABELS), "sgd"),
    "resnext": (_classify(lambda: resnet(resnext_block, (32, 64, 128)), IMG, LABELS), "sgd"),
    "convnext": (_classify(convnext, IMG, LABELS), "sgd"),
    "unet": (_classify(UNet, (8, 3, 32, 32), (8, 32, 32), 4), "sgd"),  # per-pixel classes
    "conv_net": (lambda g: (CELoss(ConvNet()), conv_net_data(1)[0]), "sgd"),  # examples/
    "mlp": (_classify(mlp, (64, 256), (64,)), "adamw"),
}


class Runner:
    """A train step on its own deep copy of the model, compiled with ``backend`` (None: eager)."""

    def __init__(self, model: nn.Module, backend: str | None, optimizer: str) -> None:
        self.model = copy.deepcopy(model)
        self.run = torch.compile(self.model, backend=backend) if backend else self.model
        params, adamw = self.model.parameters(), optimizer == "adamw"
        self.opt = torch.optim.AdamW(params, lr=1e-3) if adamw else torch.optim.SGD(params, lr=0.05)

    def first_call(self, batch: tuple[torch.Tensor, ...]) -> tuple[float, float, list[Any]]:
        """Wall time of the first forward + backward, its loss and the gradients; then the
        optimizer step, outside the timing (it is the same eager code for every backend)."""
        t0 = time.perf_counter()
        loss = self.run(*batch)
        loss.backward()
        seconds = time.perf_counter() - t0
        grads = [p.grad.clone() if p.grad is not None else None for p in self.model.parameters()]
        self.opt.step()
        return seconds, loss.item(), grads

    def step(self, batch: tuple[torch.Tensor, ...]) -> float:
        self.opt.zero_grad(set_to_none=True)
        loss = self.run(*batch)
        loss.backward()
        self.opt.step()
        return loss.item()


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200] if text else ''}"


def neuron_split(first_s: float) -> dict[str, Any]:
    """Split neuron's first call with ``neuron_compile.metrics()`` (cleared before it)."""
    recs = neuron_compile.metrics()
    backend = sum(r.backend_s for r in recs)
    xla = sum(r.executor_compile_s for r in recs)
    first_run = sum(r.first_run_s for r in recs)
    return {
        "total_s": first_s,
        "graphs": len(recs),
        "trace_s": first_s - backend - first_run,
        "ours_s": backend - xla,
        "xla_compile_s": xla,
        "first_run_s": first_run,
        "fallback_ops": sorted({op for r in recs for op in r.fallback_ops}),
        "cache_sources": dict(Counter(r.cache_source for r in recs)),
    }


def _grad_error(grads: list[Any], ref: list[Any]) -> float:
    """Worst over parameters of max |grad - ref| / max |ref|: scale-free, so a deep net's tiny
    first-layer gradients count as much as its head's."""
    return max(
        ((g.double() - r).abs().max() / r.abs().max().clamp_min(1e-30)).item()
        for g, r in zip(grads, ref, strict=True)
        if r is not None and g is not None
    )


def fp64_grads(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> list[Any]:
    """Eager float64 gradients: the yardstick for every backend's float32 rounding."""
    m = copy.deepcopy(model).double()
    m(*(x.double() if x.is_floating_point() else x for x in batch)).backward()
    return [p.grad for p in m.parameters()]


def bench_model(name: str, steps: int | None, inductor: bool, repeats: int = 3) -> dict[str, Any]:
    """Every measurement of one model; a backend's failure is recorded in the row, not raised."""
    build, optimizer = MODELS[name]
    torch.manual_seed(0)
    model, batch = build(torch.Generator().manual_seed(0))
    model.train()
    row: dict[str, Any] = {"model": name, "errors": {}, "mismatch": []}
    row["params"] = sum(p.numel() for p in model.parameters())

    eager = Runner(model, None, optimizer)
    row["eager_first_s"], ref_loss, grads = eager.first_call(batch)
    row["eager_loss"] = ref_loss
    # Gradients are checked against float64, not float32 eager: in a deep BatchNorm net eager's
    # own float32 gradients are off by ~1% (resnext), far above any fixed tolerance, so "close to
    # eager" would flag rounding noise. A backend fails when its error is well above eager's.
    ref64 = fp64_grads(model, batch)
    row["grad_err"] = {"eager": _grad_error(grads, ref64)}
    grad_limit = max(GRAD_TOL, 10 * row["grad_err"]["eager"])
    runners = {"eager": eager}

    def cold(key: str, backend: str) -> Runner | None:
        """A fresh copy's cold first call under ``backend``; its error is recorded, not raised."""
        torch._dynamo.reset()
        neuron_compile.reset_metrics()
        # A full collection scans every live object (~0.2-0.4 s here): start each first call
        # from an empty young generation, as torch._dynamo.utils.timed does, so that whichever
        # backend happens to cross Python's threshold does not pay for the others' garbage.
        gc.collect()
        try:
            r = Runner(model, backend, optimizer)
            row[f"{key}_s"], loss, grads = r.first_call(batch)
        except Exception as e:
            row["errors"][key] = _first_line(e)
            return None
        row[f"{key}_loss"] = loss
        # A benchmark of a wrong answer is worthless: check every backend against eager.
        try:
            torch.testing.assert_close(torch.tensor(loss), torch.tensor(ref_loss), **LOSS_TOL)
        except AssertionError:
            row["mismatch"].append(f"{key} loss {loss!r} != eager {ref_loss!r} ({LOSS_TOL})")
        err = row["grad_err"][key] = _grad_error(grads, ref64)
        if err > grad_limit:
            row["mismatch"].append(
                f"{key} gradients off by {err:.1e} of max (limit {grad_limit:.1e})"
            )
        return r

    # A cold first call is one sample of a noisy quantity: take ``repeats`` of each, the two
    # backends alternating, each neuron run on an empty cache, and report the median run.
    firsts: dict[str, list[float]] = {"aot_eager_first": [], "neuron_first": []}
    splits = []
    for _ in range(repeats):
        if cold("aot_eager_first", "aot_eager") is not None:
            firsts["aot_eager_first"].append(row["aot_eager_first_s"])
        neuron_compile.reset()  # our in-memory executables: cold means cold
        os.environ["NEURON_COMPILE_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench_models_neuron_")
        if cold("neuron_first", "neuron") is not None:
            firsts["neuron_first"].append(row["neuron_first_s"])
            splits.append(neuron_split(row["neuron_first_s"]))
    for key, runs in firsts.items():
        if runs:
            row[key + "_s"], row[key + "_runs"] = statistics.median(runs), runs
    if splits:
        row["neuron_split"] = sorted(splits, key=lambda sp: sp["total_s"])[len(splits) // 2]
    # Cold Dynamo again, our disk cache now filled: the steady-state neuron runner is this one.
    warm = cold("neuron_warm", "neuron")
    if warm is not None:
        row["neuron_warm_split"] = neuron_split(row["neuron_warm_s"])
        runners["neuron"] = warm
    if inductor and (ind := cold("inductor_first", "inductor")) is not None:
        runners["inductor"] = ind

    try:
        # Untimed warm-up. The reset before Inductor's cold call dropped the neuron runner's
        # Dynamo cache: it re-traces here, our caches warm.
        for r in runners.values():
            for _ in range(3):
                r.step(batch)
        t0 = time.perf_counter()
        eager.step(batch)
        # Enough steps for ~1.5 s per backend at eager speed, at least 2 per round.
        n = steps or int(min(300, max(20, 1.5 / max(time.perf_counter() - t0, 1e-4))))
        row["steps"] = n
        neuron_compile.reset_metrics()
        step_fns = {name: (lambda *b, r=r: r.step(b)) for name, r in runners.items()}
        row["step_ms"] = interleaved_step_ms(step_fns, batch, n)
        if recompiled := [r.name for r in neuron_compile.metrics()]:
            row["mismatch"].append(f"neuron compiled during the timed steps: {recompiled}")
    except Exception as e:
        row["errors"]["train_step"] = _first_line(e)
        row["step_ms"] = {}
    return row


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b is not None and b > 0 else None


COLUMNS = (
    "model|aot_eager s|neuron s|trace|ours|XLA|1st run|warm s|inductor s|n/aot|eager ms|neuron ms"
    "|induct ms|n/eager|check"
).split("|")


def _cells(row: dict[str, Any]) -> list[str]:
    split, step = row.get("neuron_split", {}), row.get("step_ms", {})

    def num(v: float | None, key: str = "", unit: str = "") -> str:
        if v is not None:
            return f"{v:.2f}{unit}"
        return "ERR" if key in row["errors"] else "-"

    check = "MISMATCH" if row["mismatch"] else ("ERR" if row["errors"] else "ok")
    return [
        row["model"],
        *(num(row.get(f"{k}_s"), k) for k in ("aot_eager_first", "neuron_first")),
        *(num(split.get(k)) for k in ("trace_s", "ours_s", "xla_compile_s", "first_run_s")),
        *(num(row.get(f"{k}_s"), k) for k in ("neuron_warm", "inductor_first")),
        num(row.get("first_ratio"), unit="x"),
        *(num(step.get(k), "train_step") for k in ("eager", "neuron", "inductor")),
        num(row.get("step_ratio"), unit="x"),
        check,
    ]


def print_table(rows: list[dict[str, Any]], markdown: bool) -> None:
    table = [COLUMNS, *(_cells(r) for r in rows)]
    if markdown:
        table.insert(1, [":--", *["--:"] * (len(COLUMNS) - 2), ":-:"])
        for cells in table:
            print("| " + " | ".join(cells) + " |")
        return
    widths = [max(len(t[i]) for t in table) for i in range(len(COLUMNS))]
    for cells in table:  # model names left-aligned, numbers right-aligned
        first, rest = cells[0].ljust(widths[0]), zip(cells[1:], widths[1:], strict=True)
        print("  ".join([first, *(c.rjust(w) for c, w in rest)]))


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and max over models of both ratios, each against its targets."""
    out: dict[str, Any] = {}
    for key, (_, each_max, median_max) in TARGETS.items():
        vals = {r["model"]: r[key] for r in rows if r.get(key) is not None}
        out[key] = s = {"models": len(vals), "median_target": median_max, "each_target": each_max}
        if vals:
            s["median"], s["max"] = statistics.median(vals.values()), max(vals.values())
            s["max_model"] = max(vals, key=vals.__getitem__)
            s["median_pass"], s["each_pass"] = s["median"] <= median_max, s["max"] <= each_max
            s["over_target"] = sorted(m for m, v in vals.items() if v > each_max)
    return out


def print_summary(summary: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    print()
    for key, (label, _, _) in TARGETS.items():
        s = summary[key]
        if not s["models"]:
            print(f"{label}: no model measured")
            continue
        print(
            f"{label} over {s['models']} models: median {s['median']:.2f}x "
            f"(target <= {s['median_target']}x: {'PASS' if s['median_pass'] else 'MISS'}), "
            f"max {s['max']:.2f}x on {s['max_model']} "
            f"(target <= {s['each_target']}x each: {'PASS' if s['each_pass'] else 'MISS'})"
        )
        if s["over_target"]:
            print(f"  over {s['each_target']}x: {', '.join(s['over_target'])}")
    # Loud: a failed compile is a missing number, a mismatch a number not worth having.
    bad = [(r["model"], f"[{k}] {e}") for r in rows for k, e in r["errors"].items()]
    bad += [(r["model"], f"WRONG RESULT: {m}") for r in rows for m in r["mismatch"]]
    if bad:
        print(f"\n!!! {len(bad)} FAILURE(S) / MISMATCH(ES):")
    for model, msg in bad:
        print(f"!!! {model} {msg}\n    repro: python benchmarks/bench_models.py --models {model}")
    for r in rows:
        if ops := r.get("neuron_split", {}).get("fallback_ops"):
            print(f"note: {r['model']} ran ops eagerly (CPU fallback): {', '.join(ops)}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    names = ",".join(MODELS)
    parser.add_argument("--models", help=f"comma-separated subset of {names} (default: all)")
    parser.add_argument("--steps", type=int, help="timed steps per backend (default: ~1.5 s each)")
    parser.add_argument("--no-inductor", action="store_true", help="skip the Inductor columns")
    parser.add_argument(
        "--repeats", type=int, default=3, help="cold first calls per backend (median; default 3)"
    )
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument("--json", metavar="PATH", help="also write every number as JSON")
    args = parser.parse_args(argv)
    names = args.models.split(",") if args.models else list(MODELS)
    if unknown := [m for m in names if m not in MODELS]:
        parser.error(f"unknown model(s) {unknown}; choose from {sorted(MODELS)}")

    import jax

    print(f"torch {torch.__version__}, jax {jax.__version__}, threads {torch.get_num_threads()}")
    print(
        f"first call: fwd + bwd of one train step (s), median of {args.repeats} cold runs (neuron:"
        " the median run and its split); train step: best of 10 round medians (ms)"
    )
    # One-time process costs first, so each model's cold call is cold for that model only.
    inductor = not args.no_inductor
    for backend in ("aot_eager", "neuron", *(("inductor",) if inductor else ())):
        try:
            warm_up_process(backend)
        except Exception as e:  # Inductor needs a working C++ toolchain
            print(f"!!! warm-up of {backend} failed: {_first_line(e)}")
            inductor = inductor and backend != "inductor"

    rows = []
    for name in names:
        t0 = time.perf_counter()
        try:
            row = bench_model(name, args.steps, inductor, args.repeats)
        except Exception as e:  # building the model or eager itself failed
            row = {"model": name, "errors": {"eager": _first_line(e)}, "mismatch": []}
        row["first_ratio"] = _ratio(row.get("neuron_first_s"), row.get("aot_eager_first_s"))
        step = row.get("step_ms", {})
        row["step_ratio"] = _ratio(step.get("neuron"), step.get("eager"))
        row["bench_s"] = time.perf_counter() - t0
        rows.append(row)
        status = "; ".join([*row["errors"].values(), *row["mismatch"]]) or "ok"
        print(f"  {name}: {row['bench_s']:.0f} s, {status}", flush=True)

    print()
    print_table(rows, args.markdown)
    summary = summarize(rows)
    print_summary(summary, rows)
    res = {"torch": torch.__version__, "jax": jax.__version__, "threads": torch.get_num_threads()}
    res |= {"models": rows, "summary": summary}
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2, default=str))
        print(f"\nwrote {args.json}")
    return res


if __name__ == "__main__":
    main()
