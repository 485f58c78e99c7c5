"""One gloo rank of a distributed setting (issue 20), trained eagerly and compiled in one process.

Run by tests/distributed/test_settings.py through launch.py: ``python settings_worker.py SETTING``
with torchrun's environment. Both runs start from the same seeded model (``torch.manual_seed(0)``
on every rank) and see the same per-rank batches (seeded by the data-parallel rank); the eager run
is the reference. Prints one JSON line: the losses of both runs, the largest parameter and
gradient differences (this rank's local shards), and from ``neuron_compile.metrics()`` the graphs
compiled and the ops that ran eagerly between them (``fallback_ops``).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

import neuron_compile
from neuron_compile import events

STEPS = 3
OUT = 4  # outputs of the MLP: every parameter splits evenly over 2 or 4 FSDP ranks
LR = 0.1
BACKEND = "neuron"  # the one under test; a debugging run may swap in "aot_eager"


class Block(nn.Module):
    # A class of ours, not nn.Sequential: torch 2.13's in-place ``module.compile()`` traces
    # nothing for torch.nn's own modules (their forward is in a file Dynamo skips).
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(x))


class MLP(nn.Module):
    """Four blocks of Linear + tanh: small, but several buckets / FSDP units / graphs."""

    def __init__(self, dim: int = 16, depth: int = 4, out: int = OUT) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block(dim) for _ in range(depth))
        self.head = nn.Linear(dim, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def seeded(build: Callable[[], nn.Module]) -> nn.Module:
    torch.manual_seed(0)  # the same initial parameters on every rank and in both runs
    return build()


def mlp_batches(data_rank: int, batch: int = 8, dim: int = 16, out: int = OUT) -> list[tuple]:
    g = torch.Generator().manual_seed(100 + data_rank)
    return [
        (torch.randn(batch, dim, generator=g), torch.randn(batch, out, generator=g))
        for _ in range(STEPS)
    ]


def mse(model: Callable, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(model(x), y)


def train(model: nn.Module, step: Callable, batches: list[tuple], opt: str = "sgd") -> list[float]:
    """``step(x, y)`` returns the loss with the gradients accumulated (it calls backward)."""
    params = list(model.parameters())
    optimizer = (
        torch.optim.SGD(params, lr=LR)
        if opt == "sgd"
        else torch.optim.AdamW(params, lr=1e-2, foreach=False)
    )
    losses = []
    for x, y in batches:
        optimizer.zero_grad()  # the last step's gradients stay for the comparison
        losses.append(step(x, y).item())
        optimizer.step()
    return losses


def fwd_bwd(forward: Callable, loss_scale: float = 1.0) -> Callable:
    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = mse(forward, x, y)
        (loss * loss_scale).backward()
        return loss.detach()

    return step


def _local(t: torch.Tensor | None) -> torch.Tensor | None:
    return t.to_local() if hasattr(t, "to_local") else t


def max_diff(compiled: nn.Module, eager: nn.Module) -> dict:
    """Largest |compiled - eager| over this rank's parameters and their gradients, or a
    ``mismatch`` naming the first parameter whose shape or gradient presence differs."""
    out: dict = {"param_diff": 0.0, "grad_diff": 0.0}
    pairs = zip(compiled.named_parameters(), eager.named_parameters(), strict=True)
    for (name, p), (_, q) in pairs:
        for what, a, b in (("param", p.detach(), q.detach()), ("grad", p.grad, q.grad)):
            a, b = _local(a), _local(b)
            if a is None and b is None:
                continue
            if a is None or b is None or a.shape != b.shape:
                shape = [None if t is None else list(t.shape) for t in (a, b)]
                out["mismatch"] = f"{what} of {name}: compiled {shape[0]} vs eager {shape[1]}"
                return out
            if a.numel():  # an FSDP shard may be empty
                out[f"{what}_diff"] = max(out[f"{what}_diff"], (a - b).abs().max().item())
    return out


def collectives_of(gm: torch.fx.GraphModule) -> dict[str, int]:
    """``{op: count}`` of the c10d functional collectives in an FX graph (waits not counted)."""
    found: Counter[str] = Counter()
    for node in gm.graph.nodes:
        namespace, _, op = str(node.target).partition(".")
        if node.op == "call_function" and namespace.startswith("_c10d_functional"):
            found[op.split(".")[0]] += op != "wait_tensor.default"
    return {op: n for op, n in found.items() if n}


def compiled_run(run: Callable[[], Any]) -> tuple[Any, dict]:
    """Run the compiled training with fresh metrics; what neuron_compile recorded meanwhile,
    and which collectives each graph handed to it contained (``GraphCompiled.gm``: the graph as
    AOTAutograd traced it; None only on an AOT-cache warm start, which the tests turn off)."""
    graphs: dict[str, dict[str, int] | None] = {}

    def on_compiled(event: events.GraphCompiled) -> None:
        graphs[event.name] = None if event.gm is None else collectives_of(event.gm)

    neuron_compile.reset_metrics()
    start = time.perf_counter()
    with events.subscribed(on_compiled, events.GraphCompiled):
        result = run()  # a FallbackWarning goes to stderr; the ops are reported in fallback_ops
    records = neuron_compile.metrics()
    info = {
        "collectives_in_graphs": graphs,
        "compiled_run_s": round(time.perf_counter() - start, 2),
        "backend_s": round(sum(r.backend_s for r in records), 2),
        "graphs": len(records),
        "graph_names": [r.name for r in records],
        "fallback_ops": sorted({op for r in records for op in r.fallback_ops}),
        "fallback_by_graph": {r.name: sorted(r.fallback_ops) for r in records if r.fallback_ops},
        "eager_frames": [str(f) for f in neuron_compile.eager_frames()],
    }
    return result, info


def compile_neuron(fn: Callable) -> Callable:
    return torch.compile(fn, backend=BACKEND)


# --- the settings ----------------------------------------------------------------------------


def ddp_optimizer(rank: int, world: int) -> dict:
    """a. torch.compile of a DDP module: DDPOptimizer splits the graph at bucket boundaries."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    batches = mlp_batches(rank)
    # ~1 KB buckets, so that DDPOptimizer splits even this tiny model into one graph per bucket
    # (all-reduces between graphs). DDP and DDPOptimizer both read the first bucket's size from
    # this constant (1 MB), which DDPOptimizer requires to be <= the other buckets' size.
    dist._DEFAULT_FIRST_BUCKET_BYTES = 1024
    eager, compiled = (DDP(seeded(MLP), bucket_cap_mb=0.001) for _ in range(2))
    losses = train(eager, fwd_bwd(eager), batches)
    compiled_losses, info = compiled_run(
        lambda: train(compiled, fwd_bwd(compile_neuron(compiled)), batches)
    )
    return {"eager": losses, "compiled": compiled_losses, **info, **max_diff(compiled, eager)}


def ddp_python_reducer(rank: int, world: int) -> dict:
    """b. DDP's python reducer under compiled autograd: the gradient all-reduces (functional
    collectives issued by post-accumulate-grad hooks) are traced into the backward graph."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    batches = mlp_batches(rank)
    eager = DDP(seeded(MLP))  # the reference: DDP's C++ reducer, no compiler
    # The mode is read when DDP is constructed (it registers the hooks the backward traces);
    # compiled autograd is read by torch.compile while the step runs.
    with torch._dynamo.config.patch(optimize_ddp="python_reducer", compiled_autograd=True):
        compiled = DDP(seeded(MLP))
        compiled_losses, info = compiled_run(
            lambda: train(compiled, compile_neuron(fwd_bwd(compiled)), batches)
        )
    losses = train(eager, fwd_bwd(eager), batches)
    return {"eager": losses, "compiled": compiled_losses, **info, **max_diff(compiled, eager)}


def _fsdp2(model: MLP, compile_blocks: bool = False) -> MLP:
    from torch.distributed.fsdp import fully_shard

    for layer in model.layers:
        if compile_blocks:  # before fully_shard, as torchtitan does
            layer.compile(backend=BACKEND)
        fully_shard(layer)
    return fully_shard(model)


def fsdp2_blocks(rank: int, world: int) -> dict:
    """c1. FSDP2 with each block compiled (its hooks run eagerly around the block graphs)."""
    batches = mlp_batches(rank)
    eager, compiled = _fsdp2(seeded(MLP)), _fsdp2(seeded(MLP), compile_blocks=True)
    losses = train(eager, fwd_bwd(eager), batches, opt="adamw")
    compiled_losses, info = compiled_run(
        lambda: train(compiled, fwd_bwd(compiled), batches, opt="adamw")
    )
    # FSDP2's hooks are dynamo-disabled by torch itself: not frames that failed to compile
    assert info["eager_frames"] == [], info["eager_frames"]
    return {"eager": losses, "compiled": compiled_losses, **info, **max_diff(compiled, eager)}


def fsdp2_compiled_autograd(rank: int, world: int) -> dict:
    """c2. FSDP2 with the whole step (forward and backward) compiled, compiled autograd on.

    torch 2.13 itself gets this setting wrong with any backend (FSDP2's root post-backward
    callback never runs under compiled autograd), so the reference is the same compiled step
    with torch's own ``aot_eager`` backend; the eager run is reported beside it."""
    batches = mlp_batches(rank)
    eager, reference, compiled = (_fsdp2(seeded(MLP)) for _ in range(3))
    losses = train(eager, fwd_bwd(eager), batches, opt="adamw")
    with torch._dynamo.config.patch(compiled_autograd=True):
        torch_step = torch.compile(fwd_bwd(reference), backend="aot_eager")
        reference_losses = train(reference, torch_step, batches, opt="adamw")
        torch._dynamo.reset()
        compiled_losses, info = compiled_run(
            lambda: train(compiled, compile_neuron(fwd_bwd(compiled)), batches, opt="adamw")
        )
    return {
        "eager": reference_losses,
        "compiled": compiled_losses,
        "plain_eager": losses,
        "aot_eager_vs_eager": max_diff(reference, eager),
        **info,
        **max_diff(compiled, reference),
    }


def simple_fsdp_mlp(rank: int, world: int, out: int = OUT) -> dict:
    """d. SimpleFSDP: all-gather in the forward graph, reduce-scatter in the backward graph."""
    from simple_fsdp import simple_fsdp

    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    batches = mlp_batches(rank, out=out)
    eager, compiled = (simple_fsdp(seeded(lambda: MLP(out=out)), mesh) for _ in range(2))
    losses = train(eager, fwd_bwd(eager, 1 / world), batches)
    compiled_losses, info = compiled_run(
        lambda: train(compiled, fwd_bwd(compile_neuron(compiled), 1 / world), batches)
    )
    return {"eager": losses, "compiled": compiled_losses, **info, **max_diff(compiled, eager)}


def simple_fsdp_uneven(rank: int, world: int) -> dict:
    """d'. SimpleFSDP with a 1-output head: its (1, 16) weight and (1,) bias shard unevenly
    (rank 0 holds the row, the others nothing), so DTensor pads before the all-gather and the
    ranks' graphs differ (pads on some ranks only) while their collectives must still match."""
    return simple_fsdp_mlp(rank, world, out=1)


def _llama_run(mesh_shape: tuple[int, int]) -> dict:
    """The example's Llama-style model, TP on "tp" and SimpleFSDP on "dp" (when dp > 1)."""
    import train_tp_fsdp as example
    from simple_fsdp import simple_fsdp

    example.LAYERS = 1  # the example's model with one block: the same graphs, traced faster
    mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=("dp", "tp"))
    dp = mesh["dp"].size()

    def build() -> nn.Module:
        model = example.tensor_parallel(example.Llama(), mesh["tp"])
        return simple_fsdp(model, mesh["dp"]) if dp > 1 else model

    data = example.batches(STEPS, mesh["dp"].get_local_rank())
    eager, compiled = (seeded(build) for _ in range(2))
    losses = example.train(eager, data, eager, dp)
    compiled_losses, info = compiled_run(
        lambda: example.train(compiled, data, compile_neuron(compiled), dp)
    )
    return {"eager": losses, "compiled": compiled_losses, **info, **max_diff(compiled, eager)}


def tensor_parallel(rank: int, world: int) -> dict:
    """e. Colwise/Rowwise/SequenceParallel on a Llama-style model over all ranks."""
    return _llama_run((1, world))


def tp_simple_fsdp_2d(rank: int, world: int) -> dict:
    """f. A 2 x 2 mesh ("dp", "tp"): SimpleFSDP on dp x TP on tp."""
    return _llama_run((2, world // 2))


def hf_trainer(rank: int, world: int) -> dict:
    """g. Hugging Face Trainer with ``torch_compile=True, torch_compile_backend="neuron"`` (run
    under torchrun): accelerate wraps the model in DDP and compiles the wrapper."""
    import tempfile

    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    config = LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=16,
    )  # fmt: skip
    g = torch.Generator().manual_seed(7)  # the same dataset on every rank: the sampler splits it
    data = [
        {"input_ids": t, "labels": t}
        for t in torch.randint(0, 64, (4 * world * STEPS, 8), generator=g)
    ]

    def run(compile_: bool, out: str) -> tuple[list[float], nn.Module]:
        model = seeded(lambda: LlamaForCausalLM(config))
        args = TrainingArguments(
            output_dir=out, per_device_train_batch_size=4, max_steps=STEPS, learning_rate=1e-2,
            lr_scheduler_type="constant", logging_steps=1, save_strategy="no", report_to=[],
            use_cpu=True, seed=0, ddp_backend="gloo", disable_tqdm=True,
            dataloader_num_workers=0,
            # a backend alone turns torch_compile on: the eager run must not name one
            **({"torch_compile": True, "torch_compile_backend": "neuron"} if compile_ else {}),
        )  # fmt: skip
        trainer = Trainer(model=model, args=args, train_dataset=data)
        trainer.train()
        return [e["loss"] for e in trainer.state.log_history if "loss" in e], model

    with tempfile.TemporaryDirectory() as out:
        losses, eager = run(False, out)
        (compiled_losses, compiled), info = compiled_run(lambda: run(True, out))
    return {"eager": losses, "compiled": compiled_losses, **info, **max_diff(compiled, eager)}


SETTINGS = {
    f.__name__: f
    for f in (
        ddp_optimizer,
        ddp_python_reducer,
        fsdp2_blocks,
        fsdp2_compiled_autograd,
        simple_fsdp_mlp,
        simple_fsdp_uneven,
        tensor_parallel,
        tp_simple_fsdp_2d,
        hf_trainer,
    )
}


def main(setting: str) -> None:
    dist.init_process_group("gloo")  # env:// from the launcher (RANK, WORLD_SIZE, MASTER_*)
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        with contextlib.redirect_stdout(sys.stderr):  # stdout carries only the JSON line
            result = SETTINGS[setting](rank, world)
        line = json.dumps({"rank": rank, "world": world, "setting": setting, **result})
        # One write per line: under torchrun all ranks share one stdout, and print() writes the
        # text and its newline separately, so two ranks' lines could interleave.
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
    # Everything this rank had to say is written: leave without finalizing the interpreter. A
    # gloo worker thread may still be dropping its reference to a finished all-reduce, whose
    # ThreadLocalState holds Python objects: decref'd while the interpreter finalizes, taking
    # the GIL ends that thread inside a noexcept destructor and std::terminate aborts the rank
    # ("terminate called without an active exception", rc -6). Plain eager DDP without
    # torch.compile does it too, in about one run of three on a loaded 2-core machine (PyTorch's
    # own race: pytorch/pytorch#190489).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
