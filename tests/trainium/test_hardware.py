"""On a Trainium host only (``@pytest.mark.neuron``; tests/conftest.py skips these elsewhere):
the real neuronx-cc and Neuron runtime, NEFFs executed on the device, numerics vs the CPU."""

from __future__ import annotations

import copy

import pytest
import torch
from train_gpt import GPTConfig, TinyGPT
from train_mlp import MLP

import neuron_compile
from neuron_compile.targets import detect_target
from neuron_compile.trainium import runtime as neuron_rt

pytestmark = pytest.mark.neuron


def test_device_and_runtime_are_detected():
    assert neuron_rt.available()
    assert detect_target() in ("trn2", "trn3")


def test_mlp_forward_and_backward_on_device_match_cpu():
    torch.manual_seed(0)
    model, x = MLP(), torch.randn(32, 32)
    cpu = copy.deepcopy(model)
    out = torch.compile(model, backend="neuron")(x)  # target auto -> the device
    ref = torch.compile(cpu, backend="neuron", options={"target": "cpu"})(x)
    torch.testing.assert_close(out, ref, rtol=2e-2, atol=2e-3)  # device matmuls may round bf16
    out.square().mean().backward()
    ref.square().mean().backward()
    for p, q in zip(model.parameters(), cpu.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=2e-2, atol=2e-3)


def test_gpt_training_steps_run_on_device_with_weights_resident():
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=1)
    model = TinyGPT(cfg)
    compiled = torch.compile(model, backend="neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    idx = torch.randint(0, cfg.vocab_size, (4, cfg.block_size))
    losses = []
    for _ in range(3):
        opt.zero_grad()
        loss = compiled(idx, idx)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    assert {r.kind for r in neuron_compile.metrics()} >= {"forward", "backward"}
