"""sink_transposes: mm/bmm of permuted operands become dot_general with no transpose."""

from __future__ import annotations

import logging

import pytest
import torch
from torch._functorch.aot_autograd import aot_function, make_boxed_func
from torch._functorch.partitioners import default_partition
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

import neuron_compile
from neuron_compile.capture import decomposition_table
from neuron_compile.lowering import lower_graph
from neuron_compile.passes import PIPELINE, run_pipeline, sink_transposes
from tests.helpers import run_lowered, trace_aten
from tests.passes.graphs import build, count, targets

aten = torch.ops.aten
dot_general = torch.ops.neuron_compile.dot_general


# ---- the op -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("shapes", "dims", "equation"),
    [
        (((5, 3), (5, 4)), ([0], [0], [], []), "km,kn->mn"),
        (((3, 5), (4, 5)), ([1], [1], [], []), "mk,nk->mn"),
        (((2, 5, 3), (2, 4, 5)), ([1], [2], [0], [0]), "bkm,bnk->bmn"),
        (((3, 2, 5), (5, 2, 4)), ([2], [0], [1], [1]), "mbk,kbn->bmn"),
        (((2, 3, 5, 6), (6, 5, 4)), ([2, 3], [1, 0], [], []), "amkl,lkn->amn"),
    ],
)
def test_dot_general_eager_and_fake_agree_with_einsum(shapes, dims, equation):
    a, b = torch.randn(*shapes[0]), torch.randn(*shapes[1])
    want = torch.einsum(equation, a, b)
    torch.testing.assert_close(dot_general(a, b, *dims), want)
    with FakeTensorMode() as mode:
        fake = dot_general(mode.from_tensor(a), mode.from_tensor(b), *dims)
    assert isinstance(fake, FakeTensor) and fake.shape == want.shape and fake.dtype == want.dtype


def test_dot_general_lowers_to_one_dot_general_with_the_same_numerics():
    def fn(a, b):
        return dot_general(a, b, [1], [2], [0], [0]) * 2

    a, b = torch.randn(2, 5, 3), torch.randn(2, 4, 5)
    gm = trace_aten(fn, a, b)
    text = lower_graph(gm).text
    assert text.count("stablehlo.dot_general") == 1 and "stablehlo.transpose" not in text
    assert "lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [2]" in text
    (got,) = run_lowered(fn, a, b)
    torch.testing.assert_close(got, fn(a, b))


# ---- the pass -----------------------------------------------------------------------------
def test_mm_of_transposed_operands_becomes_dot_general():
    def fn(a, b, c):
        return a.t() @ b, b @ c.t(), b.t() @ a

    args = torch.randn(5, 3), torch.randn(5, 4), torch.randn(6, 4)
    gm = trace_aten(fn, *args)
    assert count(gm, aten.permute.default) > 0
    assert sink_transposes(gm) is True
    gm.recompile()
    assert count(gm, aten.mm.default) == 0
    assert count(gm, dot_general.default) == 3
    assert count(gm, aten.permute.default) == 0  # each permute's only user was a matmul
    for got, want in zip(gm(*args), fn(*args), strict=True):
        torch.testing.assert_close(got, want)


def test_bmm_of_permuted_operands_keeps_batch_first():
    def fn(x, y, z):
        return torch.bmm(x.transpose(1, 2), y), torch.bmm(y.transpose(1, 2), z.transpose(1, 2))

    x, y, z = torch.randn(2, 5, 3), torch.randn(2, 5, 4), torch.randn(2, 6, 5)
    gm = trace_aten(fn, x, y, z)
    assert sink_transposes(gm) is True
    gm.recompile()
    assert count(gm, aten.bmm.default) == 0
    dims = [n.args[2:] for n in gm.graph.nodes if n.target is dot_general.default]
    assert dims == [([1], [1], [0], [0]), ([1], [2], [0], [0])]
    for got, want in zip(gm(x, y, z), fn(x, y, z), strict=True):
        torch.testing.assert_close(got, want)


def test_new_node_meta_is_a_fake_tensor_of_the_matmul_type():
    gm = trace_aten(lambda a, b: a.t() @ b, torch.randn(5, 3), torch.randn(5, 4))
    sink_transposes(gm)
    node = next(n for n in gm.graph.nodes if n.target is dot_general.default)
    val = node.meta["val"]
    assert isinstance(val, FakeTensor) and tuple(val.shape) == (3, 4)


def test_permute_that_moves_the_batch_dim_is_left_alone():
    def body(g, x, y):
        p = g.call_function(aten.permute.default, (x, [1, 0, 2]))
        p.meta["val"] = torch.empty(2, 3, 5)
        mm = g.call_function(aten.bmm.default, (p, y))
        mm.meta["val"] = torch.empty(2, 3, 4)
        return mm

    gm = build(2, body)
    assert sink_transposes(gm) is False
    assert targets(gm) == [aten.permute.default, aten.bmm.default]


def test_permute_with_other_users_stays_and_no_op_is_added():
    def fn(a, b):
        t = a.t()
        return t @ b, t.exp()

    args = torch.randn(5, 3), torch.randn(5, 4)
    gm = trace_aten(fn, *args)
    before = len(gm.graph.nodes)
    assert sink_transposes(gm) is True
    gm.recompile()
    assert len(gm.graph.nodes) == before
    assert count(gm, aten.permute.default) == 1
    for got, want in zip(gm(*args), fn(*args), strict=True):
        torch.testing.assert_close(got, want)


def test_integer_and_untransposed_matmuls_are_unchanged():
    gm = trace_aten(lambda a, b: a @ b, torch.randn(3, 5), torch.randn(5, 4))
    assert sink_transposes(gm) is False
    gm = trace_aten(
        lambda a, b: a.t() @ b,
        torch.ones(5, 3, dtype=torch.int32),
        torch.ones(5, 4, dtype=torch.int32),
    )
    assert sink_transposes(gm) is False


def test_second_run_changes_nothing():
    gm = trace_aten(lambda a, b: a.t() @ b, torch.randn(5, 3), torch.randn(5, 4))
    assert sink_transposes(gm) is True
    nodes = [(n.op, n.target, n.args) for n in gm.graph.nodes]
    assert sink_transposes(gm) is False
    assert [(n.op, n.target, n.args) for n in gm.graph.nodes] == nodes


def test_logs_what_it_changed(caplog):
    gm = trace_aten(lambda a, b: a.t() @ b, torch.randn(5, 3), torch.randn(5, 4))
    with caplog.at_level(logging.DEBUG, logger="neuron_compile.passes"):
        sink_transposes(gm)
    assert any("sink_transposes: rewrote 1 matmuls" in r.getMessage() for r in caplog.records)


def test_backward_of_matmul_lowers_with_fewer_transposes_and_same_gradients():
    """The acceptance case: AOTAutograd's backward of ``x @ w`` is ``mm(g, w.t())`` and
    ``mm(x.t(), g)``; with the pipeline, its StableHLO has no transposes left."""
    counts: list[tuple[int, int]] = []

    def compiler(gm, _inputs):
        plain = lower_graph(gm).text.count("stablehlo.transpose")
        run_pipeline(gm, PIPELINE)
        counts.append((plain, lower_graph(gm).text.count("stablehlo.transpose")))
        return make_boxed_func(gm)

    def fn(x, w):
        return (x @ w).tanh()

    compiled = aot_function(
        fn,
        compiler,
        compiler,
        partition_fn=default_partition,
        decompositions=decomposition_table(),
    )
    torch.manual_seed(0)
    x, w = torch.randn(6, 5, requires_grad=True), torch.randn(5, 3, requires_grad=True)
    compiled(x, w).sum().backward()
    x2, w2 = x.detach().requires_grad_(), w.detach().requires_grad_()
    fn(x2, w2).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)
    torch.testing.assert_close(w.grad, w2.grad)
    (_, _), (bw_before, bw_after) = counts
    assert bw_before >= 2 and bw_after == 0


def test_torch_compile_numerics_unchanged():
    def fn(x, w):
        return torch.bmm(x.transpose(1, 2), w).relu()

    x = torch.randn(2, 5, 3, requires_grad=True)
    w = torch.randn(2, 5, 4, requires_grad=True)
    neuron_compile.clear_fallback_ops()
    got = torch.compile(fn, backend="neuron_compile")(x, w)
    got.sum().backward()
    x2, w2 = x.detach().requires_grad_(), w.detach().requires_grad_()
    want = fn(x2, w2)
    want.sum().backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(x.grad, x2.grad)
    torch.testing.assert_close(w.grad, w2.grad)
    assert neuron_compile.get_fallback_ops() == {}  # dot_general ran through its lowering


def test_dot_general_on_empty_operands_matches_mm():
    dot = torch.ops.neuron_compile.dot_general
    for m, k, n in [(0, 3, 4), (2, 0, 4), (2, 3, 0)]:
        a, b = torch.randn(m, k), torch.randn(n, k)
        torch.testing.assert_close(dot(a, b, [1], [1], [], []), a @ b.t())
    a, b = torch.randn(2, 0, 3), torch.randn(2, 4, 3)
    torch.testing.assert_close(dot(a, b, [2], [2], [0], [0]), torch.bmm(a, b.transpose(1, 2)))


def _linear(x, w, b):
    return torch.nn.functional.linear(x, w, b)


def test_inference_linear_addmm_loses_its_transpose():
    x, w, b = torch.randn(4, 8), torch.randn(16, 8), torch.randn(16)
    gm = trace_aten(_linear, x, w, b)
    assert count(gm, aten.addmm.default) == 1
    assert sink_transposes(gm) is True
    assert targets(gm) == [torch.ops.neuron_compile.dot_general.default, aten.add.Tensor]
    gm.recompile()
    torch.testing.assert_close(gm(x, w, b), _linear(x, w, b))
    assert "stablehlo.transpose" not in lower_graph(gm).text
    assert sink_transposes(gm) is False
    torch.testing.assert_close(run_lowered(_linear, x, w, b)[0], _linear(x, w, b))


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, w, b: torch.addmm(b, x, w.t(), beta=0.5),  # not bias + a @ b
        lambda x, w, b: (torch.addmm(b, x, t := w.t()), t * 2),  # the transpose stays alive
    ],
)
def test_addmm_that_would_not_lose_a_transpose_stays(fn):
    gm = trace_aten(fn, torch.randn(4, 8), torch.randn(16, 8), torch.randn(16))
    before = targets(gm)
    assert sink_transposes(gm) is False
    assert targets(gm) == before


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_linear_addmm_keeps_eagers_single_rounding(dtype):
    """Eager adds a half-precision bias to the float32 product and rounds once; the split
    ``add(dot_general, bias)`` rounded the product first: 1 + eps/2 - 1 came out 0."""
    eps = torch.finfo(dtype).eps / 2  # 1 + eps is not representable: rounds to 1
    x = torch.tensor([[1.0, 1.0]], dtype=dtype)
    w, b = torch.tensor([[1.0, eps]], dtype=dtype), torch.tensor([-1.0], dtype=dtype)
    gm = trace_aten(_linear, x, w, b)
    assert sink_transposes(gm) is False and count(gm, aten.addmm.default) == 1
    torch._dynamo.reset()
    out = torch.compile(_linear, backend="neuron")(x, w, b)
    assert torch.equal(out, _linear(x, w, b)) and out.item() == eps
