"""The fused inference ops of torch.nn's fast path: our decompositions against PyTorch's own
kernels, and a served transformer encoder compiling without CPU fallback."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from neuron_compile.decompositions.fast_path import (
    native_multi_head_attention,
    transformer_encoder_layer_fwd,
)

aten = torch.ops.aten
B, L, E, H = 2, 6, 16, 4


class _Record(TorchDispatchMode):
    """Records the arguments of the first call of ``op``."""

    def __init__(self, op):
        super().__init__()
        self.op, self.calls = op, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is self.op:
            self.calls.append((args, kwargs))
        return func(*args, **kwargs)


def _masks():
    pad = torch.zeros(B, L, dtype=torch.bool)
    pad[0, 4:] = True
    causal = torch.nn.Transformer.generate_square_subsequent_mask(L)
    return {
        "none": {},
        "key_padding": {"src_key_padding_mask": pad},
        "causal": {"src_mask": causal, "is_causal": True},
        "both": {"src_mask": causal.isinf(), "src_key_padding_mask": pad},
    }


@pytest.mark.parametrize("mask", ["none", "key_padding", "causal", "both"])
@pytest.mark.parametrize("norm_first, activation", [(False, "relu"), (True, "gelu")])
def test_encoder_layer_matches_the_native_kernel(mask, norm_first, activation):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(
        E, H, 32, dropout=0.0, batch_first=True, norm_first=norm_first, activation=activation
    ).eval()
    x = torch.randn(B, L, E)
    spy = _Record(aten._transformer_encoder_layer_fwd.default)
    with torch.no_grad(), spy:
        expected = layer(x, **_masks()[mask])
    assert spy.calls, "PyTorch did not take its fast path"
    args, kwargs = spy.calls[0]
    torch.testing.assert_close(
        transformer_encoder_layer_fwd(*args, **kwargs), expected, rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("mask_type", [None, 0, 1, 2])
@pytest.mark.parametrize("need_weights, average", [(True, True), (True, False), (False, True)])
def test_multi_head_attention_matches_the_native_kernel(mask_type, need_weights, average):
    torch.manual_seed(0)
    q, kv = torch.randn(B, L, E), torch.randn(B, L, E)  # the kernel wants equal shapes
    weights = (torch.randn(3 * E, E), torch.randn(3 * E), torch.randn(E, E), torch.randn(E))
    mask = {
        None: None,
        0: torch.rand(L, L) > 0.7,
        1: torch.zeros(B, L, dtype=torch.bool).index_fill_(1, torch.tensor([1, 5]), True),
        2: torch.rand(B, H, L, L) > 0.7,
    }[mask_type]
    if mask_type in (0, 2):  # a query row with every key masked: NaN in the kernel too
        mask[..., 0, :] = True
    args = (q, kv, kv, E, H, *weights, mask, need_weights, average, mask_type)
    expected = aten._native_multi_head_attention.default(*args)
    out, attn = native_multi_head_attention(*args)
    torch.testing.assert_close(out, expected[0], rtol=1e-5, atol=1e-5, equal_nan=True)
    assert out.isnan().any() == (mask_type in (0, 2))
    if need_weights:
        torch.testing.assert_close(attn, expected[1], rtol=1e-5, atol=1e-6, equal_nan=True)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_served_transformer_encoder_compiles_without_fallback():
    # eval + no_grad: every layer calls the fused op; with fallback="error" any op left for the
    # CPU raises NC101, so this compiles all of it.
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(E, H, 32, dropout=0.0, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    x, pad = torch.randn(B, L, E), _masks()["key_padding"]["src_key_padding_mask"]
    torch._dynamo.reset()
    compiled = torch.compile(copy.deepcopy(model), backend="neuron", options={"fallback": "error"})
    with torch.no_grad():
        spy = _Record(aten._transformer_encoder_layer_fwd.default)
        with spy:
            expected = model(x, src_key_padding_mask=pad)
        assert spy.calls  # eager took the fast path
        got = compiled(x, src_key_padding_mask=pad)
    torch._dynamo.reset()
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
