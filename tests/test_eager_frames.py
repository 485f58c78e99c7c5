"""``neuron_compile.eager_frames()``: compiled frames Dynamo skipped, so they ran eagerly."""

from __future__ import annotations

import inspect

import torch
import torch.nn as nn

import neuron_compile


class GruClassifier(nn.Module):
    """Dynamo skips ``nn.GRU`` (and the whole frame calling it) unless ``allow_rnn`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(100, 16)
        self.rnn = nn.GRU(16, 32, num_layers=2, batch_first=True)
        self.head = nn.Linear(32, 4)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.emb(tokens))
        return self.head(out[:, -1])


class PrintingMlp(nn.Module):
    """An ordinary graph break: two graphs reach the backend, nothing runs eagerly."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.a(x))
        print("between the layers")
        return self.b(x)


def _tokens() -> torch.Tensor:
    return torch.randint(0, 100, (2, 6))


def _fresh() -> None:
    # Dynamo marks a skipped code object and never tries it again in this process.
    torch._dynamo.reset()
    neuron_compile.reset_metrics()


def test_a_skipped_gru_frame_is_recorded_with_its_line_reason_and_fix():
    _fresh()
    model = GruClassifier()
    tokens = _tokens()
    torch.testing.assert_close(torch.compile(model, backend="neuron")(tokens), model(tokens))
    assert len(neuron_compile.metrics()) == 0  # nothing reached the backend
    (frame,) = neuron_compile.eager_frames()
    assert isinstance(frame, neuron_compile.EagerFrame)
    assert frame.function == "GruClassifier.forward"
    assert frame.file == __file__
    def_line = inspect.getsourcelines(GruClassifier.forward)[1]
    assert frame.line == def_line
    assert frame.failed_at == f"{__file__}:{def_line + 1}"  # the self.rnn(...) line
    assert "RNN, GRU, or LSTM" in frame.reason and "\n" not in frame.reason
    assert frame.fix == "set torch._dynamo.config.allow_rnn = True before compiling"
    # the same frame again: Dynamo does not retry it, and the record is not duplicated
    torch.compile(model, backend="neuron")(_tokens())
    assert len(neuron_compile.eager_frames()) == 1


def test_reset_metrics_and_reset_clear_eager_frames():
    _fresh()
    torch.compile(GruClassifier(), backend="neuron")(_tokens())
    assert neuron_compile.eager_frames()
    neuron_compile.reset_metrics()
    assert neuron_compile.eager_frames() == []
    torch._dynamo.reset()
    torch.compile(GruClassifier(), backend="neuron")(_tokens())
    assert neuron_compile.eager_frames()
    neuron_compile.reset()
    assert neuron_compile.eager_frames() == []


def test_an_ordinary_graph_break_is_not_an_eager_frame():
    _fresh()
    torch.compile(PrintingMlp(), backend="neuron")(torch.randn(3, 8))
    assert len(neuron_compile.metrics()) == 2  # one graph on each side of the print
    assert neuron_compile.eager_frames() == []


def test_with_allow_rnn_the_gru_compiles_and_no_frame_runs_eagerly():
    _fresh()
    model = GruClassifier()
    tokens = _tokens()
    with torch._dynamo.config.patch(allow_rnn=True):
        out = torch.compile(model, backend="neuron")(tokens)
    torch.testing.assert_close(out, model(tokens), rtol=1e-4, atol=1e-5)
    assert len(neuron_compile.metrics()) >= 1
    assert neuron_compile.eager_frames() == []


def test_frames_are_recorded_after_torch_dynamo_reset_dropped_the_callbacks():
    _fresh()
    torch.compile(PrintingMlp(), backend="neuron")(torch.randn(3, 8))  # re-registers them
    torch._dynamo.reset()  # clears Dynamo's compile callbacks
    neuron_compile.reset_metrics()
    torch.compile(GruClassifier(), backend="neuron")(_tokens())
    assert [f.function for f in neuron_compile.eager_frames()] == ["GruClassifier.forward"]
