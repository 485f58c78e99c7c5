"""PIPELINE on AOTAutograd forward/backward graphs: order, numerics, idempotence, logging."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from torch._functorch.aot_autograd import aot_function, make_boxed_func
from torch._functorch.partitioners import default_partition

from neuron_compile.passes import PIPELINE, pipeline_for, run_pipeline

aten = torch.ops.aten


def _attention(x, w_qkv, w_out):
    b, t, d = x.shape
    q, k, v = (x @ w_qkv).split(d, dim=2)
    q, k, v = (z.view(b, t, 2, d // 2).transpose(1, 2) for z in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    y = y.transpose(1, 2).reshape(b, t, d) @ w_out
    return F.layer_norm(y + x, (d,)).clone().sum(-1).exp()


def _compile_with_pipeline(fn, seen):
    def compiler(gm, _inputs):
        nodes_before = len(gm.graph.nodes)
        changed = run_pipeline(gm, PIPELINE)
        seen.append((nodes_before, len(gm.graph.nodes), changed, run_pipeline(gm, PIPELINE)))
        return make_boxed_func(gm)

    return aot_function(fn, compiler, compiler, partition_fn=default_partition)


def test_order_is_rebase_functionalize_noops_casts_permutes_cse_constants_transposes_dce():
    assert [p.__name__ for p in PIPELINE] == [
        "rebase_strided_views",
        "functionalize_inplace",
        "remove_noops",
        "collapse_casts",
        "fold_permutes",
        "eliminate_common_subexpressions",
        "fold_constants",
        "sink_transposes",
        "eliminate_dead_code",
    ]


def test_forward_and_backward_numerics_unchanged_and_idempotent():
    torch.manual_seed(0)
    args = [torch.randn(2, 5, 8), torch.randn(8, 24) / 3, torch.randn(8, 8) / 3]
    ref_args = [a.clone().requires_grad_() for a in args]
    ref = _attention(*ref_args)
    ref.sum().backward()

    seen: list = []
    got_args = [a.clone().requires_grad_() for a in args]
    got = _compile_with_pipeline(_attention, seen)(*got_args)
    got.sum().backward()

    torch.testing.assert_close(got, ref)
    for g, r in zip(got_args, ref_args, strict=True):
        torch.testing.assert_close(g.grad, r.grad)
    assert len(seen) == 2  # forward and backward
    for before, after, _changed, second in seen:
        assert after <= before
        assert second == []  # a second run of the whole pipeline changes nothing
    assert any(changed for _, _, changed, _ in seen)


def test_every_pass_logs_what_it_changed(caplog):
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    with caplog.at_level(logging.DEBUG, logger="neuron_compile.passes"):
        run_pipeline(gm, PIPELINE)
    for graph_pass in PIPELINE:
        assert any(graph_pass.__name__ + ":" in r.getMessage() for r in caplog.records)


def test_dump_writes_the_input_and_each_changing_pass(tmp_path):
    from tests.helpers import trace_aten

    gm = trace_aten(lambda x: (x.clone().t().t() + 1).sum(), torch.randn(3, 4))
    changed = run_pipeline(gm, PIPELINE, dump_to=tmp_path)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files[0] == "00_input.fx.py"
    assert [f.split("_", 1)[1].removesuffix(".fx.py") for f in files[1:]] == changed
    assert "clone" in (tmp_path / "00_input.fx.py").read_text()
    assert "clone" not in (tmp_path / files[-1]).read_text()


def test_trn_order_rewrites_neuron_calls_right_after_fold_permutes():
    """Before CSE, which could give a pattern's interior an outside user; CPU never runs it."""
    names = [p.__name__ for p in pipeline_for("trn2")]
    at = names.index("fold_permutes") + 1
    assert names[at] == "rewrite_neuron_calls"
    assert names.index("eliminate_common_subexpressions") > at
    assert names[:at] + names[at + 1 :] == [p.__name__ for p in PIPELINE]
    assert [p.__name__ for p in pipeline_for("trn3")] == names
    assert pipeline_for("cpu") == PIPELINE


def _two_ops(x):
    return (x + 1) * 2


def _reorder_breaks_graph(gm):
    """A broken pass: moves the graph's last op before the op it reads."""
    add, mul = [n for n in gm.graph.nodes if n.op == "call_function"]
    add.prepend(mul)
    return True


def _noop_change(gm):
    return True


@pytest.mark.parametrize("lint_each", [False, True])
def test_malformed_graph_names_the_pass_when_linting_each(monkeypatch, lint_each):
    # The env var is read when the pipeline runs, not when the package is imported.
    from neuron_compile.errors import LoweringError
    from neuron_compile.passes import base
    from neuron_compile.passes.base import LINT_ENV

    monkeypatch.setenv(LINT_ENV, "1" if lint_each else "0")
    monkeypatch.setattr(base.log, "isEnabledFor", lambda level: False)  # DEBUG would lint each
    gm = torch.fx.symbolic_trace(_two_ops)
    with pytest.raises(LoweringError) as info:
        run_pipeline(gm, (_reorder_breaks_graph, _noop_change))
    message = str(info.value)
    if lint_each:
        assert "pass _reorder_breaks_graph left the graph malformed" in message
    else:
        assert "after passes _reorder_breaks_graph, _noop_change" in message and LINT_ENV in message
