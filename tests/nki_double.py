"""A TEST DOUBLE of the ``nki`` package (the real one exists only on Trainium hosts).

Not AWS's NKI: it implements just the beta-3 surface ``neuron_compile.trainium.kernels.nki._kernel_config`` uses
(``nki.jit``, ``nki.compiler.ncc_driver.CompileOptions``,
``nki.framework.compiled.compile_kernel_to_nir(...).build_config()``), records every call, and
answers with a fixed base64 JSON ``backend_config`` so tests can assert it is passed through
verbatim. Install it with :func:`install` (``sys.modules`` entries, undone by ``monkeypatch``).

:func:`install_flash_kernels` adds DOUBLES of the bundled flash kernels
``neuronxcc.nki.kernels.attention.flash_fwd`` / ``flash_attn_bwd`` (plus ``FlashConfig`` and
``neuronxcc.nki.language.nc``). They never compute anything: "tracing" one checks the arguments
against the documented interface, the way the real kernels' own asserts do, and yields the
documented output shapes; their ``backend_config`` names the kernel and its launch grid.
Documented interface (SDK ``nki.kernels.flash_fwd`` / ``nki.kernels.flash_attn_bwd`` API pages
and ``aws-neuron/nki-samples`` ``src/nki_samples/reference/attention.py``):

- ``flash_fwd[b, h](q, k, v, seed, logit_bias=None, softmax_scale=None, use_causal_mask=True,
  mixed_precision=True, dropout_p=0.0, config=None)``: q (b, h, d, seq_q), k (b, kh, d, seq_k),
  v (b, kh, seq_k, d) unless ``config.should_transpose_v``, seed (1,); returns
  o (b, h, seq_q, d) and, if ``config.training``, lse (b, h, 128, seq_q // 128);
- ``flash_attn_bwd[b, h](q_ref, k_ref, v_ref, o_ref, dy_ref, lse_ref, seed_ref,
  logit_bias_ref=None, use_causal_mask=False, mixed_precision=False, dropout_p=0.0,
  softmax_scale=None)``: every tensor (b, h, d, seq) except lse (b, h, 128, seq_q // 128) and
  seed (1,); returns dq, dk, dv as (b, h, d, seq) in q's dtype.
"""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import pytest

VERSION = "0.7.0+double"
BACKEND_CONFIG = base64.b64encode(
    json.dumps({"func_name": "double_kernel", "kernel_format": "bir", "double": True}).encode()
).decode()


@dataclass
class CompileOptions:
    target: str | None
    lnc: int
    artifacts_dir: str
    output_path: str


class NkiDouble:
    """The installed double: ``calls`` holds ``(kernel, inputs, compile_opts)`` per compile."""

    def __init__(self, version: str) -> None:
        self.calls: list[tuple[Any, dict[str, Any], CompileOptions]] = []
        self.version = version

    def compile_kernel_to_nir(
        self,
        kernel: Any,
        *,
        inputs: dict[str, Any],
        compile_opts: CompileOptions,
        enable_cache: bool,
    ) -> Any:
        self.calls.append((kernel, inputs, compile_opts))
        if isinstance(kernel, Launch):  # a kernel double with a documented contract
            outputs = kernel.kernel.trace(inputs, kernel.grid)
            backend_config = _config_b64(
                kernel.kernel.__name__, kernel.grid, compile_opts.artifacts_dir
            )
        else:
            # Like the real thing, output specs come from tracing the kernel: here its
            # reference semantics are "same shape/dtype as the first tensor input".
            first = next(v for v in inputs.values() if isinstance(v, np.ndarray))
            outputs = [(first.shape, first.dtype)]
            backend_config = BACKEND_CONFIG
        config = SimpleNamespace(
            backend_config_b64=backend_config,
            output_specs=[SimpleNamespace(shape=shape, dtype=dtype) for shape, dtype in outputs],
            has_collectives=False,
            operand_output_aliases={},
        )
        return SimpleNamespace(build_config=lambda: config, is_tuple_return=len(outputs) > 1)


def install(monkeypatch: pytest.MonkeyPatch, version: str = VERSION) -> NkiDouble:
    double = NkiDouble(version)
    nki = ModuleType("nki")
    nki.__version__ = version
    nki.jit = lambda fn: fn
    compiler, driver = ModuleType("nki.compiler"), ModuleType("nki.compiler.ncc_driver")
    framework, compiled = ModuleType("nki.framework"), ModuleType("nki.framework.compiled")
    driver.CompileOptions = CompileOptions
    compiled.compile_kernel_to_nir = double.compile_kernel_to_nir
    nki.compiler, compiler.ncc_driver = compiler, driver
    nki.framework, framework.compiled = framework, compiled
    for mod in (nki, compiler, driver, framework, compiled):
        monkeypatch.setitem(sys.modules, mod.__name__, mod)
    return double


# ---- the bundled flash kernels ----------------------------------------------------------------
PMAX = 128  # nl.tile_size.pmax


def _config_b64(func_name: str, grid: tuple[Any, ...], artifacts_dir: str) -> str:
    # Like the real config, it points at the specialisation's artifact
    # (docs/trainium-reference.md §R9), so two specialisations never share a config (nor a
    # compile-cache entry).
    config = {
        "func_name": func_name,
        "grid": [repr(g) for g in grid],
        "klir_binary": {"binary": artifacts_dir},
        "double": True,
    }
    return base64.b64encode(json.dumps(config).encode()).decode()


def decode_backend_config(b64: str) -> dict[str, Any]:
    return json.loads(base64.b64decode(b64))


@dataclass(frozen=True)
class NcDim:
    """``nl.nc(lnc) * n``: a launch-grid axis of ``lnc * n`` programs sharded over ``lnc``
    physical cores."""

    lnc: int
    count: int = 1

    def __mul__(self, n: int) -> NcDim:
        return NcDim(self.lnc, self.count * n)

    __rmul__ = __mul__

    @property
    def size(self) -> int:
        return self.lnc * self.count

    def __repr__(self) -> str:
        return f"nc({self.lnc})*{self.count}"


def _grid_size(axis: Any) -> int:
    return axis.size if isinstance(axis, NcDim) else int(axis)


@dataclass(frozen=True)
class FlashConfig:
    """Fields and defaults as documented (``nki.kernels.attention.FlashConfig``)."""

    seq_tile_size: int = 2048
    attn_core_tile_size: int = 256
    training: bool = True
    should_transpose_v: bool = False
    lse_dtype: str = ""


@dataclass(frozen=True)
class Launch:
    kernel: Any
    grid: tuple[Any, ...]


class _KernelDouble:
    """``kernel[grid]`` launches; calling one off-device is a bug in the code under test."""

    __name__ = "kernel"
    params: tuple[str, ...] = ()
    required: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.traced: list[tuple[dict[str, Any], tuple[Any, ...]]] = []

    def __getitem__(self, grid: Any) -> Launch:
        return Launch(self, grid if isinstance(grid, tuple) else (grid,))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"{self.__name__} must never run off-device")

    def trace(self, inputs: dict[str, Any], grid: tuple[Any, ...]) -> list[tuple[Any, Any]]:
        unknown = set(inputs) - set(self.params)
        assert not unknown, f"{self.__name__} has no parameters {sorted(unknown)}"
        missing = [p for p in self.required if p not in inputs]
        assert not missing, f"{self.__name__} misses arguments {missing}"
        # the operands are the tensors in parameter order: the caller must bind them so
        assert list(inputs) == [p for p in self.params if p in inputs], (
            f"{self.__name__} arguments out of parameter order: {list(inputs)}"
        )
        assert len(grid) == 2, f"expect an SPMD grid with 2 dimensions, got {grid}"
        self.traced.append((inputs, grid))
        return self.contract(inputs, grid)

    def contract(self, inputs: dict[str, Any], grid: tuple[Any, ...]) -> list[tuple[Any, Any]]:
        """The kernel's documented checks and output (shape, dtype) list: each subclass (the
        forward and backward doubles below) has its own."""
        raise NotImplementedError(f"{type(self).__name__} must define its kernel's contract")


def _seed_ok(seed: Any) -> None:
    assert isinstance(seed, np.ndarray) and seed.shape == (1,), f"seed shape {seed.shape}"
    assert seed.dtype == np.int32, f"seed dtype {seed.dtype}"


class FlashFwdDouble(_KernelDouble):
    __name__ = "flash_fwd"
    params = (
        "q", "k", "v", "seed", "logit_bias", "softmax_scale", "use_causal_mask",
        "mixed_precision", "dropout_p", "config",
    )  # fmt: skip
    required = ("q", "k", "v", "seed")

    def contract(self, inputs: dict[str, Any], grid: tuple[Any, ...]) -> list[tuple[Any, Any]]:
        q, k, v = inputs["q"], inputs["k"], inputs["v"]
        config = inputs.get("config") or FlashConfig()
        b, h, d, seq_q = q.shape
        _, kh, _, seq_k = k.shape
        assert k.shape == (b, kh, d, seq_k), f"k shape {k.shape}"
        want_v = (b, kh, d, seq_k) if config.should_transpose_v else (b, kh, seq_k, d)
        assert v.shape == want_v, f"v shape {v.shape}, expected {want_v}"
        assert q.dtype == k.dtype == v.dtype, "all IO tensors have one dtype"
        assert d <= 128, f"head dim {d} > 128"
        assert seq_q % PMAX == 0, f"seq_q {seq_q} not a multiple of {PMAX}"
        assert config.seq_tile_size >= 512, f"seq_tile_size {config.seq_tile_size} < 512"
        assert seq_k % config.seq_tile_size == 0, f"seq_k {seq_k} % {config.seq_tile_size}"
        assert inputs.get("dropout_p", 0.0) == 0.0 or config.training
        _seed_ok(inputs["seed"])
        assert _grid_size(grid[0]) == b and _grid_size(grid[1]) == kh, f"grid {grid}"
        o = ((b, h, seq_q, d), q.dtype)
        if not config.training:
            return [o]
        mixed = inputs.get("mixed_precision", True)
        lse_dtype = np.dtype(np.float32) if mixed else q.dtype
        if config.lse_dtype:
            lse_dtype = np.dtype(config.lse_dtype)
        return [o, ((b, h, PMAX, seq_q // PMAX), lse_dtype)]


class FlashBwdDouble(_KernelDouble):
    __name__ = "flash_attn_bwd"
    params = (
        "q_ref", "k_ref", "v_ref", "o_ref", "dy_ref", "lse_ref", "seed_ref", "logit_bias_ref",
        "use_causal_mask", "mixed_precision", "dropout_p", "softmax_scale",
    )  # fmt: skip
    required = ("q_ref", "k_ref", "v_ref", "o_ref", "dy_ref", "lse_ref", "seed_ref")

    def contract(self, inputs: dict[str, Any], grid: tuple[Any, ...]) -> list[tuple[Any, Any]]:
        q = inputs["q_ref"]
        b, h, d, seq_q = q.shape
        seq_k = inputs["k_ref"].shape[-1]
        for name, seq in (("k_ref", seq_k), ("v_ref", seq_k), ("o_ref", seq_q), ("dy_ref", seq_q)):
            x = inputs[name]
            assert x.shape == (b, h, d, seq), f"{name} shape {x.shape}"
            assert x.dtype == q.dtype, f"{name} dtype {x.dtype} != {q.dtype}"
        lse = inputs["lse_ref"]
        assert lse.shape == (b, h, PMAX, seq_q // PMAX), f"lse_ref shape {lse.shape}"
        assert seq_q % 128 == 0 and seq_k % 128 == 0, f"sequence lengths {seq_q}/{seq_k}"
        _seed_ok(inputs["seed_ref"])
        assert _grid_size(grid[0]) == b and _grid_size(grid[1]) == h, f"grid {grid}"
        return [
            ((b, h, d, seq_q), q.dtype),
            ((b, h, d, seq_k), q.dtype),
            ((b, h, d, seq_k), q.dtype),
        ]


def install_flash_kernels(
    monkeypatch: pytest.MonkeyPatch, *, fwd: Callable[[], _KernelDouble] = FlashFwdDouble
) -> SimpleNamespace:
    """Install ``neuronxcc.nki.kernels.attention`` and ``neuronxcc.nki.language`` doubles;
    return the kernel doubles (``.flash_fwd``, ``.flash_attn_bwd``)."""
    kernels = SimpleNamespace(flash_fwd=fwd(), flash_attn_bwd=FlashBwdDouble())
    root, nki = ModuleType("neuronxcc"), ModuleType("neuronxcc.nki")
    kernels_mod = ModuleType("neuronxcc.nki.kernels")
    attention = ModuleType("neuronxcc.nki.kernels.attention")
    language = ModuleType("neuronxcc.nki.language")
    attention.flash_fwd, attention.flash_attn_bwd = kernels.flash_fwd, kernels.flash_attn_bwd
    attention.FlashConfig = FlashConfig
    language.nc = NcDim
    language.tile_size = SimpleNamespace(pmax=PMAX)
    root.nki, nki.kernels, nki.language, kernels_mod.attention = (
        nki,
        kernels_mod,
        language,
        attention,
    )
    for mod in (root, nki, kernels_mod, attention, language):
        monkeypatch.setitem(sys.modules, mod.__name__, mod)
    return kernels
