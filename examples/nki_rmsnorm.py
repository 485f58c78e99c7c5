"""An RMSNorm NKI kernel as a PyTorch op, trained inside a small LLaMA-style block.

Run: ``python examples/nki_rmsnorm.py`` (CPU: the compiled graphs run the kernel's PyTorch
reference on XLA CPU; outputs, loss and gradients are checked against eager PyTorch each step).
``--target trn2`` also builds the module for neuronx-cc: with the ``nki`` package installed (on a
Trainium host) the op becomes ``stablehlo.custom_call @AwsNeuronCustomNativeKernel``; without it
neuron-compile warns once and hands neuronx-cc the reference decomposition instead.

The kernel follows ``docs/trainium-reference.md`` §R11 ("RMSNorm"): rows on the 128 partitions,
sum of squares with ``activation_reduce``, rsqrt on ScalarE, weight broadcast across partitions.
It is written against the documented ``nki.language``/``nki.isa`` API and has not been run on a
device here.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import tempfile
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

import neuron_compile
from neuron_compile.trainium.kernels.nki import load_nki

# Never ``import nki`` directly: on PyPI that name is a placeholder package. load_nki() returns
# the real toolchain or None.
nki = load_nki()
if nki is not None:
    import nki.isa as nisa
    import nki.language as nl

    jit = nki.jit
else:

    def jit(fn):  # without nki the kernel is only a name: the reference runs everywhere
        return fn


def rms_norm_reference(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    """What the kernel computes, in PyTorch: eager, fake tensors, autograd and XLA CPU use it."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float()).to(x.dtype)


@neuron_compile.nki_op("examples::rms_norm", reference=rms_norm_reference)
@jit
def rms_norm_kernel(x, weight, eps=1e-6):
    """RMSNorm over the last dim of a 2-D ``x`` [rows, d] (HBM in, HBM out)."""
    rows, d = x.shape
    pmax = nl.tile_size.pmax  # 128 partitions: one row per partition
    out = nl.ndarray((rows, d), dtype=x.dtype, buffer=nl.shared_hbm)

    # The weight, broadcast to every partition once (a broadcast DMA, §2.9).
    w = nl.ndarray((pmax, d), dtype=weight.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=w, src=weight.reshape((1, d)).broadcast_to((pmax, d)))

    for t in range(math.ceil(rows / pmax)):  # plain range: unrolled at trace time
        lo, n = t * pmax, min(pmax, rows - t * pmax)
        xt = nl.ndarray((pmax, d), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=xt[0:n], src=x[lo : lo + n])
        # sum of squares along the free dim, fp32 (ScalarE square with a fused add-reduce)
        sq = nl.ndarray((pmax, d), dtype=nl.float32, buffer=nl.sbuf)
        ss = nl.ndarray((pmax, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation_reduce(
            dst=sq[0:n], op=nl.square, data=xt[0:n], reduce_op=nl.add, reduce_res=ss[0:n]
        )
        # rstd = rsqrt(ss / d + eps) on ScalarE: nl.rsqrt runs on GpSimd since NKI 0.5.0
        rstd = nl.ndarray((pmax, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=rstd[0:n], op=nl.rsqrt, data=ss[0:n], scale=1.0 / d, bias=eps)
        # y = x * rstd (per-partition scalar) * w
        y = nl.ndarray((pmax, d), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=y[0:n], data=xt[0:n], op0=nl.multiply, operand0=rstd[0:n])
        nisa.tensor_tensor(dst=y[0:n], data1=y[0:n], data2=w[0:n], op=nl.multiply)
        nisa.dma_copy(dst=out[lo : lo + n], src=y[0:n])
    return out


# ---- a LLaMA-style block using the op --------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        # The kernel takes rows x dim: flatten the leading dims around the call.
        return rms_norm_kernel(x.reshape(-1, x.shape[-1]), self.weight, self.eps).reshape(x.shape)


class Block(nn.Module):
    """Pre-norm attention + SwiGLU MLP, as in LLaMA (no rotary embedding, to stay small)."""

    def __init__(self, dim: int = 64, heads: int = 4, hidden: int = 128) -> None:
        super().__init__()
        self.heads = heads
        self.attn_norm, self.mlp_norm = RMSNorm(dim), RMSNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).split(d, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def _step(model: nn.Module, opt: torch.optim.Optimizer, x: Tensor, y: Tensor):
    out = model(x)
    loss = F.mse_loss(out, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    opt.step()
    return out.detach(), loss.item(), grads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--target", default="cpu", choices=["cpu", "trn2", "trn3"])
    args = parser.parse_args()
    # The target comes from the environment so that kernel specialisation sees it too.
    os.environ["NEURON_COMPILE_TARGET"] = args.target
    dump = Path(tempfile.mkdtemp(prefix="nki_rmsnorm_")) if args.target != "cpu" else None
    if dump is not None:
        os.environ["NEURON_COMPILE_DUMP_DIR"] = str(dump)

    torch.manual_seed(0)
    eager = Block()
    model = copy.deepcopy(eager)
    compiled = torch.compile(model, backend="neuron_compile")
    opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    opt_c = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = torch.randn(2, 16, 64), torch.randn(2, 16, 64)

    start = time.perf_counter()
    for step in range(args.steps):
        out_c, loss_c, grads_c = _step(compiled, opt_c, x, y)
        out_e, loss_e, grads_e = _step(eager, opt_e, x, y)
        torch.testing.assert_close(out_c, out_e, rtol=1e-4, atol=1e-4)
        for gc, ge in zip(grads_c, grads_e, strict=True):
            torch.testing.assert_close(gc, ge, rtol=1e-3, atol=1e-4)
        print(f"step {step}: loss compiled {loss_c:.5f}  eager {loss_e:.5f}")
    print(f"compiled == eager for {args.steps} steps ({time.perf_counter() - start:.1f} s)")

    if dump is not None:
        lines = [
            line.strip()
            for path in sorted(dump.glob("*_forward_*/module.stablehlo.mlir"))
            for line in path.read_text().splitlines()
            if "AwsNeuronCustomNativeKernel" in line
        ]
        where = f"(StableHLO for neuronx-cc in {dump})"
        if lines:
            print(f"{len(lines)} NKI custom call(s) {where}:\n  {lines[0][:160]}")
        else:
            print(f"no NKI custom call: the reference decomposition was lowered {where}")


if __name__ == "__main__":
    main()
