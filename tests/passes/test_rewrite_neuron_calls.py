"""rewrite_neuron_calls: each form becomes its neuron_compile op and AwsNeuron custom call, with
eager numerics (forward and backward) on the XLA CPU reference; near-miss forms stay untouched."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch._functorch.aot_autograd import aot_function
from torch.fx.experimental.proxy_tensor import make_fx

from neuron_compile.capture import decomposition_table
from neuron_compile.compiler import compile_graph
from neuron_compile.config import NeuronConfig
from neuron_compile.lowering import lower_graph
from neuron_compile.passes import pipeline_for, run_pipeline
from neuron_compile.targets import get_target
from neuron_compile.trainium.passes import rewrite_neuron_calls
from tests.passes.graphs import targets

aten = torch.ops.aten
nc = torch.ops.neuron_compile
CPU = NeuronConfig(fallback="error", target="cpu")


def _trace(fn, *args) -> fx.GraphModule:
    """The trn2 ATen graph of ``fn`` (the ops the trn target keeps whole stay whole), with fake ``meta['val']``."""

    def positional(*a):
        return fn(*a)

    return make_fx(
        positional, decomposition_table=decomposition_table("trn2"), tracing_mode="fake"
    )(*args)


def _run_on_cpu(gm: fx.GraphModule, args) -> torch.Tensor:
    """Execute ``gm`` on XLA CPU; its neuron_compile ops lower to their references there."""
    (out,) = compile_graph(gm, args, name="test", kind="inference", cfg=CPU)(list(args))
    return out


def _newgelu(x):
    return (
        0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
    )


def _rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def _hf_rms(x, w):  # LLaMA / HF LlamaRMSNorm: float32 inside, weight after the cast back
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
    return w * h.to(x.dtype)


X = (2, 3, 8)
W = (8,)
# id: (fn, input shapes, dtype, op, custom-call target, ATen ops that must be gone)
FORWARD = {
    "softmax": (lambda x: torch.softmax(x, -1), [X], None, nc.softmax, "AwsNeuronSoftmax", []),
    "softmax-dim2": (lambda x: torch.softmax(x, 2), [X], None, nc.softmax, "AwsNeuronSoftmax", []),
    "gelu": (F.gelu, [X], None, nc.gelu, "AwsNeuronGelu", [aten.gelu.default]),
    "gelu-tanh": (
        lambda x: F.gelu(x, approximate="tanh"),
        [X],
        None,
        nc.gelu,
        "AwsNeuronGeluApprxTanh",
        [aten.gelu.default],
    ),
    "gelu-erf-hand": (
        lambda x: x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0))),
        [X],
        None,
        nc.gelu,
        "AwsNeuronGelu",
        [aten.erf.default, aten.mul.Tensor, aten.div.Tensor, aten.add.Tensor],
    ),
    "gelu-erf-hand-reassociated": (
        lambda x: (1 + torch.erf(x * (1 / math.sqrt(2.0)))) * x / 2,
        [X],
        None,
        nc.gelu,
        "AwsNeuronGelu",
        [aten.erf.default, aten.mul.Tensor, aten.div.Tensor, aten.add.Tensor],
    ),
    "newgelu": (
        _newgelu,
        [X],
        None,
        nc.gelu,
        "AwsNeuronGeluApprxTanh",
        [aten.tanh.default, aten.pow.Tensor_Scalar, aten.mul.Tensor, aten.add.Tensor],
    ),
    "newgelu-xxx-bf16": (
        lambda x: (1.0 + torch.tanh(0.7978845608 * (0.044715 * (x * x * x) + x))) * x * 0.5,
        [X],
        torch.bfloat16,
        nc.gelu,
        "AwsNeuronGeluApprxTanh",
        [aten.tanh.default, aten.mul.Tensor, aten.add.Tensor],
    ),
    "silu": (F.silu, [X], None, nc.silu, "AwsNeuronSilu", [aten.silu.default]),
    "silu-hand": (
        lambda x: torch.sigmoid(x) * x,
        [X],
        None,
        nc.silu,
        "AwsNeuronSilu",
        [aten.sigmoid.default, aten.mul.Tensor],
    ),
    "rms-weight": (
        _rms,
        [X, W],
        None,
        nc.rms_norm,
        "AwsNeuronRmsNorm",
        [aten.rsqrt.default, aten.mean.dim, aten.mul.Tensor, aten.pow.Tensor_Scalar],
    ),
    "rms-weight-left-f16": (
        lambda x, w: w * (x * torch.rsqrt(1e-5 + (x * x).mean(2, keepdim=True))),
        [X, W],
        torch.float16,
        nc.rms_norm,
        "AwsNeuronRmsNorm",
        [aten.rsqrt.default, aten.mean.dim, aten.mul.Tensor],
    ),
    "rms-no-weight": (
        lambda x: torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * x,
        [X],
        None,
        nc.rms_norm,
        "AwsNeuronRmsNorm",
        [aten.rsqrt.default, aten.mean.dim, aten.mul.Tensor],
    ),
    "rms-hf-bf16": (
        _hf_rms,
        [X, W],
        torch.bfloat16,
        nc.rms_norm,
        "AwsNeuronRmsNorm",
        [aten.rsqrt.default, aten.mean.dim],
    ),
}


def _inputs(shapes, dtype):
    torch.manual_seed(0)
    return [torch.randn(s).to(dtype or torch.float32) for s in shapes]


@pytest.mark.parametrize("case", list(FORWARD))
def test_forward_form_becomes_neuron_call_with_eager_numerics(case):
    fn, shapes, dtype, op, call, gone = FORWARD[case]
    args = _inputs(shapes, dtype)
    gm = _trace(fn, *args)
    assert rewrite_neuron_calls(gm)
    gm.graph.lint()
    gm.recompile()

    assert targets(gm).count(op.default) == 1
    assert not set(gone) & set(targets(gm))
    new = next(n for n in gm.graph.nodes if n.target is op.default)
    assert new.meta["val"].shape == args[0].shape
    assert call in lower_graph(gm, target=get_target("trn2")).custom_calls
    assert lower_graph(gm).custom_calls == []  # the reference stands in on XLA CPU
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype else {}
    torch.testing.assert_close(_run_on_cpu(gm, args), fn(*args), **tol)
    assert not rewrite_neuron_calls(gm)  # idempotent


def test_rms_norm_weight_becomes_the_ops_weight_and_eps_is_kept():
    x, w = _inputs([X, W], None)
    gm = _trace(_rms, x, w)
    rewrite_neuron_calls(gm)
    (node,) = [n for n in gm.graph.nodes if n.target is nc.rms_norm.default]
    assert node.args[0].op == node.args[1].op == "placeholder"
    assert node.args[0] is not node.args[1]
    assert node.args[2] == 1e-6


def test_stack_trace_of_the_matched_output_is_kept():
    x = torch.randn(X)
    gm = _trace(lambda x: torch.sigmoid(x) * x, x)
    mul = next(n for n in gm.graph.nodes if n.target is aten.mul.Tensor)
    mul.meta["stack_trace"] = 'File "model.py", line 7, in forward'
    rewrite_neuron_calls(gm)
    (silu,) = [n for n in gm.graph.nodes if n.target is nc.silu.default]
    assert silu.meta["stack_trace"] == 'File "model.py", line 7, in forward'


# ---- training: forward and backward graphs through AOTAutograd ------------------------------
def _train_with_pass(fn, args):
    """``fn`` through aot_function with the trn2 decompositions, the pass in the compiler and
    each graph run on XLA CPU; returns (out, grads, [(op targets, neuronx-cc custom calls)])."""
    seen = []

    def compiler(gm, example_inputs):
        rewrite_neuron_calls(gm)
        gm.graph.lint()
        gm.recompile()
        seen.append((targets(gm), lower_graph(gm, target=get_target("trn2")).custom_calls))
        return compile_graph(gm, example_inputs, name="t", kind="training", cfg=CPU)

    compiled = aot_function(fn, compiler, decompositions=decomposition_table("trn2"))
    leaves = [a.clone().requires_grad_() for a in args]
    out = compiled(*leaves)
    out.sum().backward()
    return out.detach(), [a.grad for a in leaves], seen


def _eager_train(fn, args):
    leaves = [a.clone().requires_grad_() for a in args]
    out = fn(*leaves)
    out.sum().backward()
    return out.detach(), [a.grad for a in leaves]


TRAINING = {
    # id: (fn, shapes, forward custom calls, backward custom calls)
    "softmax": (
        lambda x: torch.softmax(x, -1) * x,
        [X],
        ["AwsNeuronSoftmax"],
        ["AwsNeuronSoftmaxBackward"],
    ),
    "gelu": (F.gelu, [X], ["AwsNeuronGelu"], ["AwsNeuronGeluBackward"]),
    # The tanh backward has no kernel: its aten.gelu_backward stays (lowered as PyTorch's math).
    "gelu-tanh": (lambda x: F.gelu(x, approximate="tanh"), [X], ["AwsNeuronGeluApprxTanh"], []),
    "silu": (F.silu, [X], ["AwsNeuronSilu"], ["AwsNeuronSiluBackward"]),
    # The rsqrt is saved for backward: rewriting would keep it alive and add a kernel's work.
    "rms-weight": (_rms, [X, W], [], []),
}


@pytest.mark.parametrize("case", list(TRAINING))
def test_training_graphs_rewrite_and_match_eager_gradients(case):
    fn, shapes, fw_calls, bw_calls = TRAINING[case]
    args = _inputs(shapes, None)
    out, grads, seen = _train_with_pass(fn, args)
    ref_out, ref_grads = _eager_train(fn, args)

    torch.testing.assert_close(out, ref_out)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r)
    (fw_targets, fw_got), (bw_targets, bw_got) = seen
    assert fw_got == fw_calls
    assert bw_got == bw_calls
    if case == "gelu-tanh":
        assert aten.gelu_backward.default in bw_targets
    if case == "rms-weight":
        assert aten.rsqrt.default in fw_targets


# ---- near misses: nothing changes --------------------------------------------------------------
def _with_interior_used(x):
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    return x * r + r


def _with_sigmoid_used(x):
    s = torch.sigmoid(x)
    return x * s + s


NEGATIVE = {
    "softmax-dim0": (lambda x: torch.softmax(x, 0), [X], None),
    "softmax-dim1": (lambda x: torch.softmax(x, 1), [X], None),
    "silu-other-sigmoid": (lambda x, y: x * torch.sigmoid(y), [X, X], None),
    "silu-scaled": (lambda x: 2.0 * x * torch.sigmoid(x), [X], None),
    "silu-sigmoid-used": (_with_sigmoid_used, [X], None),
    "newgelu-wrong-constant": (
        lambda x: 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044 * x**3))),
        [X],
        None,
    ),
    "gelu-erf-wrong-scale": (lambda x: x * 0.5 * (1.0 + torch.erf(x / 1.5)), [X], None),
    "rms-mean-dim0": (lambda x: x * torch.rsqrt(x.pow(2).mean(0, keepdim=True) + 1e-6), [X], None),
    "rms-mean-no-keepdim": (
        lambda x: x * torch.rsqrt(x.pow(2).mean(-1) + 1e-6).unsqueeze(-1),
        [X],
        None,
    ),
    "rms-other-square": (
        lambda x, y: x * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6),
        [X, X],
        None,
    ),
    "rms-cube": (lambda x: x * torch.rsqrt(x.pow(3).mean(-1, keepdim=True) + 1e-6), [X], None),
    "rms-interior-used": (_with_interior_used, [X], None),
    "gelu-float64": (F.gelu, [X], torch.float64),
    "softmax-float64": (lambda x: torch.softmax(x, -1), [X], torch.float64),
    "silu-hand-float64": (lambda x: x * torch.sigmoid(x), [X], torch.float64),
    "silu-hand-int32": (lambda x: x * torch.sigmoid(x), [X], torch.int32),
}


@pytest.mark.parametrize("case", list(NEGATIVE))
def test_near_miss_is_not_rewritten(case):
    fn, shapes, dtype = NEGATIVE[case]
    args = _inputs(shapes, dtype)
    gm = _trace(fn, *args)
    before = gm.code
    assert not rewrite_neuron_calls(gm)
    assert gm.code == before
    assert lower_graph(gm, target=get_target("trn2")).custom_calls == []


def test_rms_weight_of_wrong_shape_is_not_fused():
    """A (3, 8) "weight" is not RMSNorm's scale: it stays a separate mul. (The unweighted inner
    product is still a valid RMSNorm and is rewritten.)"""
    x, w = _inputs([X, (3, 8)], None)
    gm = _trace(_rms, x, w)
    assert rewrite_neuron_calls(gm)
    gm.recompile()
    (node,) = [n for n in gm.graph.nodes if n.target is nc.rms_norm.default]
    assert node.args[1] is None
    assert targets(gm).count(aten.mul.Tensor) == 1
    torch.testing.assert_close(_run_on_cpu(gm, [x, w]), _rms(x, w))


def test_cpu_pipeline_leaves_the_forms_alone():
    assert rewrite_neuron_calls not in pipeline_for("cpu")
    x = torch.randn(X)
    gm = _trace(lambda x: F.gelu(torch.softmax(x, -1)) * torch.sigmoid(x) + F.silu(x), x)
    run_pipeline(gm, pipeline_for("cpu"))
    assert not [t for t in targets(gm) if "neuron_compile" in str(t)]
    assert aten.gelu.default in targets(gm) and aten._softmax.default in targets(gm)


# ---- end to end: torch.compile on trn2 -----------------------------------------------------
class _Block(torch.nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(d) + 0.5)
        self.up = torch.nn.Linear(d, 2 * d)
        self.down = torch.nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight
        a, b = self.up(h).chunk(2, dim=-1)
        h = self.down(torch.cat([F.gelu(a), F.silu(b)], dim=-1))
        return torch.softmax(h @ h.transpose(-1, -2), dim=-1) @ h + x


def _dumped_calls(dump: Path, kind: str) -> str:
    return "".join(p.read_text() for p in dump.glob(f"*{kind}*/module.stablehlo.mlir"))


def test_torch_compile_trn2_emits_neuron_calls_and_matches_eager(tmp_path, monkeypatch):
    monkeypatch.setenv("NEURON_COMPILE_DUMP_DIR", str(tmp_path))
    torch.manual_seed(0)
    model = _Block()
    x = torch.randn(2, 4, 16)
    compiled = torch.compile(model, backend="neuron_compile", options={"target": "trn2"})

    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    inference = _dumped_calls(tmp_path, "inference")
    # Inference: RMSNorm's interior is not saved for a backward, so it is rewritten too.
    for call in ("AwsNeuronRmsNorm", "AwsNeuronGelu", "AwsNeuronSilu", "AwsNeuronSoftmax"):
        assert f"@{call}(" in inference, call

    xs = [x.clone().requires_grad_() for _ in range(2)]
    compiled(xs[0]).sum().backward()
    got = [p.grad.clone() for p in model.parameters()] + [xs[0].grad]
    model.zero_grad()
    model(xs[1]).sum().backward()
    ref = [p.grad for p in model.parameters()] + [xs[1].grad]
    torch.testing.assert_close(got, ref)
    forward, backward = _dumped_calls(tmp_path, "forward"), _dumped_calls(tmp_path, "backward")
    for call in ("AwsNeuronGelu", "AwsNeuronSilu", "AwsNeuronSoftmax"):
        assert f"@{call}(" in forward, call
    for call in ("AwsNeuronGeluBackward", "AwsNeuronSiluBackward", "AwsNeuronSoftmaxBackward"):
        assert f"@{call}(" in backward, call
    assert "AwsNeuronRmsNorm" not in forward  # its rsqrt is saved for backward
