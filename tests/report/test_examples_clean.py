"""The example models report clean: no findings in any category, numerics equal to eager."""

from __future__ import annotations

import pytest
import torch

from neuron_compile.report import Collector, formats


def _mlp():
    import train_mlp

    torch.manual_seed(0)
    train_mlp.train(train_mlp.MLP(), train_mlp.make_data(2), backend="neuron")


def _gpt():
    import train_gpt

    torch.manual_seed(0)
    cfg = train_gpt.GPTConfig()
    train_gpt.train(train_gpt.TinyGPT(cfg), train_gpt.make_batches(cfg, 2), backend="neuron")


def _conv():
    import conv_net

    torch.manual_seed(0)
    model = conv_net.ConvNet()
    batches = conv_net.make_data(2, batch=8)
    conv_net.train(model, batches, backend="neuron")
    conv_net.evaluate(model, batches[0][0], backend="neuron")


@pytest.mark.parametrize("run", [_mlp, _gpt, _conv], ids=["train_mlp", "train_gpt", "conv_net"])
def test_example_reports_are_clean(run):
    with Collector(run.__name__, "run") as c:
        run()
    report = c.report()
    assert report.findings == [], formats.render_terminal(report, ())
    kinds = {g.kind for g in report.graphs}
    assert {"forward", "backward"} <= kinds and all(g.status == "ok" for g in report.graphs)
    compared = [g.numerics for g in report.graphs if g.numerics]
    assert compared and set(compared) == {"matched"}
    if run is _conv:  # train, then eval: a second program by design, listed but not a finding
        assert [g.recompile for g in report.graphs].count(True) == 1
    md = formats.render_markdown(report, ("compile-error", "graph-break", "fallback"))
    assert md.startswith("## :white_check_mark: neuron-compile check")
    assert "no gated findings" in md.splitlines()[0]
