"""What a user training ordinary models sees from neuron-compile: the exact set of warnings,
each at the user's own line, short, in the user's names (issue 21)."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import neuron_compile
from neuron_compile.compiler import DowncastWarning
from neuron_compile.narrowing import EXEMPT
from neuron_compile.shapes import RecompileWarning
from neuron_compile.warn_once import NeuronCompileWarning

#: What an FX node or a Dynamo source looks like: never in a message for the user.
FX_NAME = re.compile(r"%\w|\bl_\w+_\b|L\['|G\['|primals_\d|getitem_\d|_modules\[")


def _block(i: int, o: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU())


class UNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.d1, self.d2, self.mid = _block(3, 8), _block(8, 16), _block(16, 16)
        self.u2, self.u1, self.out = _block(32, 8), _block(16, 8), nn.Conv2d(8, 2, 1)
        self.pool, self.up = nn.MaxPool2d(2), nn.Upsample(scale_factor=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.d1(x)
        b = self.d2(self.pool(a))
        m = self.mid(self.pool(b))
        u = self.u2(torch.cat([self.up(m), b], 1))
        return self.out(self.u1(torch.cat([self.up(u), a], 1)))


class TinyLM(nn.Module):
    """Token + position embeddings, one attention block, cross-entropy over int64 targets."""

    def __init__(self, vocab: int = 32, d: int = 16, block: int = 8) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.attn = nn.MultiheadAttention(d, 2, batch_first=True)
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        x = x + self.attn(x, x, x, need_weights=False)[0]
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)


class ShiftedLM(nn.Module):
    """Token ids shifted by arithmetic before the lookup: int64 values, not only indices."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(64, 8)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.emb((ids * 3 + 1) % 64).square().mean()


def _ours(caught: list[warnings.WarningMessage]) -> list[warnings.WarningMessage]:
    return [w for w in caught if issubclass(w.category, NeuronCompileWarning)]


def _train(model: nn.Module, batches: list[tuple[torch.Tensor, ...]]):
    """Train ``model`` compiled, one step per batch; every warning shown, recorded."""
    compiled = torch.compile(model, backend="neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for batch in batches:
            loss = compiled(*batch)
            if loss.dim():
                loss = loss.square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
    return _ours(caught)


def _assert_readable(shown: list[warnings.WarningMessage]) -> None:
    for w in shown:
        text = str(w.message)
        assert w.filename == __file__, (w.filename, text)  # the user's line, not ours
        assert len(text) <= 300, text
        assert not FX_NAME.search(text), text


def _narrowed(kind: str) -> list[str]:
    return [d for r in neuron_compile.metrics() if r.kind == kind for d in r.downcasts]


def test_unet_with_batchnorm_trains_without_warnings():
    torch.manual_seed(0)
    shown = _train(UNet(), [(torch.randn(2, 3, 16, 16),) for _ in range(2)])
    _assert_readable(shown)
    assert [(w.category, str(w.message)) for w in shown] == []
    # The BatchNorm counters did run as int32: exactly, by the policy's exemption, as logged.
    counters = [d for d in _narrowed("forward") if "num_batches_tracked" in d]
    assert len(counters) == 5 and all(EXEMPT in d for d in counters)
    assert "d1.1.num_batches_tracked: torch.int64 -> torch.int32" in counters[0]


def test_a_counter_named_like_batchnorms_but_read_is_warned_about():
    """The exemption is for a counter the graph only increments: one it multiplies by (here
    past 2**31, where int32 wraps) is narrowed like any int64 input, and said so."""

    class Counter(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("num_batches_tracked", torch.tensor(3_000_000_000))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.num_batches_tracked.add_(1)
            return x * self.num_batches_tracked

    with pytest.warns(DowncastWarning, match="num_batches_tracked"):
        torch.compile(Counter(), backend="neuron")(torch.ones(1))
    counters = [d for d in _narrowed("inference") if "num_batches_tracked" in d]
    assert counters and not any(EXEMPT in d for d in counters), counters


def test_tiny_lm_with_int64_token_ids_trains_without_warnings():
    torch.manual_seed(0)
    idx = torch.randint(0, 32, (2, 8))
    targets = torch.randint(0, 32, (2, 8))
    targets[0, :3] = -100  # ignored positions: the mask compares the ids, still index-only
    shown = _train(TinyLM(), [(idx, targets), (idx.flip(1), targets.flip(1))])
    _assert_readable(shown)
    assert [(w.category, str(w.message)) for w in shown] == []
    forward = _narrowed("forward")
    assert any(d.startswith("idx: torch.int64") and EXEMPT in d for d in forward), forward
    assert any(d.startswith("targets: torch.int64") and EXEMPT in d for d in forward), forward


def test_int64_arithmetic_warns_once_per_model_at_the_users_line():
    torch.manual_seed(0)
    batches = [(torch.randint(0, 1000, (4, 5)),) for _ in range(3)]
    shown = _train(ShiftedLM(), batches)
    _assert_readable(shown)
    # One warning for the model: not one per graph (forward and backward) nor per step.
    assert [w.category for w in shown] == [DowncastWarning]
    text = str(shown[0].message)
    assert "ShiftedLM" in text and "ids (int64 -> int32)" in text and "wrap" in text
    assert "saved" not in text  # the backward's saved activations are not the user's business
    assert len({r.kind for r in neuron_compile.metrics()}) == 2  # both graphs narrowed ids


def test_a_compile_per_configured_bucket_is_warm_up_a_new_size_is_not():
    f = torch.compile(lambda x: x * 2, backend="neuron", options={"buckets": [4, 8]})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (4, 8, 4):  # warm-up: one compile per bucket, no advice to pad
            f(torch.ones(n))
        assert _ours(caught) == []
        neuron_compile.mark_warmup_done()
        f(torch.ones(5))  # not a bucket: a recompile the user should hear about
    (shown,) = _ours(caught)
    _assert_readable([shown])
    assert shown.category is RecompileWarning and "x dim 0=5" in str(shown.message)


def test_warn_is_located_at_the_callers_line_and_obeys_filters():
    from neuron_compile.warn_once import warn

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = _line_of_next_call()
        warn("neuron-compile: a note", DowncastWarning)
    (w,) = caught
    assert (w.filename, w.lineno, w.category) == (__file__, line, DowncastWarning)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NeuronCompileWarning)  # -W error::...NeuronCompileWarning
        try:
            warn("neuron-compile: an error now", RecompileWarning)
        except RecompileWarning as e:
            assert "an error now" in str(e)
        else:
            raise AssertionError("the error filter did not apply")


def _line_of_next_call() -> int:
    import sys

    return sys._getframe(1).f_lineno + 1
