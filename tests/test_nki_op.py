"""``neuron_compile.nki_op``: eager, fake, autograd, one FX node, and the trn custom call (with
the ``nki`` TEST DOUBLE of ``tests/nki_double.py``) or the reference fallback without ``nki``."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import Tensor

import neuron_compile
import neuron_compile.trainium.legality as legality_mod
from neuron_compile.errors import NkiOpError
from neuron_compile.shapes import RecompileWarning
from neuron_compile.trainium.kernels import nki as nki_mod
from neuron_compile.trainium.kernels.nki import NkiFallbackWarning
from tests import nki_double

ROOT = Path(__file__).resolve().parents[1]
_ids = itertools.count()


def _name(stem: str) -> str:
    # torch.library op names are process-global: every test defines its own.
    return f"nkitest::{stem}_{next(_ids)}"


def rms_norm_reference(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rms_norm_backward(grad: Tensor, x: Tensor, weight: Tensor, eps: float) -> tuple:
    rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    gy = grad * weight
    gx = rstd * (gy - x * rstd.pow(2) * (gy * x).mean(-1, keepdim=True))
    gw = (grad * x * rstd).reshape(-1, x.shape[-1]).sum(0)
    return gx, gw, None


def _kernel(x, weight, eps=1e-6):
    raise AssertionError("an NKI kernel is never called off-device")


def _rms_norm_op(**kw):
    return neuron_compile.nki_op(_name("rms_norm"), reference=rms_norm_reference, **kw)(_kernel)


@pytest.fixture(autouse=True)
def _fresh_nki_state(monkeypatch):
    monkeypatch.setattr(nki_mod, "_WARNED", set())
    monkeypatch.setattr(nki_mod, "_CONFIGS", {})


@pytest.fixture
def no_nki(monkeypatch):
    """``import nki`` fails, even on a host that has it."""
    monkeypatch.setitem(sys.modules, "nki", None)


def _train_step(fn, *inputs):
    leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
    out = fn(*leaves)
    outs = out if isinstance(out, tuple) else (out,)
    sum(o.float().square().sum() for o in outs).backward()
    return [o.detach() for o in outs], [t.grad for t in leaves]


def _assert_close_step(compiled, eager, *inputs):
    got_out, got_grad = _train_step(compiled, *inputs)
    want_out, want_grad = _train_step(eager, *inputs)
    for g, w in zip(got_out + got_grad, want_out + want_grad, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_eager_runs_the_reference():
    op = _rms_norm_op()
    x, w = torch.randn(3, 16), torch.randn(16)
    torch.testing.assert_close(op(x, w), rms_norm_reference(x, w))
    torch.testing.assert_close(op(x, w, eps=0.5), rms_norm_reference(x, w, 0.5))
    assert op.kernel is _kernel and op.reference is rms_norm_reference


def test_fake_impl_comes_from_the_reference():
    from torch._subclasses.fake_tensor import FakeTensorMode

    op = _rms_norm_op()
    with FakeTensorMode():
        y = op(torch.empty(5, 8, dtype=torch.bfloat16), torch.empty(8, dtype=torch.bfloat16))
    assert y.shape == (5, 8) and y.dtype == torch.bfloat16


def test_compile_cpu_derived_backward_matches_eager():
    op = _rms_norm_op()

    def f(x, w):
        return op(torch.tanh(x), w) * 2

    compiled = torch.compile(f, backend="neuron_compile")
    _assert_close_step(compiled, f, torch.randn(2, 6, 32), torch.randn(32))


def test_compile_cpu_user_backward_matches_eager():
    calls = []

    def backward(grad, x, weight, eps):
        calls.append(grad.shape)
        return rms_norm_backward(grad, x, weight, eps)

    op = _rms_norm_op(backward=backward)
    compiled = torch.compile(lambda x, w: op(x, w) + 1, backend="neuron_compile")
    _assert_close_step(compiled, lambda x, w: rms_norm_reference(x, w) + 1, *_inputs())
    assert calls, "the user backward was not used"


def test_tuple_reference_compiles_with_derived_backward():
    def reference(x: Tensor, scale: float) -> tuple[Tensor, Tensor]:
        return torch.sin(x) * scale, x.pow(2)

    op = neuron_compile.nki_op(_name("pair"), reference=reference)(_kernel)

    def f(x):
        a, b = op(x, 3.0)
        return a + b, a * b

    _assert_close_step(torch.compile(f, backend="neuron_compile"), f, torch.randn(4, 8))


def _inputs():
    return torch.randn(8, 32), torch.randn(32)


def _dumped(dump_dir: Path, suffix: str) -> list[str]:
    return [p.read_text() for p in sorted(dump_dir.glob(f"*_forward_*/{suffix}"))]


def test_fx_graph_keeps_the_op_as_one_node(tmp_path, monkeypatch):
    monkeypatch.setenv("NEURON_COMPILE_DUMP_DIR", str(tmp_path))
    op = _rms_norm_op()
    compiled = torch.compile(lambda x, w: op(x * 2, w).relu(), backend="neuron_compile")
    _train_step(compiled, *_inputs())
    (fx_code,) = _dumped(tmp_path, "graph.fx.py")
    qual = op._opoverload._schema.name.replace("::", ".")
    assert fx_code.count(f"torch.ops.{qual}.default(") == 1
    assert "rsqrt" not in fx_code  # not decomposed: the reference is inlined only when lowering


def test_trn2_with_nki_emits_the_kernel_custom_call(tmp_path, monkeypatch):
    double = nki_double.install(monkeypatch)
    checked = []
    real_check = legality_mod.check_legality
    monkeypatch.setattr(
        legality_mod, "check_legality", lambda *a, **k: checked.append(a) or real_check(*a, **k)
    )
    monkeypatch.setenv("NEURON_COMPILE_TARGET", "trn2")
    monkeypatch.setenv("NEURON_COMPILE_DUMP_DIR", str(tmp_path))
    op = _rms_norm_op()

    def f(x, w):
        return op(x, w, 1e-5) * 3

    with warnings.catch_warnings():
        warnings.simplefilter("error", NkiFallbackWarning)
        _assert_close_step(torch.compile(f, backend="neuron_compile"), f, *_inputs())

    # The toolchain contract: specialised on empty arrays of the node's shapes and dtypes, with
    # constants as themselves, for the configured target.
    (kernel, inputs, opts) = double.calls[0]
    assert kernel is _kernel
    assert list(inputs) == ["x", "weight", "eps"] and inputs["eps"] == 1e-5
    assert isinstance(inputs["x"], np.ndarray) and inputs["x"].shape == (8, 32)
    assert inputs["x"].dtype == np.float32 and inputs["weight"].shape == (32,)
    assert opts.target == "trn2" and opts.lnc == 2 and Path(opts.artifacts_dir).is_dir()
    # Its backend_config goes into the module verbatim; legality accepts the target.
    (text,) = _dumped(tmp_path, "module.stablehlo.mlir")
    assert "AwsNeuronCustomNativeKernel" in text
    assert f'backend_config = "{nki_double.BACKEND_CONFIG}"' in text
    assert f'nki_version = "{nki_double.VERSION}"' in text
    assert checked, "trn legality checks did not run"
    assert not legality_mod.find_violations(*checked[0][:3])


def _forward_key(monkeypatch, version: str) -> str:
    nki_double.install(monkeypatch, version)
    nki_mod._CONFIGS.clear()
    torch._dynamo.reset()
    neuron_compile.reset_metrics()
    op = _OP_FOR_KEY
    torch.compile(lambda x, w: op(x, w), backend="neuron_compile")(*_inputs())
    (record,) = [
        r for r in neuron_compile.metrics() if "forward" in r.name or "inference" in r.name
    ]
    return record.cache_key


_OP_FOR_KEY = _rms_norm_op()


def test_nki_version_enters_the_cache_key(monkeypatch):
    monkeypatch.setenv("NEURON_COMPILE_TARGET", "trn2")
    assert _forward_key(monkeypatch, "0.7.0+double") != _forward_key(monkeypatch, "0.8.0+double")


def test_trn2_without_nki_warns_once_and_lowers_the_reference(tmp_path, monkeypatch, no_nki):
    monkeypatch.setenv("NEURON_COMPILE_TARGET", "trn2")
    monkeypatch.setenv("NEURON_COMPILE_DUMP_DIR", str(tmp_path))
    op = _rms_norm_op()
    name = op._opoverload._schema.name
    compiled = torch.compile(lambda x, w: op(x, w), backend="neuron_compile")
    with pytest.warns(NkiFallbackWarning, match=f"kernel {name} not used: the nki package is not"):
        _assert_close_step(compiled, rms_norm_reference, *_inputs())
    (text,) = _dumped(tmp_path, "module.stablehlo.mlir")
    assert "AwsNeuronCustomNativeKernel" not in text and "stablehlo.rsqrt" in text
    with pytest.warns(RecompileWarning, match=r"x dim 0=4 \(was 8\)") as caught:
        compiled(torch.randn(4, 32), torch.randn(32))  # a new shape: recompiled, no new warning
    assert not [w for w in caught if issubclass(w.category, NkiFallbackWarning)]


def test_load_nki_never_imports_the_pypi_placeholder(tmp_path, monkeypatch):
    # PyPI's ``nki`` 0.0.x is a "WRONG PACKAGE" placeholder: it must not even be imported.
    (tmp_path / "nki").mkdir()
    marker = tmp_path / "imported"
    (tmp_path / "nki" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (tmp_path / "nki-0.0.1.dist-info").mkdir()
    (tmp_path / "nki-0.0.1.dist-info" / "METADATA").write_text("Name: nki\nVersion: 0.0.1\n")
    monkeypatch.delitem(sys.modules, "nki", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert nki_mod.load_nki() is None
    assert not marker.exists()


def test_load_nki_sees_an_installed_toolchain(monkeypatch):
    nki_double.install(monkeypatch)
    assert nki_mod.load_nki() is sys.modules["nki"]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"name": "rms_norm", "reference": rms_norm_reference}, "namespace::name"),
        ({"name": "a::b::c", "reference": rms_norm_reference}, "namespace::name"),
        ({"name": "nkitest::no_ref"}, "no reference implementation"),
        ({"name": "nkitest::no_hints", "reference": lambda x, w: x}, "lacks type hints for x, w"),
    ],
    ids=["no-namespace", "two-namespaces", "no-reference", "no-hints"],
)
def test_definition_errors(kwargs, match):
    name = kwargs.pop("name")
    with pytest.raises(NkiOpError, match=match) as info:
        neuron_compile.nki_op(name, **kwargs)
    assert info.value.code == "NC105"


def test_user_backward_with_wrong_gradient_count():
    op = _rms_norm_op(backward=lambda grad, x, w, eps: grad)
    x = torch.randn(2, 4, requires_grad=True)
    with pytest.raises(NkiOpError, match="returned 1 gradients for 3 inputs"):
        op(x, torch.randn(4)).sum().backward()


def test_example_runs():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("NEURON_COMPILE_TARGET", None)
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "nki_rmsnorm.py"), "--steps", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "compiled == eager" in done.stdout
