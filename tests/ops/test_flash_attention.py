"""Flash attention for trn targets: routing rule, references vs eager SDPA, end-to-end training."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from neuron_compile.trainium.kernels.flash_attention import (
    attention_backward_reference,
    attention_reference,
    flash_attention,
    route_sdpa,
)
from neuron_compile.trainium.kernels.nki import NkiFallbackWarning
from neuron_compile.warn_once import reset_warn_once


def _qkv(b=2, h=2, lq=128, lk=128, d=16, dtype=torch.float32):
    torch.manual_seed(0)
    return [torch.randn(b, h, n, d, dtype=dtype, requires_grad=True) for n in (lq, lk, lk)]


@pytest.mark.parametrize("is_causal,lk", [(True, 128), (False, 128), (False, 256)])
def test_op_forward_and_backward_match_eager_sdpa(is_causal, lk):
    q, k, v = _qkv(lk=lk)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    grads_ref = torch.autograd.grad(ref.square().sum(), (q, k, v))
    out, lse = flash_attention(q, k, v, is_causal, q.shape[-1] ** -0.5)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    if is_causal:
        scores = scores.masked_fill(~torch.ones(128, lk, dtype=torch.bool).tril(), float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1), rtol=1e-5, atol=1e-5)
    for g, r in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-5)


def test_backward_reference_uses_saved_lse_not_a_recomputed_softmax():
    q, k, v = (t.detach() for t in _qkv())
    out, lse = attention_reference(q, k, v, True, 0.25)
    dout = torch.randn_like(out)
    dq, _, _ = attention_backward_reference(dout, q, k, v, out, lse, True, 0.25)
    dq_shifted, _, _ = attention_backward_reference(dout, q, k, v, out, lse + 1.0, True, 0.25)
    # p = exp(s - lse): shifting lse scales p, so a backward that ignored lse could not notice
    assert not torch.allclose(dq, dq_shifted)


def _dynamo_graph(fn, *args):
    graphs = []

    def capture(gm, _inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=capture, fullgraph=True)(*args)
    return graphs[0]


def _sdpa(**kw):
    return lambda q, k, v, *extra: F.scaled_dot_product_attention(q, k, v, *extra, **kw)


@pytest.mark.parametrize(
    "shape,kw,extra,routed",
    [
        ((2, 2, 128, 16), {"is_causal": True}, (), 1),
        ((1, 4, 256, 128), {}, (), 1),
        ((2, 2, 100, 16), {"is_causal": True}, (), 0),  # sequence not a multiple of 128
        ((2, 2, 128, 160), {}, (), 0),  # head dim > 128
        ((2, 2, 128, 16), {"dropout_p": 0.1}, (), 0),
        ((2, 2, 128, 16), {}, ("mask",), 0),
        ((2, 128, 16), {}, (), 0),  # not [batch, heads, seq, dim]
        ((2, 2, 128, 16), {"dtype": torch.bfloat16}, (), 1),
        ((2, 2, 128, 16), {"dtype": torch.float16}, (), 0),  # not what the kernels' binding covers
    ],
)
def test_route_sdpa_qualifies_like_torchneuron(shape, kw, extra, routed):
    kw = dict(kw)
    dtype = kw.pop("dtype", torch.float32)
    q, k, v = (torch.randn(shape, dtype=dtype) for _ in range(3))
    args = [q, k, v] + [torch.ones(shape[-2], shape[-2], dtype=torch.bool) for _ in extra]
    gm = _dynamo_graph(_sdpa(**kw), *args)
    assert route_sdpa(gm) == routed
    ops = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert (torch.ops.neuron_compile.flash_attention.default in ops) == bool(routed)
    if routed:
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(gm(*args)[0], _sdpa(**kw)(*args), rtol=tol, atol=tol)


class _Attention(torch.nn.Module):
    def __init__(self, d: int = 32, heads: int = 2) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (
            z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
            for z in self.qkv(x).split(d, -1)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return y.transpose(1, 2).reshape(b, t, d)


def _train_step(model, x, **options):
    torch._dynamo.reset()  # a new compile per options, not a recompile of the same frame
    model.zero_grad()
    loss = torch.compile(model, backend="neuron_compile", options=options)(x).square().sum()
    loss.backward()
    return loss.detach(), model.qkv.weight.grad.clone()


def _fx_text(dump: Path) -> dict[str, str]:
    return {p.parent.name.rsplit("_", 2)[-2]: p.read_text() for p in dump.glob("*/graph.fx.py")}


@pytest.mark.filterwarnings("ignore:neuron-compile. target trn2 without neuronx-cc")
def test_trn2_training_uses_one_flash_node_per_graph_and_matches_eager(tmp_path):
    model, x = _Attention(), torch.randn(2, 128, 32)
    ref_loss, ref_grad = _train_step(model, x, target="cpu")
    reset_warn_once()  # the fallback is said once per process: maybe by an earlier test
    with pytest.warns(NkiFallbackWarning, match="flash_attention_backward not used"):
        loss, grad = _train_step(model, x, target="trn2", dump_dir=str(tmp_path))
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-4, atol=1e-4)
    fx = _fx_text(tmp_path)
    assert fx["forward"].count("neuron_compile.flash_attention.default(") == 1
    assert "aten._softmax" not in fx["forward"]
    assert fx["backward"].count("neuron_compile.flash_attention_backward.default(") == 1


@pytest.mark.parametrize(
    "options", [{"target": "cpu"}, {"target": "trn2", "flash_attention": False}]
)
@pytest.mark.filterwarnings("ignore:neuron-compile. target trn2 without neuronx-cc")
def test_cpu_target_and_option_off_keep_the_nki_kernels_out(tmp_path, options):
    _train_step(_Attention(), torch.randn(2, 128, 32), dump_dir=str(tmp_path), **options)
    fx = _fx_text(tmp_path)
    assert "neuron_compile.flash_attention" not in fx["forward"] + fx["backward"]
    if options["target"] == "cpu":  # eager's own choice: its CPU flash op, lowered whole
        assert "aten._scaled_dot_product_flash_attention_for_cpu.default" in fx["forward"]
        assert "_scaled_dot_product_flash_attention_for_cpu_backward" in fx["backward"]
    else:  # the math path, whose softmax the pattern pass makes neuronx-cc's softmax kernel
        assert "neuron_compile.softmax" in fx["forward"]
        assert "aten.bmm" in fx["forward"]
