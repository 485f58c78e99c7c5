"""The executor's XLA CPU settings: every module compiles through the classic emitters at LLVM
-O1 (about twice as fast to compile as XLA's defaults) into four LLVM modules, without XLA's
algebraic simplifier (``test_as_written.py``), and gets the same numbers as with XLA's defaults
up to rounding; the split alone changes no bit."""

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


def test_every_module_compiles_with_classic_emitters_at_o1_in_four_parts() -> None:
    default = _settings(xla_client.CompileOptions())
    tuned = _settings(xla_cpu.compile_options(xla_client.CompileOptions()))
    assert tuned == (
        1,
        [("xla_cpu_use_fusion_emitters", False), ("xla_cpu_parallel_codegen_split_count", 4)],
    )
    debug = xla_cpu.compile_options(xla_client.CompileOptions()).executable_build_options
    assert debug.debug_options.xla_disable_hlo_passes == "algsimp"
    assert tuned != default


def test_passes_the_caller_disabled_stay_disabled() -> None:
    """The distributed client disables the pass that drops its collectives' barriers; ours are
    added to it. Replaced, the barriers went and two ranks paired their collectives crosswise
    (``tests/distributed/test_collectives.py``)."""
    options = xla_client.CompileOptions()
    options.executable_build_options.debug_options.xla_disable_hlo_passes = "cse_barrier_expander"
    debug = xla_cpu.compile_options(options).executable_build_options.debug_options
    assert debug.xla_disable_hlo_passes.split(",") == ["cse_barrier_expander", "algsimp"]
    assert all(name != "xla_disable_hlo_passes" for name, _ in options.env_option_overrides)


def _reductions(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Eight reductions XLA cannot fuse with one another: kernels for more than four modules."""
    return (
        x.sum(0),
        x.exp().sum(1),
        x.amax(0),
        torch.tanh(x).mean(1),
        x.softmax(1),
        torch.erf(x).sum(0),
        (x * x).sum(1).rsqrt(),
        x.logsumexp(0),
    )


def _run(art: bytes, args: list[torch.Tensor], options: xla_client.CompileOptions) -> list:
    backend, _, devices, _ = xla_cpu._client()
    importer = xla_cpu._importer()
    outs = backend.compile_and_load(art, devices, options).execute([importer(a) for a in args])
    return [xla_cpu.to_torch(o).clone() for o in outs]


def test_the_codegen_split_changes_no_bit() -> None:
    """XLA's default split (32 modules) and ours (4) compile the same kernels: same bits."""
    torch.manual_seed(0)
    args = [torch.randn(64, 48)]
    art = _artifact(_reductions, *args)
    ours = xla_cpu.compile_options(xla_client.CompileOptions())
    xla_split = xla_cpu.compile_options(xla_client.CompileOptions())
    xla_split.env_option_overrides = [
        (name, 32 if name == "xla_cpu_parallel_codegen_split_count" else value)
        for name, value in ours.env_option_overrides
    ]
    a, b = _run(art, args, ours), _run(art, args, xla_split)
    assert len(a) == 8 and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize(
    "fn, shapes",
    [(_conv, [(4, 8, 16, 16), (16, 8, 3, 3)]), (_matmul, [(32, 64), (64, 48)])],
    ids=["conv", "matmul"],
)
def test_our_settings_and_xlas_defaults_give_the_same_numbers(fn, shapes) -> None:
    torch.manual_seed(0)
    args = [torch.randn(s) for s in shapes]
    art = _artifact(fn, *args)
    results = [
        _run(art, args, options)[0]
        for options in (
            xla_client.CompileOptions(),
            xla_cpu.compile_options(xla_client.CompileOptions()),
        )
    ]
    torch.testing.assert_close(results[0], results[1], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(results[1], fn(*args), rtol=1e-5, atol=1e-5)
