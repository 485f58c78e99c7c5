"""The executor's XLA CPU settings: every module compiles through the classic emitters at LLVM
-O1 (about twice as fast to compile as XLA's defaults), and gets the same numbers as with XLA's
defaults up to rounding."""

from __future__ import annotations

import pytest
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


def test_every_module_compiles_with_classic_emitters_at_o1() -> None:
    default = _settings(xla_client.CompileOptions())
    tuned = _settings(xla_cpu.compile_options(xla_client.CompileOptions()))
    assert tuned == (1, [("xla_cpu_use_fusion_emitters", False)])
    assert tuned != default


@pytest.mark.parametrize(
    "fn, shapes",
    [(_conv, [(4, 8, 16, 16), (16, 8, 3, 3)]), (_matmul, [(32, 64), (64, 48)])],
    ids=["conv", "matmul"],
)
def test_our_settings_and_xlas_defaults_give_the_same_numbers(fn, shapes) -> None:
    torch.manual_seed(0)
    args = [torch.randn(s) for s in shapes]
    art = _artifact(fn, *args)
    backend, _, devices, _ = xla_cpu._client()
    importer = xla_cpu._importer()
    results = []
    for options in (
        xla_client.CompileOptions(),
        xla_cpu.compile_options(xla_client.CompileOptions()),
    ):
        exe = backend.compile_and_load(art, devices, options)
        (out,) = exe.execute([importer(a) for a in args])
        results.append(xla_cpu.to_torch(out).clone())
    torch.testing.assert_close(results[0], results[1], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(results[1], fn(*args), rtol=1e-5, atol=1e-5)
