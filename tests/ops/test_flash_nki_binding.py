"""The trn binding of ``flash_attention`` / ``flash_attention_backward`` to the bundled NKI flash
kernels, checked against TEST DOUBLES of the toolchain and the kernels (``tests/nki_double.py``):
operands and results in the documented layouts, the launch grid, the fallbacks, and CPU numerics.
"""

from __future__ import annotations

import logging
import re
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.testing import FileCheck

from neuron_compile import artifact
from neuron_compile.errors import LoweringError
from neuron_compile.lowering.emit import Emitter, TensorType
from neuron_compile.runtime.xla_cpu import XlaCpuExecutable
from neuron_compile.trainium import lowering as neuron_calls
from neuron_compile.trainium.kernels import nki as nki_mod
from neuron_compile.trainium.kernels.nki import NkiFallbackWarning
from tests import nki_double

pytestmark = pytest.mark.filterwarnings("ignore:neuron-compile. target trn2 without neuronx-cc")

HEAD_DIM = 64
CALL = "AwsNeuronCustomNativeKernel"


@pytest.fixture(autouse=True)
def _fresh_state(monkeypatch):
    monkeypatch.setattr(nki_mod, "_WARNED", set())
    monkeypatch.setattr(nki_mod, "_CONFIGS", {})
    monkeypatch.setattr(neuron_calls, "_SKIPPED", set())


@pytest.fixture
def toolchain(monkeypatch):
    """The nki toolchain double with the flash kernel doubles."""
    double = nki_double.install(monkeypatch)
    return double, nki_double.install_flash_kernels(monkeypatch)


class _Attention(torch.nn.Module):
    """Two heads of HEAD_DIM: the SDPA call qualifies for the flash op on trn targets."""

    def __init__(self, causal: bool, heads: int = 2) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.qkv = torch.nn.Linear(heads * HEAD_DIM, 3 * heads * HEAD_DIM)
        self.heads, self.causal = heads, causal

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (
            z.view(b, t, self.heads, HEAD_DIM).transpose(1, 2) for z in self.qkv(x).split(d, -1)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return y.transpose(1, 2).reshape(b, t, d)


def _train_step(model, x, **options):
    torch._dynamo.reset()  # a new compile per options, not a recompile of the same frame
    model.zero_grad()
    step = torch.compile(model, backend="neuron_compile", options=options) if options else model
    loss = step(x).square().sum()
    loss.backward()
    return loss.detach(), model.qkv.weight.grad.clone()


def _compile_trn2_and_check_numerics(tmp_path: Path, causal: bool, seq: int) -> None:
    model, x = _Attention(causal), torch.randn(2, seq, 2 * HEAD_DIM)
    ref_loss, ref_grad = _train_step(model, x)  # eager
    loss, grad = _train_step(model, x, target="trn2", dump_dir=str(tmp_path))
    # What runs here is the XLA CPU stand-in of the trn graph: the references, as on cpu.
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-4, atol=1e-3)


def _module(dump: Path, kind: str) -> str:
    (text,) = [p.read_text() for p in dump.glob(f"*_{kind}_*/module.stablehlo.mlir")]
    return text


def _calls(text: str) -> list[tuple[str, str, dict]]:
    """(operand types, result types, decoded backend_config) of each NKI custom call."""
    found = []
    for line in text.splitlines():
        if f"custom_call @{CALL}(" not in line:  # the dump is MLIR's pretty form
            continue
        config = re.search(r'backend_config = "([^"]*)"', line).group(1)
        types = re.search(r":\s*\(([^)]*)\)\s*->\s*\(?(.*?)\)?$", line.strip())
        found.append((types.group(1), types.group(2), nki_double.decode_backend_config(config)))
    return found


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_trn2_forward_and_backward_call_the_nki_flash_kernels(tmp_path, toolchain, causal):
    double, kernels = toolchain
    with warnings.catch_warnings():
        warnings.simplefilter("error", NkiFallbackWarning)
        _compile_trn2_and_check_numerics(tmp_path, causal, seq=512)

    # The kernels were specialised with the documented arguments, in parameter order.
    ((fwd_in, fwd_grid),) = kernels.flash_fwd.traced
    assert list(fwd_in) == [
        "q", "k", "v", "seed", "softmax_scale", "use_causal_mask", "mixed_precision",
        "dropout_p", "config",
    ]  # fmt: skip
    assert fwd_in["q"].shape == fwd_in["k"].shape == (2, 2, HEAD_DIM, 512)  # (b, h, d, seq)
    assert fwd_in["v"].shape == (2, 2, 512, HEAD_DIM)  # (b, h, seq, d)
    assert fwd_in["seed"].shape == (1,) and fwd_in["seed"].dtype == np.int32
    assert fwd_in["use_causal_mask"] is causal and fwd_in["dropout_p"] == 0.0
    assert fwd_in["softmax_scale"] == pytest.approx(HEAD_DIM**-0.5)
    assert fwd_in["mixed_precision"] is False  # float32 inputs keep float32 matmuls
    assert fwd_in["config"] == nki_double.FlashConfig(seq_tile_size=512, training=True)
    # trn2 defaults to LNC 2: heads sharded over both physical cores, as callers launch it
    assert fwd_grid == (2, nki_double.NcDim(2, 1))
    ((bwd_in, bwd_grid),) = kernels.flash_attn_bwd.traced
    assert list(bwd_in)[:7] == ["q_ref", "k_ref", "v_ref", "o_ref", "dy_ref", "lse_ref", "seed_ref"]
    assert bwd_in["use_causal_mask"] is causal
    assert bwd_in["lse_ref"].shape == (2, 2, 128, 4) and bwd_in["lse_ref"].dtype == np.float32
    assert bwd_grid == (2, nki_double.NcDim(2, 1))
    assert {opts.target for _, _, opts in double.calls} == {"trn2"}

    # The modules for neuronx-cc: one kernel call each, layouts adapted in plain StableHLO.
    fwd = _module(tmp_path, "forward")
    ((operands, results, config),) = _calls(fwd)
    x, t = "tensor<2x2x64x512xf32>", "tensor<2x2x512x64xf32>"
    assert operands == f"{x}, {x}, {t}, tensor<1xi32>"
    assert results == f"{t}, tensor<2x2x128x4xf32>"
    assert config["func_name"] == "flash_fwd" and config["grid"] == ["2", "nc(2)*1"]
    FileCheck().check("stablehlo.transpose").check(CALL).check("stablehlo.transpose").run(fwd)
    assert "stablehlo.exponential" not in fwd  # the reference is not lowered as well
    bwd = _module(tmp_path, "backward")
    ((operands, results, config),) = _calls(bwd)
    assert operands == ", ".join([x] * 5 + ["tensor<2x2x128x4xf32>", "tensor<1xi32>"])
    assert results == ", ".join([x] * 3)
    assert config["func_name"] == "flash_attn_bwd" and config["grid"] == ["2", "nc(2)*1"]
    assert "stablehlo.exponential" not in bwd


def test_seq_128_keeps_the_reference_forward_and_binds_the_backward(tmp_path, toolchain, caplog):
    # flash_fwd tiles seq_k by FlashConfig.seq_tile_size (>= 512): seq 128 is outside its
    # documented limits, while flash_attn_bwd takes any multiple of 128.
    _, kernels = toolchain
    with caplog.at_level(logging.INFO, logger=neuron_calls.__name__):
        _compile_trn2_and_check_numerics(tmp_path, causal=True, seq=128)
    assert not kernels.flash_fwd.traced
    assert "seq_k 128 is not a multiple of a kv tile size" in caplog.text
    fwd = _module(tmp_path, "forward")
    assert CALL not in fwd and "stablehlo.exponential" in fwd
    ((operands, results, config),) = _calls(_module(tmp_path, "backward"))
    x = "tensor<2x2x64x128xf32>"
    assert operands == ", ".join([x] * 5 + ["tensor<2x2x128x1xf32>", "tensor<1xi32>"])
    assert config["func_name"] == "flash_attn_bwd"


def test_lnc1_launches_batch_by_heads(tmp_path, toolchain):
    _, kernels = toolchain
    model, x = _Attention(causal=True, heads=3), torch.randn(1, 512, 3 * HEAD_DIM)
    _train_step(model, x, target="trn2", lnc=1, dump_dir=str(tmp_path))
    ((_, grid),) = kernels.flash_fwd.traced
    assert grid == (1, 3)
    ((_, grid),) = kernels.flash_attn_bwd.traced
    assert grid == (1, 3)


def test_without_nki_warns_once_per_op_and_lowers_the_references(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "nki", None)
    with pytest.warns(NkiFallbackWarning) as record:
        _compile_trn2_and_check_numerics(tmp_path, causal=True, seq=512)
    messages = sorted(str(w.message) for w in record if w.category is NkiFallbackWarning)
    assert len(messages) == 2
    assert messages[0].startswith("kernel neuron_compile::flash_attention not used: the nki")
    assert messages[1].startswith("kernel neuron_compile::flash_attention_backward not used")
    for kind in ("forward", "backward"):
        text = _module(tmp_path, kind)
        assert CALL not in text and "stablehlo.exponential" in text


def test_toolchain_without_the_flash_kernels_falls_back_with_the_reason(tmp_path, monkeypatch):
    nki_double.install(monkeypatch)
    monkeypatch.setitem(sys.modules, "neuronxcc", None)  # import neuronxcc... fails
    with pytest.warns(NkiFallbackWarning) as record:
        _compile_trn2_and_check_numerics(tmp_path, causal=False, seq=512)
    messages = sorted(str(w.message) for w in record if w.category is NkiFallbackWarning)
    assert "neuronxcc.nki.kernels.attention:flash_fwd cannot be loaded" in messages[0]
    assert "neuronxcc.nki.kernels.attention:flash_attn_bwd cannot be loaded" in messages[1]
    assert CALL not in _module(tmp_path, "forward") + _module(tmp_path, "backward")


def test_a_kernel_the_toolchain_cannot_specialise_falls_back_with_a_warning(tmp_path, monkeypatch):
    class Untraceable(nki_double.FlashFwdDouble):  # e.g. a legacy-namespace kernel
        def contract(self, inputs, grid):
            raise RuntimeError("cannot trace a neuronxcc.nki kernel")

    nki_double.install(monkeypatch)
    nki_double.install_flash_kernels(monkeypatch, fwd=Untraceable)
    with pytest.warns(
        NkiFallbackWarning, match="flash_fwd could not be specialised .*cannot trace"
    ):
        _compile_trn2_and_check_numerics(tmp_path, causal=True, seq=512)
    fwd = _module(tmp_path, "forward")
    assert CALL not in fwd and "stablehlo.exponential" in fwd
    ((_, _, config),) = _calls(_module(tmp_path, "backward"))
    assert config["func_name"] == "flash_attn_bwd"


def test_a_kernel_whose_outputs_drift_from_the_interface_is_refused(tmp_path, monkeypatch):
    class LseInRowLayout(nki_double.FlashFwdDouble):  # e.g. a release returning (b, h, seq)
        def contract(self, inputs, grid):
            o, (shape, dtype) = super().contract(inputs, grid)
            return [o, (shape[:2] + (shape[2] * shape[3],), dtype)]

    nki_double.install(monkeypatch)
    nki_double.install_flash_kernels(monkeypatch, fwd=LseInRowLayout)
    with pytest.raises(LoweringError, match="disagree on the outputs") as info:
        _compile_trn2_and_check_numerics(tmp_path, causal=True, seq=512)
    assert "kernel returns" in str(info.value) and "(2, 2, 512)" in str(info.value)


def test_the_double_holds_callers_to_the_documented_layouts():
    # q in (b, h, seq, d) instead of (b, h, d, seq): the kernel's own shape check fires
    q = np.empty((1, 2, 512, 64), np.float32)
    k = np.empty((1, 2, 64, 512), np.float32)
    inputs = {"q": q, "k": k, "v": q, "seed": np.ones(1, np.int32)}
    with pytest.raises(AssertionError, match="k shape"):
        nki_double.FlashFwdDouble().trace(inputs, (1, 2))
    cfg = nki_double.FlashConfig(seq_tile_size=512)
    good = {"q": k, "k": k, "v": q, "seed": np.ones(1, np.int32), "config": cfg}
    with pytest.raises(AssertionError, match="grid"):
        nki_double.FlashFwdDouble().trace(good, (1, 4))
    with pytest.raises(AssertionError, match="seq_tile_size"):
        small = nki_double.FlashConfig(seq_tile_size=256)
        nki_double.FlashFwdDouble().trace({**good, "config": small}, (1, 2))


def test_lse_adapters_follow_the_kernel_layout():
    # The kernels keep row t * 128 + p of the log-sum-exp at lse[b, h, p, t]
    # (nki-samples attention.py: l_buffer is (128 partitions, seq_q // 128 tiles)).
    emitter = Emitter()
    ctx = type("Ctx", (), {"emit": emitter})()
    lse = emitter.arg(TensorType((2, 3, 384), torch.float32))
    tiled = neuron_calls._to_kernel_lse(ctx, lse)
    back = neuron_calls._from_kernel_lse(ctx, tiled)
    text = emitter.module_text([tiled, back])
    exe = XlaCpuExecutable(artifact.executable_input(artifact.serialize(text), "portable"))
    rows = torch.arange(2 * 3 * 384, dtype=torch.float32).reshape(2, 3, 384)
    got_tiled, got_back = exe([rows])
    p, t = torch.meshgrid(torch.arange(128), torch.arange(3), indexing="ij")
    torch.testing.assert_close(got_tiled, rows[:, :, t * 128 + p])
    torch.testing.assert_close(got_back, rows)
