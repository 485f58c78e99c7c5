"""torch.func inside compiled functions: per-sample gradients and vmapped losses, whose
decompositions hand ``aten._to_copy`` a Python number (its rule expected a tensor: NC102)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

CASES = {
    "per_sample_mse": lambda x, y: torch.func.vmap(
        torch.func.grad(lambda xi, yi: F.mse_loss(xi.sum(), yi))
    )(x, y),
    "per_sample_huber": lambda x, y: torch.func.vmap(
        torch.func.grad(lambda xi, yi: F.huber_loss(xi.sum(), yi))
    )(x, y),
    "vmapped_kl_div": lambda x, y: torch.func.vmap(
        lambda p, q: F.kl_div(p.log_softmax(-1), q.softmax(-1), reduction="batchmean")
    )(x.view(5, 1, 3), y.view(5, 1).expand(5, 3).reshape(5, 1, 3)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_func_transforms_compile_and_match_eager(name: str) -> None:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(5, 3, generator=g), torch.randn(5, generator=g)
    torch._dynamo.reset()
    actual = torch.compile(CASES[name], backend="neuron")(x, y)
    torch.testing.assert_close(actual, CASES[name](x, y), rtol=1e-5, atol=1e-6)
