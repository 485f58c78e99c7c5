"""Small modules run on a one-thread XLA CPU client (``xla_cpu.runs_on_one_thread``): no
convolution, every matrix product and tensor small. A saved activation then crosses from the
one-thread client to the default one when its forward and backward chose differently."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from neuron_compile import compiler
from neuron_compile.runtime import xla_cpu
from tests.helpers import lower_to_text


@pytest.fixture
def four_threads(monkeypatch):
    """The choice as on a machine with four threads (one thread in all never needs a twin)."""
    monkeypatch.setattr(xla_cpu, "intra_op_threads", lambda: 4)


def _one(fn, *args) -> bool:
    return xla_cpu.runs_on_one_thread(lower_to_text(fn, *args, pretty=False))


def test_small_products_and_tensors_run_on_one_thread(four_threads) -> None:
    # 256 x 64 x 64: a tiny transformer's projection, 1M multiply-adds
    assert _one(lambda x, w: F.gelu(x @ w).sum(), torch.randn(256, 64), torch.randn(64, 64))
    assert _one(lambda x: x.softmax(-1) * 2, torch.randn(8, 4, 65, 65))


@pytest.mark.parametrize(
    "fn, shapes",
    [
        # 512 x 512 x 512 = 134M multiply-adds
        (lambda a, b: a @ b, [(512, 512), (512, 512)]),
        # a batched product: 8 x 256 x 256 x 64 = 33.5M
        (lambda a, b: torch.bmm(a, b), [(8, 256, 64), (8, 64, 256)]),
        # a tiny convolution still keeps every thread
        (lambda x, w: F.conv2d(x, w), [(1, 2, 5, 5), (2, 2, 3, 3)]),
        # 2M elements with no product at all
        (lambda x: (x * 2).exp(), [(2048, 1024)]),
    ],
    ids=["big-mm", "big-bmm", "conv", "big-elementwise"],
)
def test_large_or_convolutional_modules_keep_every_thread(four_threads, fn, shapes) -> None:
    assert not _one(fn, *(torch.randn(s) for s in shapes))


def test_nothing_changes_with_one_thread_in_all(monkeypatch) -> None:
    monkeypatch.setattr(xla_cpu, "intra_op_threads", lambda: 1)
    assert not _one(lambda x: x * 2, torch.randn(4))


def test_saved_activations_cross_between_the_clients(monkeypatch) -> None:
    """The forward on the one-thread client, the backward on the default one: the backward
    reads the forward's saved activations from the other client and gets eager's gradients."""
    chosen: list[bool] = []

    def forward_only(text: str) -> bool:
        chosen.append(not chosen)  # the first module compiled is the forward
        return chosen[-1]

    monkeypatch.setattr(compiler, "runs_on_one_thread", forward_only)

    def f(x, w):
        return (torch.tanh(x @ w) * x.sum(-1, keepdim=True)).sum()

    # Shapes no other test compiles: the in-process executable cache must miss.
    x, w = torch.randn(13, 11, requires_grad=True), torch.randn(11, 7, requires_grad=True)
    torch.compile(f, backend="neuron")(x, w).backward()
    got = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    f(x, w).backward()
    assert chosen == [True, False]
    assert xla_cpu._TWO_CLIENTS
    torch.testing.assert_close(got[0], x.grad)
    torch.testing.assert_close(got[1], w.grad)


_PROBE = """
import os, torch
torch.set_num_threads(2)
import neuron_compile
f = torch.compile(lambda x: (x @ x).relu().sum(), backend="neuron")
f(torch.randn(8, 8))
names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
print(names.count("tf_XLAEigen"))
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc")
def test_a_small_graph_adds_a_one_thread_pool() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PJRT_NPROC", "NPROC")}
    env["NEURON_COMPILE_CACHE_DIR"] = "off"
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.split()[-1]) == 2 + 1  # the default client's two, the twin's one
