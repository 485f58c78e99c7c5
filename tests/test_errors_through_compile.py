"""Our errors read first through torch.compile (issue 21): what the user catches is our coded
error itself, not Dynamo's ``BackendCompilerFailed``, and the text printed below the traceback
starts with its type, code and message, with none of Dynamo's advice around it. One test per
code family reachable through torch.compile, the lazily compiled backward, and a real process's
stderr; plus the names and dims NC201 reports and the suggestions NC001 makes."""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap
import traceback
from pathlib import Path

import pytest
import torch

from neuron_compile import errors
from neuron_compile.config import UnknownEnvVarWarning, load_config
from neuron_compile.narrowing import user_name
from neuron_compile.warn_once import reset_warn_once

ROOT = Path(__file__).resolve().parents[1]
# What Dynamo prints with a wrapped backend error or appends to an exception's message.
DYNAMO_ADVICE = ("TORCHDYNAMO_VERBOSE", "TORCH_LOGS", "from user code", "BackendCompilerFailed")


def _below_traceback(text: str) -> list[str]:
    """The lines after the last traceback's frame lines: the exception as printed."""
    tail = text.rsplit("Traceback (most recent call last):\n", 1)[-1].splitlines()
    return tail[next(i for i, line in enumerate(tail) if not line.startswith(" ")) :]


def _caught(fn, *args) -> BaseException:
    with pytest.raises(BaseException) as info:
        fn(*args)
    return info.value


def _assert_reads_first(exc: BaseException, cls: type[errors.NeuronCompileError], code: str):
    """``exc`` is (or has as ``__cause__``) a ``cls`` with ``code``, printed first below the
    traceback (at most one wrapper line before it) with no Dynamo advice anywhere there."""
    ours = exc if isinstance(exc, cls) else exc.__cause__
    assert isinstance(ours, cls) and ours.code == code, repr(exc)
    assert type(ours) is cls and ours is exc  # exactly our class, nothing around it
    assert "TORCHDYNAMO_VERBOSE" not in repr(ours)  # Dynamo's advice is not in its args either
    below = _below_traceback("".join(traceback.format_exception(exc)))
    at = next(i for i, line in enumerate(below) if f"[{code}]" in line)
    assert at <= 1, below
    assert not any(advice in "\n".join(below) for advice in DYNAMO_ADVICE), below
    # This package's way: no wrapper line at all, the error under its public name.
    assert below[0].startswith(f"neuron_compile.errors.{cls.__name__}: [{code}] "), below
    return ours


def _compiled(fn, **options):
    return torch.compile(fn, backend="neuron", options=options or None)


# ---- NC0xx: options ---------------------------------------------------------------------------


def test_nc0xx_unknown_option_is_caught_as_itself_and_suggests_the_key():
    exc = _caught(_compiled(lambda x: x.sin() + 1, fallbak="cpu"), torch.randn(4, 8))
    err = _assert_reads_first(exc, errors.OptionsError, "NC001")
    assert str(err).splitlines()[0] == "[NC001] unknown option 'fallbak'; did you mean 'fallback'?"
    assert "valid keys:" in str(err)  # the full list stays, after the suggestion


def test_nc0xx_invalid_env_value_names_the_variable_and_the_closest_value(monkeypatch):
    monkeypatch.setenv("NEURON_COMPILE_FALLBACK", "eror")
    exc = _caught(_compiled(lambda x: x.cos()), torch.randn(3))
    err = _assert_reads_first(exc, errors.OptionsError, "NC001")
    first = str(err).splitlines()[0]
    assert first == (
        "[NC001] NEURON_COMPILE_FALLBACK='eror': invalid fallback='eror'; did you mean 'error'?"
    )


@pytest.mark.parametrize(
    ("options", "suggestion"),
    [
        ({"sixty_four_bit": "downcst"}, "'downcast'"),
        ({"artifact": "bytcode"}, "'bytecode'"),
        ({"target": "trn22"}, "'trn2'"),
        ({"estimate": "of"}, "'off'"),
        ({"neuron.sixty_four_bits": "error"}, "'sixty_four_bit'"),
    ],
)
def test_nc0xx_fixed_choice_values_and_keys_suggest_the_closest(options, suggestion):
    with pytest.raises(errors.OptionsError) as info:
        load_config(options, env={})
    assert f"did you mean {suggestion}?" in str(info.value).splitlines()[0]


def test_nc0xx_a_value_far_from_every_choice_suggests_nothing():
    with pytest.raises(errors.OptionsError) as info:
        load_config({"fallback": "zzzz"}, env={})
    assert "did you mean" not in str(info.value) and "use one of cpu, error" in str(info.value)


def test_an_unknown_env_name_close_to_a_real_one_is_warned_once():
    reset_warn_once()  # another test may have warned about this name already
    env = {"NEURON_COMPILE_FALBACK": "error", "NEURON_COMPILE_MY_OWN_SETTING": "1"}
    with pytest.warns(UnknownEnvVarWarning, match="did you mean NEURON_COMPILE_FALLBACK") as rec:
        load_config({}, env=env)
        load_config({}, env=env)
    assert len(rec) == 1 and "NEURON_COMPILE_MY_OWN_SETTING" not in str(rec[0].message)
    assert rec[0].filename == __file__  # located at the caller, not in the package


def test_outside_torch_compile_errors_stay_exactly_their_class():
    with pytest.raises(errors.OptionsError) as info:
        load_config({"fallbak": "cpu"}, env={})
    assert type(info.value) is errors.OptionsError
    assert not isinstance(info.value, torch._dynamo.exc.TorchDynamoException)


# ---- NC1xx: graphs the compiler refuses --------------------------------------------------------


def test_nc1xx_float64_under_the_error_policy():
    fn = _compiled(lambda t: t + 1, sixty_four_bit="error")
    exc = _caught(fn, torch.ones(2, dtype=torch.float64))
    _assert_reads_first(exc, errors.DtypePolicyError, "NC104")


@torch.library.custom_op("nctest::errors_read_first_opaque", mutates_args=())
def _opaque(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_opaque.register_fake
def _(x):
    return torch.empty_like(x)


def test_nc1xx_op_without_lowering_under_fallback_error():
    fn = _compiled(lambda x: torch.ops.nctest.errors_read_first_opaque(x) + 1, fallback="error")
    exc = _caught(fn, torch.ones(3))
    err = _assert_reads_first(exc, errors.UnsupportedOpError, "NC101")
    assert "errors_read_first_opaque" in str(err)


def test_nc1xx_in_a_backward_compiled_at_loss_backward():
    class SinWithFloat64Grad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x.sin()

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return (grad.double() * x.double().cos()).float()

    x = torch.randn(3, requires_grad=True)
    y = _compiled(SinWithFloat64Grad.apply, sixty_four_bit="error")(x)  # the forward compiles
    exc = _caught(lambda: y.sum().backward())
    assert type(exc) is errors.DtypePolicyError  # outside Dynamo: exactly our class
    _assert_reads_first(exc, errors.DtypePolicyError, "NC104")
    assert "backward" in str(exc)


# ---- NC2xx: shapes ----------------------------------------------------------------------------


def test_nc2xx_dynamic_true_names_the_users_input_and_only_symbolic_dims():
    fn = torch.compile(lambda x: x @ torch.ones(8, 3), backend="neuron", dynamic=True)
    exc = _caught(fn, torch.randn(4, 8))
    err = _assert_reads_first(exc, errors.DynamicShapeError, "NC201")
    first = str(err).splitlines()[0]
    assert "torch.compile(dynamic=True) made x dim 0 (s" in first, first
    assert "dim 1" not in first and "l_x_" not in first  # dim 1 is pinned to 8 by the matmul


def test_nc2xx_mark_dynamic_names_the_marked_input():
    x = torch.randn(4, 8)
    torch._dynamo.mark_dynamic(x, 0)
    exc = _caught(torch.compile(lambda x: x.sin() * 2, backend="neuron"), x)
    err = _assert_reads_first(exc, errors.DynamicShapeError, "NC201")
    first = str(err).splitlines()[0]
    assert "torch._dynamo.mark_dynamic made x dim 0 (s" in first and "dim 1" not in first


def test_dynamic_true_with_every_dim_pinned_compiles_statically():
    x = torch.randn(4, 8)
    out = torch.compile(lambda x: x.view(4, 8) * 2, backend="neuron", dynamic=True)(x)
    torch.testing.assert_close(out, x * 2)


def test_dynamo_sources_read_as_the_user_names_them():
    assert user_name("L['x']") == "x"
    assert user_name("L['self']._modules['fc']._parameters['weight']") == "fc.weight"
    buffer = "L['self']._modules['d1']._modules['1']._buffers['num_batches_tracked']"
    assert user_name(buffer) == "d1.1.num_batches_tracked"
    assert user_name("G['model']._modules['head']._parameters['bias']") == "head.bias"


def test_nc2xx_recompile_over_the_budget():
    fn = torch.compile(
        lambda x: x * 3, backend="neuron", dynamic=False, options={"max_recompiles": 0}
    )
    fn(torch.randn(2))
    _assert_reads_first(_caught(fn, torch.randn(5)), errors.RecompileLimitError, "NC202")


# ---- NC4xx: the cache -------------------------------------------------------------------------


def test_nc4xx_cache_miss_in_strict_mode(monkeypatch):
    monkeypatch.setenv("NEURON_COMPILE_CACHE_ONLY", "1")  # the fixture's cache dir is empty
    exc = _caught(_compiled(lambda x: x.tanh() - 7), torch.randn(3, 5))
    _assert_reads_first(exc, errors.CacheMissError, "NC401")


# ---- NC5xx: trn legality ----------------------------------------------------------------------


def test_nc5xx_trn2_legality(monkeypatch):
    monkeypatch.setenv("NEURON_COMPILE_NEURONX_CC", "/nonexistent/neuronx-cc")
    a = torch.ones(3, 3, dtype=torch.int32)
    exc = _caught(_compiled(lambda a, b: a @ b, target="trn2"), a, a)
    err = _assert_reads_first(exc, errors.IntegerDatapathViolation, "NC504")
    assert err.ncc_code == "NCC_EVRF035"


# ---- what crosses Dynamo stays usable ----------------------------------------------------------


def test_an_error_that_crossed_dynamo_pickles_as_its_public_class():
    exc = _caught(torch.compile(lambda x: x + 1, backend="neuron", dynamic=True), torch.ones(3))
    assert type(exc) is errors.DynamicShapeError and not hasattr(exc, "first_useful_frame")
    again = pickle.loads(pickle.dumps(exc))
    assert type(again) is errors.DynamicShapeError and str(again) == str(exc)
    assert again.reason == exc.reason and again.args == exc.args


def test_an_error_on_its_way_through_dynamo_is_still_its_class_and_pickles():
    """Between our backend and Dynamo's compile_wrapper the error is a ShortenTraceback too
    (what makes Dynamo re-raise it unchanged); it is still caught and pickled as ours."""
    err = errors.DynamicShapeError("made x dim 0 symbolic")
    errors.through_dynamo(err, None)
    assert isinstance(err, errors.DynamicShapeError)
    assert isinstance(err, torch._dynamo.exc.ShortenTraceback)
    assert type(err).__qualname__ == "DynamicShapeError"
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is errors.DynamicShapeError and str(again) == str(err)
    assert err.remove_dynamo_frames() is err and type(err) is errors.DynamicShapeError


def test_torchdynamo_verbose_keeps_the_whole_traceback():
    fn = torch.compile(lambda x: x + 2, backend="neuron", dynamic=True)
    with torch._dynamo.config.patch(verbose=True):
        exc = _caught(fn, torch.ones(3))
    frames = "".join(traceback.format_tb(exc.__traceback__))
    assert "output_graph.py" in frames and isinstance(exc, errors.DynamicShapeError)


# ---- a real process ---------------------------------------------------------------------------

SCRIPTS = {
    "NC201": """
        import torch
        def f(x):
            return x.sin() + 1
        cf = torch.compile(f, backend="neuron", dynamic=True)
        cf(torch.randn(4, 8))
    """,
    "NC104": """
        import torch
        cf = torch.compile(lambda t: t.exp(), backend="neuron", options={"sixty_four_bit": "error"})
        cf(torch.ones(2, dtype=torch.float64))
    """,
}


@pytest.mark.parametrize("code", sorted(SCRIPTS))
def test_a_script_prints_a_short_traceback_ending_with_our_error(tmp_path, code):
    script = tmp_path / "user_script.py"
    script.write_text(textwrap.dedent(SCRIPTS[code]))
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, cwd=ROOT, timeout=600
    )
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("Traceback"))
    traceback_text = "\n".join(lines[start:])
    below = _below_traceback(traceback_text + "\n")
    assert below[0].startswith("neuron_compile.errors.") and f": [{code}] " in below[0], below
    assert not any(advice in "\n".join(below) for advice in DYNAMO_ADVICE), traceback_text
    assert len(lines) - start < 25, traceback_text
    assert 'user_script.py", line' in lines[start + 1]  # the user's call comes first
