"""examples/train_gpt.py's TinyGPT: compiled forward, gradients and training match eager; the
backward graph has no fused CPU attention kernel; the dump directory is complete."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from train_gpt import GPTConfig, TinyGPT, make_batches, train

import neuron_compile
from tests.parity import (
    assert_grads_close,
    assert_low_precision_grads,
    forward_backward,
    graph_kinds,
)

F32_TOL = {"rtol": 1e-4, "atol": 1e-5}
CFG = GPTConfig()
SDPA_CPU_BACKWARD = "_scaled_dot_product_flash_attention_for_cpu_backward"


@pytest.fixture
def model() -> TinyGPT:
    torch.manual_seed(0)
    return TinyGPT(CFG)


@pytest.fixture
def batch() -> tuple[torch.Tensor, torch.Tensor]:
    return make_batches(CFG, 1, batch=4)[0]


def _logits_loss(targets: torch.Tensor):
    def loss(logits: torch.Tensor) -> torch.Tensor:
        flat = logits.float().reshape(-1, CFG.vocab_size)
        return torch.nn.functional.cross_entropy(flat, targets.reshape(-1))

    return loss


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_forward_and_every_gradient_match_eager(tied, batch):
    torch.manual_seed(0)
    model = TinyGPT(GPTConfig(tie_weights=tied))
    idx, targets = batch
    logits, grads = forward_backward(model, (idx,), _logits_loss(targets), backend="neuron")
    ref_logits, ref_grads = forward_backward(model, (idx,), _logits_loss(targets), backend=None)
    torch.testing.assert_close(logits, ref_logits, **F32_TOL)
    assert_grads_close(grads, ref_grads, **F32_TOL)
    assert ("lm_head.weight" in grads) is not tied  # tied: one shared parameter, both paths' grads


def test_in_graph_loss_and_gradients_match_eager(model, batch):
    idx, targets = batch
    loss, grads = forward_backward(model, (idx, targets), lambda loss: loss, backend="neuron")
    ref_loss, ref_grads = forward_backward(model, (idx, targets), lambda loss: loss, backend=None)
    torch.testing.assert_close(loss, ref_loss, **F32_TOL)
    assert_grads_close(grads, ref_grads, **F32_TOL)


def test_twenty_adamw_steps_match_eager(model):
    batches = make_batches(CFG, 20, batch=4, seed=1)
    compiled = train(copy.deepcopy(model), batches, backend="neuron")
    eager = train(copy.deepcopy(model), batches, backend=None)
    torch.testing.assert_close(torch.tensor(compiled), torch.tensor(eager), rtol=1e-4, atol=0)
    # The steps changed the model (losses differ from the untrained model's), so agreement over
    # them is not vacuous.
    with torch.no_grad():
        frozen = [model(idx, targets).item() for idx, targets in batches]
    assert max(abs(a - b) for a, b in zip(eager[1:], frozen[1:], strict=True)) > 1e-2


def test_bfloat16_forward_and_gradients(model, batch):
    idx, targets = batch
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    logits, grads = forward_backward(bf16, (idx,), _logits_loss(targets), backend="neuron")
    ref_logits, ref_grads = forward_backward(bf16, (idx,), _logits_loss(targets), backend=None)
    _, f32_grads = forward_backward(model, (idx,), _logits_loss(targets), backend=None)
    assert logits.dtype == torch.bfloat16
    torch.testing.assert_close(logits, ref_logits, rtol=2e-2, atol=2e-2)
    assert_low_precision_grads(grads, ref_grads, f32_grads)


def test_no_grad_compiles_one_inference_graph(model, batch):
    idx, _ = batch
    compiled = torch.compile(model, backend="neuron")
    with torch.no_grad():
        logits = compiled(idx)
    assert graph_kinds() == ["inference"]
    assert not logits.requires_grad
    torch.testing.assert_close(logits, model(idx).detach(), **F32_TOL)


def test_backward_graph_is_compiled_lazily(model, batch):
    idx, targets = batch
    loss = torch.compile(model, backend="neuron")(idx, targets)
    assert graph_kinds() == ["forward"]
    loss.backward()
    assert graph_kinds() == ["forward", "backward"]


def _graph_dirs(root: Path, kind: str) -> list[Path]:
    return sorted(p.parent for p in root.glob(f"*_{kind}_*/meta.json"))


def test_attention_is_eagers_cpu_flash_op_compiled_and_dumps_are_complete(model, batch, tmp_path):
    idx, targets = batch
    compiled = torch.compile(
        model, backend="neuron", options={"dump_dir": str(tmp_path), "fallback": "error"}
    )
    compiled(idx, targets).backward()

    (fw_dir,) = _graph_dirs(tmp_path, "forward")
    (bw_dir,) = _graph_dirs(tmp_path, "backward")
    # Eager's own SDPA choice on CPU, one op per layer each way, lowered whole (no fallback).
    forward_op = SDPA_CPU_BACKWARD.removesuffix("_backward")
    fw_code = (fw_dir / "graph.fx.py").read_text()
    assert fw_code.count(f"aten.{forward_op}.default(") == CFG.n_layer
    bw_code = (bw_dir / "graph.fx.py").read_text()
    assert bw_code.count(f"aten.{SDPA_CPU_BACKWARD}.default(") == CFG.n_layer

    expected = {"graph.fx.py", "module.stablehlo.mlir", "module.portable.mlirbc", "meta.json"}
    for d in (fw_dir, bw_dir):
        assert expected <= {p.name for p in d.iterdir()}, d
        assert "stablehlo." in (d / "module.stablehlo.mlir").read_text()
        assert (d / "module.portable.mlirbc").read_bytes()[:4] == b"ML\xefR"
        meta = json.loads((d / "meta.json").read_text())
        assert meta["inputs"] and all("shape" in s and "dtype" in s for s in meta["inputs"])
        assert meta["timings"]["lowering_s"] > 0
        # An identical graph compiled earlier in this process reuses its executable.
        timings = meta["timings"]
        assert timings["cache_source"] == "memory" or timings["executor_compile_s"] > 0
        assert len(timings["cache_key"]) == 64
        assert {"torch", "jaxlib", "stablehlo"} <= meta["versions"].keys()
        assert meta["versions"]["torch"] == torch.__version__

    records = {r.kind: r for r in neuron_compile.metrics()}
    assert fw_dir.name == records["forward"].name
    assert bw_dir.name == records["backward"].name
