"""The Dynamo entry: registration, options, static shapes, 64-bit policy, coded errors, metrics."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import neuron_compile
from neuron_compile.compiler import DowncastWarning
from neuron_compile.errors import NeuronCompileError
from neuron_compile.fallback import FallbackWarning
from neuron_compile.shapes import RecompileWarning
from tests.custom_ops import cpu_scan


def _run_python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=300,
    )


def _root_cause(exc: BaseException) -> BaseException:
    """Our coded error in what a compiled call raised: the exception itself (our errors leave
    torch.compile unwrapped, ``errors.through_dynamo``), else its ``__cause__`` chain, else
    what Dynamo's BackendCompilerFailed wraps (someone else's exception)."""
    while not isinstance(exc, NeuronCompileError) and exc.__cause__ is not None:
        exc = exc.__cause__
    return exc if isinstance(exc, NeuronCompileError) else getattr(exc, "inner_exception", exc)


def _compile_error(fn, *args, **compile_kwargs) -> NeuronCompileError:
    """The coded error a compile raised: our errors leave torch.compile as themselves, not
    wrapped in Dynamo's BackendCompilerFailed (``errors.through_dynamo``)."""
    with pytest.raises(NeuronCompileError) as info:
        torch.compile(fn, **{"backend": "neuron", **compile_kwargs})(*args)
    return info.value


# ---- registration -------------------------------------------------------------------------
def test_backend_resolves_through_entry_point_without_import():
    proc = _run_python(
        """
        import sys, torch
        assert "neuron_compile" not in sys.modules
        names = torch._dynamo.list_backends()
        assert "neuron" in names and "neuron_compile" in names, names
        f = torch.compile(lambda x: torch.relu(x) * 2 + 1, backend="neuron")
        x = torch.randn(5)
        assert torch.allclose(f(x), torch.relu(x) * 2 + 1)
        assert "neuron_compile" in sys.modules
        import neuron_compile
        print("graphs", len(neuron_compile.metrics()))
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert "graphs 1" in proc.stdout


def test_set_default_backend_selects_us_and_import_does_not():
    proc = _run_python(
        """
        import torch, neuron_compile
        assert torch.compiler.get_default_backend() == "inductor"  # import changed nothing
        torch.compiler.set_default_backend("neuron")
        f = torch.compile(lambda x: x.sin() + x.cos())
        x = torch.randn(3, 4)
        assert torch.allclose(f(x), x.sin() + x.cos(), atol=1e-6)
        print([r.kind for r in neuron_compile.metrics()])
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert "['inference']" in proc.stdout


def test_name_clash_with_another_distribution_warns_once(tmp_path):
    # Test double: a fake distribution standing in for AWS torch-neuronx, which registers the
    # same entry-point name but cannot be installed here (its PyPI package is a placeholder).
    dist = tmp_path / "fake_torch_neuronx-0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: fake-torch-neuronx\nVersion: 0.0\n"
    )
    (dist / "entry_points.txt").write_text(
        "[torch_dynamo_backends]\nneuron = fake_torch_neuronx:backend\n"
    )
    proc = _run_python(
        """
        import warnings, torch
        warnings.simplefilter("always")
        with warnings.catch_warnings(record=True) as caught:
            f = torch.compile(lambda x: x + 1, backend="neuron_compile")
            assert torch.equal(f(torch.ones(2)), torch.full((2,), 2.0))
            g = torch.compile(lambda x: x * 3, backend="neuron_compile")
            g(torch.ones(2))
        clash = [str(w.message) for w in caught if "registered by" in str(w.message)]
        print(len(clash)); print(clash[0] if clash else "")
        """,
        env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"},
    )
    assert proc.returncode == 0, proc.stderr
    count, message = proc.stdout.strip().splitlines()[:2]
    assert count == "1"
    assert "fake-torch-neuronx" in message and "backend='neuron_compile'" in message


def test_no_clash_warning_without_other_distribution():
    from neuron_compile import registration

    assert registration.other_registrations("neuron") == []


# ---- options and mode ---------------------------------------------------------------------
def test_unknown_option_lists_valid_keys():
    err = _compile_error(lambda x: x + 1, torch.ones(2), options={"dump_dri": "/tmp/x"})
    assert err.code == "NC001"
    assert "dump_dri" in str(err) and "dump_dir" in str(err) and "sixty_four_bit" in str(err)


def test_invalid_option_value_is_coded():
    err = _compile_error(lambda x: x + 1, torch.ones(2), options={"sixty_four_bit": "sometimes"})
    assert err.code == "NC001" and "downcast" in str(err)


def test_prefixed_option_key_and_model_name():
    f = torch.compile(lambda x: x * 2, backend="neuron", options={"neuron.model_name": "MyModel"})
    f(torch.ones(3))
    assert neuron_compile.metrics()[0].name.startswith("MyModel_")


def test_non_default_mode_warns_once_and_still_compiles():
    from neuron_compile import backend

    backend._warned.discard("mode:max-autotune")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        f = torch.compile(lambda x: x - 1, backend="neuron", mode="max-autotune")
        g = torch.compile(lambda x: x + 5, backend="neuron", mode="max-autotune")
        assert torch.equal(f(torch.ones(2)), torch.zeros(2))
        g(torch.ones(2))
    mode_warnings = [w for w in caught if "mode='max-autotune'" in str(w.message)]
    assert len(mode_warnings) == 1


# ---- static shapes ------------------------------------------------------------------------
def test_dynamic_true_is_rejected_with_input_and_dim():
    err = _compile_error(lambda x: x.sin(), torch.randn(3, 4), dynamic=True)
    assert err.code == "NC201"
    assert "dynamic=True" in str(err) and "dim 0" in str(err) and "dynamic=False" in err.hint


def test_mark_dynamic_is_rejected_naming_the_dim():
    x = torch.randn(5, 3)
    torch._dynamo.mark_dynamic(x, 0)
    err = _compile_error(lambda t: t * 2, x)
    assert err.code == "NC201" and "mark_dynamic" in str(err) and "dim 0" in str(err)


class Doubler(torch.nn.Module):
    def forward(self, x):
        return (x * 2).sum(0)


def test_automatic_dynamic_specializes_per_shape_and_counts_recompiles():
    f = torch.compile(Doubler(), backend="neuron")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (2, 3, 4, 3):
            x = torch.randn(n, 4)
            torch.testing.assert_close(f(x), (x * 2).sum(0))
    recompiles = [str(w.message) for w in caught if issubclass(w.category, RecompileWarning)]
    assert len(recompiles) == 2  # 3 and 4 are new specializations; the second 3 is reused
    assert "dim 0=3" in recompiles[0] and "dim 0=4" in recompiles[1]
    records = neuron_compile.metrics()
    assert [r.recompile for r in records] == [False, True, True]
    assert all(r.name.startswith("Doubler_") for r in records)


def test_dynamic_false_compiles_each_shape_statically():
    f = torch.compile(lambda x: x + 1, backend="neuron", dynamic=False)
    assert torch.equal(f(torch.zeros(2)), torch.ones(2))
    with pytest.warns(RecompileWarning, match=r"x dim 0=3 \(was 2\)"):
        assert torch.equal(f(torch.zeros(3)), torch.ones(3))
    assert len(neuron_compile.metrics()) == 2


# ---- 64-bit policy ------------------------------------------------------------------------
def test_float64_runs_as_float32_with_one_warning_per_graph():
    x = torch.randn(16, dtype=torch.float64)
    f = torch.compile(lambda t: torch.exp(t) * 3, backend="neuron")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = f(x)
        f(x)
    downcasts = [w for w in caught if issubclass(w.category, DowncastWarning)]
    assert len(downcasts) == 1 and "float64" in str(downcasts[0].message)
    # Ops that only carry the float64 input along are covered by the input's entry.
    assert "computing float64" not in str(downcasts[0].message)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, torch.exp(x) * 3, rtol=1e-6, atol=1e-6)
    assert neuron_compile.metrics()[0].downcasts


def test_float64_policy_error():
    err = _compile_error(
        lambda t: t + 1, torch.ones(2, dtype=torch.float64), options={"sixty_four_bit": "error"}
    )
    assert err.code == "NC104" and "float64" in str(err)


def test_int64_indices_round_trip_as_int64():
    f = torch.compile(lambda i, w: (w[i], i * 2), backend="neuron")
    idx = torch.tensor([3, 0, 2])
    w = torch.randn(4, 5)
    with pytest.warns(DowncastWarning, match=r"i \(int64 -> int32\)"):  # i * 2: not an index
        rows, doubled = f(idx, w)
    assert doubled.dtype == torch.int64 and torch.equal(doubled, idx * 2)
    torch.testing.assert_close(rows, w[idx])


# ---- coded errors -------------------------------------------------------------------------
def test_unsupported_op_with_fallback_error_names_op_and_user_line():
    def uses_custom_op(x):
        return cpu_scan(x) + 1  # the line the error must point at

    err = _compile_error(uses_custom_op, torch.randn(4), options={"fallback": "error"})
    assert err.code == "NC101"
    assert "nctest.cpu_scan" in str(err)
    assert "test_backend.py" in err.where and "uses_custom_op" in err.where
    assert "cpu_scan(x) + 1" in str(err)
    assert "fallback" in err.hint


def test_verifier_error_is_a_coded_bug_report_naming_the_node(monkeypatch):
    from neuron_compile.lowering import registry

    aten = torch.ops.aten
    key = (aten.sin.default, registry.REFERENCE)

    def broken_rule(ctx, x):  # passes our Python type check, fails the MLIR verifier
        return ctx.emit.op1("add", [x], x.type)

    monkeypatch.setitem(
        registry._LOWERINGS,
        key,
        registry.Lowering(broken_rule, registry.always, registry.REFERENCE),
    )

    def model(x):
        return torch.sin(x) * 2

    err = _compile_error(model, torch.randn(3))
    assert err.code == "NC103"
    assert err.node_name == "sin" and "model" in err.where
    assert "bug" in err.hint


def test_errors_survive_pickling():
    import pickle

    err = _compile_error(cpu_scan, torch.randn(4), options={"fallback": "error"})
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err) and back.code == "NC101" and str(back) == str(err)


# ---- metrics ------------------------------------------------------------------------------
def test_metrics_name_kinds_and_calls():
    model = torch.nn.Linear(4, 2)
    f = torch.compile(model, backend="neuron")
    x = torch.randn(3, 4)
    f(x).sum().backward()
    f(x)
    records = neuron_compile.metrics()
    assert [r.kind for r in records] == ["forward", "backward"]
    fwd, bwd = records
    assert fwd.name.startswith("Linear_") and fwd.name.endswith("_forward_0")
    assert bwd.name == fwd.name.replace("forward", "backward")
    assert fwd.calls == 2 and bwd.calls == 1
    assert fwd.node_count > 0 and fwd.lowering_s > 0 and fwd.verify_s > 0
    assert fwd.executor_compile_s > 0 and fwd.capture_s > 0
    neuron_compile.reset_metrics()
    assert neuron_compile.metrics() == []


def test_int64_narrowing_is_announced_with_the_users_input_names():
    def f(token_ids, w):
        return w[token_ids + 1].sum() * 3  # the backward reads the saved int64 token_ids + 1

    g = torch.compile(f, backend="neuron")
    w = torch.randn(5, 2, requires_grad=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g(torch.tensor([1, 2]), w).backward()
    messages = [str(w.message) for w in caught if issubclass(w.category, DowncastWarning)]
    # Once per model, not per graph; the backward's saved token_ids + 1 is not the user's
    # business (the forward computed it narrowed) and is not listed.
    assert len(messages) == 1 and "would wrap" in messages[0], messages
    # The argument as the user wrote it, not AOTAutograd's primals_N or an FX node name.
    assert "token_ids (int64 -> int32)" in messages[0]
    assert "primals_" not in messages[0] and "%" not in messages[0]
    downcast = next(w for w in caught if issubclass(w.category, DowncastWarning))
    assert downcast.filename == __file__  # the user's line, not neuron_compile's


def test_executor_failure_at_run_time_is_coded(monkeypatch):
    from neuron_compile.runtime import xla_cpu

    f = torch.compile(lambda x: x + 1, backend="neuron")
    f(torch.ones(2))

    def broken(self, arrays, *args):
        raise RuntimeError("device lost")

    # Every call, first or planned, executes through ``run``.
    monkeypatch.setattr(xla_cpu.XlaCpuExecutable, "run", broken)
    with pytest.raises(NeuronCompileError) as info:
        f(torch.ones(2))
    assert info.value.code == "NC301" and "device lost" in str(info.value)


def test_buckets_option_of_the_wrong_type_is_coded():
    err = _compile_error(lambda x: x + 1, torch.ones(2), options={"buckets": 128})
    assert err.code == "NC001" and "buckets" in str(err)


def test_hlo_artifact_is_dumped_as_an_hlo_module_proto(tmp_path):
    from neuron_compile.artifact import artifact_text

    options = {"artifact": "hlo", "dump_dir": str(tmp_path)}
    f = torch.compile(lambda x: x * 2 + 1, backend="neuron", options=options)
    torch.testing.assert_close(f(torch.ones(3)), torch.full((3,), 3.0))
    (proto,) = tmp_path.glob("*/module.hlo.pb")
    assert "stablehlo.multiply" in artifact_text(proto.read_bytes(), "hlo")
    assert not list(tmp_path.glob("*/*.mlirbc"))


def test_nested_tensor_input_runs_eagerly_with_a_warning_or_nc201():
    # A jagged nested tensor has a ragged dim no static graph can take.
    nt = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)], layout=torch.jagged)
    f = torch.compile(lambda ragged: ragged * 2, backend="neuron")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = f(nt)
    torch.testing.assert_close(out.values(), nt.values() * 2)
    messages = [str(w.message) for w in caught if issubclass(w.category, FallbackWarning)]
    assert len(messages) == 1 and "nested (ragged) tensor input ragged" in messages[0]
    assert "to_padded_tensor" in messages[0]

    torch._dynamo.reset()
    err = _compile_error(lambda ragged: ragged * 2, nt, options={"fallback": "error"})
    assert err.code == "NC201" and "ragged" in str(err)


def test_float64_made_inside_the_graph_is_announced_and_an_error_under_the_policy():
    def f(a):
        return (a.double() + 1e-12) - a.double()  # 1e-12 vanishes in float32

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.compile(f, backend="neuron")(torch.ones(3))
    messages = [str(w.message) for w in caught if issubclass(w.category, DowncastWarning)]
    assert len(messages) == 1 and "op(s) computing float64" in messages[0]
    assert "test_backend.py" in messages[0]  # where the first one is

    torch._dynamo.reset()
    err = _compile_error(f, torch.ones(3), options={"sixty_four_bit": "error"})
    assert err.code == "NC104" and "computing float64" in str(err)


def test_int64_sums_of_narrower_integers_are_announced():
    """Eager sums int32 into int64; narrowed, the sum wraps (3 * 2**30 gave -2**30) and no
    input was 64-bit, so nothing said so."""

    def f(x):
        return x.sum(), x.cumsum(0), x * 2

    x = torch.full((3,), 2**30, dtype=torch.int32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.compile(f, backend="neuron")(x)
    messages = [str(w.message) for w in caught if issubclass(w.category, DowncastWarning)]
    assert len(messages) == 1 and "2 op(s) computing int64" in messages[0]
    assert "(int64 -> int32)" in messages[0] and "test_backend.py" in messages[0]

    # int32 arithmetic narrows nothing; a mask's count or a uint8 sum always fits int32
    for fn, arg in [
        (lambda x: (x * 2).amax(), x),
        (lambda b: (b.sum(1), b.cumsum(0), b.prod()), torch.rand(4, 6) > 0.5),
        (lambda u: u.sum(), torch.full((1000,), 255, dtype=torch.uint8)),
    ]:
        torch._dynamo.reset()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.compile(fn, backend="neuron")(arg)
        assert not [w for w in caught if issubclass(w.category, DowncastWarning)]
