"""The executor's per-module XLA CPU settings: modules with convolutions compile through the
classic emitters at LLVM -O1 (twice as fast to compile), every other module with XLA's defaults;
both settings give the same numbers on the same module."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from jaxlib import xla_client

from neuron_compile.artifact import serialize
from neuron_compile.runtime import xla_cpu
from tests.helpers import lower_to_text


def _conv(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.gelu(F.conv2d(x, w, stride=2, padding=1)).sum(dim=1)


def _matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.gelu(a @ b)


def _artifact(fn, *args) -> bytes:
    return serialize(lower_to_text(fn, *args, pretty=False), "portable")


def _settings(options: xla_client.CompileOptions) -> tuple[int, list]:
    level = options.executable_build_options.debug_options.xla_backend_optimization_level
    return level, list(options.env_option_overrides)


def test_convolution_modules_compile_with_classic_emitters_at_o1() -> None:
    conv = _artifact(_conv, torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3))
    matmul = _artifact(_matmul, torch.randn(4, 8), torch.randn(8, 4))
    default = _settings(xla_client.CompileOptions())
    tuned = _settings(xla_cpu.compile_options(xla_client.CompileOptions(), conv))
    assert tuned == (1, [("xla_cpu_use_fusion_emitters", False)])
    assert _settings(xla_cpu.compile_options(xla_client.CompileOptions(), matmul)) == default
    assert tuned != default


def test_both_settings_give_the_same_numbers() -> None:
    torch.manual_seed(0)
    x, w = torch.randn(4, 8, 16, 16), torch.randn(16, 8, 3, 3)
    art = _artifact(_conv, x, w)
    backend, _, devices, _ = xla_cpu._client()
    importer = xla_cpu._importer()
    results = []
    for options in (
        xla_client.CompileOptions(),
        xla_cpu.compile_options(xla_client.CompileOptions(), art),
    ):
        exe = backend.compile_and_load(art, devices, options)
        (out,) = exe.execute([importer(x), importer(w)])
        results.append(xla_cpu.to_torch(out).clone())
    torch.testing.assert_close(results[0], results[1], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(results[1], _conv(x, w), rtol=1e-5, atol=1e-5)
