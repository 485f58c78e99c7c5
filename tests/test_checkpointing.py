"""Activation checkpointing (torch.utils.checkpoint) under the backend: recomputation compiles,
and random ops inside checkpointed regions keep the graphs whole."""

from __future__ import annotations

import copy
import functools
import warnings

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

import neuron_compile
from neuron_compile.fallback import FallbackWarning

P = 0.5


def _doubled_dropout(x, **kw):
    return checkpoint(lambda t: F.dropout(t * 2.0, P, True), x, use_reentrant=False, **kw)


def test_checkpointed_dropout_compiles_whole_and_replays_its_mask():
    # fallback="error": any op left for the CPU raises NC101, so both graphs compile whole.
    x = torch.randn(64, 16, requires_grad=True)
    out = torch.compile(_doubled_dropout, backend="neuron", options={"fallback": "error"})(x)
    out.sum().backward()
    # The backward uses the forward's mask: d out / d x is 2 / (1 - p) where kept, else 0.
    kept = out != 0
    assert 0.3 < kept.float().mean() < 0.7
    torch.testing.assert_close(x.grad, kept.float() * 2.0 / (1 - P))
    assert [r.regions for r in neuron_compile.metrics()] == [1, 1]


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)

    def forward(self, x):
        inner = lambda t: self.b(F.dropout(F.gelu(self.a(t)), 0.0, self.training))  # noqa: E731
        return checkpoint(inner, x, use_reentrant=False)


def test_checkpointed_block_matches_eager():
    torch.manual_seed(0)
    model, x = _Block(), torch.randn(8, 16)
    ref = copy.deepcopy(model)
    torch.compile(model, backend="neuron")(x).square().sum().backward()
    ref(x).square().sum().backward()
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)


def test_user_forced_recompute_of_dropout_falls_back_with_named_ops():
    # A selective-checkpoint policy that insists on recomputing the dropout gets the replayed-RNG
    # higher-order ops, which run on the CPU: each graph's warning names them.
    def policy(ctx, op, *args, **kwargs):
        if op is torch.ops.aten.native_dropout.default:
            return CheckpointPolicy.MUST_RECOMPUTE
        return CheckpointPolicy.PREFER_RECOMPUTE

    context_fn = functools.partial(create_selective_checkpoint_contexts, policy)
    x = torch.randn(64, 16, requires_grad=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn = functools.partial(_doubled_dropout, context_fn=context_fn)
        out = torch.compile(fn, backend="neuron")(x)
        out.sum().backward()
    messages = [str(w.message) for w in caught if issubclass(w.category, FallbackWarning)]
    assert len(messages) == 2, messages
    assert "runs 1 op(s)" in messages[0] and "run_and_save_rng_state x1" in messages[0]
    assert "runs 1 op(s)" in messages[1] and "run_with_rng_state x1" in messages[1]
    torch.testing.assert_close(x.grad, (out != 0).float() * 2.0 / (1 - P))


def test_checkpointed_rand_is_saved_not_redrawn():
    # A tensor-valued random op (rand_like) in a checkpointed region: the backward reads the
    # forward's draw.
    def fn(x):
        return checkpoint(lambda t: t * torch.rand_like(t), x, use_reentrant=False)

    x = torch.randn(64, 16, requires_grad=True)
    out = torch.compile(fn, backend="neuron", options={"fallback": "error"})(x)
    out.sum().backward()
    torch.testing.assert_close(x.grad, out.detach() / x.detach())
