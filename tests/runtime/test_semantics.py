"""Runtime semantics of compiled graphs: mutation, aliasing, None gradients, non-contiguous inputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import torch


def test_input_mutation_is_applied_to_the_callers_tensor():
    def f(x, y):
        x.add_(1)
        return x * y

    x, y = torch.randn(4), torch.randn(4)
    x_ref = x.clone()
    out = torch.compile(f, backend="neuron")(x, y)
    x_ref.add_(1)
    torch.testing.assert_close(x, x_ref)
    torch.testing.assert_close(out, x_ref * y)


def test_output_that_is_a_view_of_an_input_aliases_it():
    f = torch.compile(lambda x: (x.view(2, 3), x.sum()), backend="neuron")
    x = torch.arange(6.0)
    view, total = f(x)
    x[0] = 100.0
    assert view[0, 0].item() == 100.0  # eager semantics: a view, not a copy
    assert total.item() == 15.0


def test_gradient_of_unused_input_is_none_and_others_match():
    def f(a, b, c):
        return (a * b).sum()

    a, b, c = (torch.randn(3, requires_grad=True) for _ in range(3))
    torch.compile(f, backend="neuron")(a, b, c).backward()
    assert c.grad is None
    torch.testing.assert_close(a.grad, b.detach())
    torch.testing.assert_close(b.grad, a.detach())


def test_non_contiguous_and_offset_inputs():
    base = torch.randn(6, 8)
    x = base.t()[1:]  # non-contiguous, non-zero storage offset
    f = torch.compile(lambda t: t * 2 + 1, backend="neuron")
    torch.testing.assert_close(f(x), x * 2 + 1)


def test_bool_and_int_inputs_and_outputs():
    f = torch.compile(lambda m, i: (m & (i > 0), i + 1), backend="neuron")
    m = torch.tensor([True, False, True])
    i = torch.tensor([1, 2, -3], dtype=torch.int32)
    mask, inc = f(m, i)
    assert mask.dtype == torch.bool and torch.equal(mask, m & (i > 0))
    assert inc.dtype == torch.int32 and torch.equal(inc, i + 1)


def test_dump_dir_env_and_debug_log(tmp_path):
    code = textwrap.dedent(
        """
        import torch
        f = torch.compile(lambda x: torch.tanh(x) + 1, backend="neuron")
        f(torch.randn(3))
        """
    )
    env = {**os.environ, "NEURON_COMPILE_DUMP_DIR": str(tmp_path), "NEURON_COMPILE_LOG": "debug"}
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert "[neuron_compile" in proc.stderr and "compiled " in proc.stderr  # logging, not print
    (graph_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert graph_dir.name.endswith("_inference_0")
    names = {p.name for p in graph_dir.iterdir()}
    assert {"graph.fx.py", "module.stablehlo.mlir", "module.portable.mlirbc", "meta.json"} <= names
    meta = json.loads((graph_dir / "meta.json").read_text())
    assert meta["inputs"][0]["shape"] == [3] and meta["versions"]["stablehlo"]
    assert "stablehlo.tanh" in (graph_dir / "module.stablehlo.mlir").read_text()
    assert (graph_dir / "module.portable.mlirbc").read_bytes()[:4] == b"ML\xefR"


def test_executed_artifact_is_the_serialized_portable_artifact(monkeypatch):
    """What XLA ran is byte-for-byte the artifact neuronx-cc would receive."""
    from neuron_compile import artifact
    from neuron_compile.cache import executable_cache
    from neuron_compile.compiler import compile_graph
    from neuron_compile.config import NeuronConfig
    from neuron_compile.runtime import xla_cpu
    from tests.helpers import trace_aten

    seen: list[bytes] = []
    original = xla_cpu.XlaCpuExecutable.__init__

    def spy(self, art, **kwargs):
        seen.append(art)
        original(self, art, **kwargs)

    monkeypatch.setattr(xla_cpu.XlaCpuExecutable, "__init__", spy)
    executable_cache.clear()
    gm = trace_aten(lambda x: x.exp() * 3, torch.randn(5))
    compiled = compile_graph(gm, [torch.randn(5)], name="t", kind="inference", cfg=NeuronConfig())
    assert len(seen) == 1
    assert seen[0] == artifact.serialize(compiled.lowered.text, "portable")
    assert "stablehlo.exponential" in artifact.deserialize_portable(seen[0])
    x = torch.randn(5)
    torch.testing.assert_close(compiled([x])[0], x.exp() * 3)
