"""Per-op trn legality (``trainium/legality_ops.py``): TopK, scatter-reduce and shift dtypes, NKI
kernel artifacts, integer collectives; and the legal trn form of ``>>``
(``trainium/lowering_shifts.py``), bit-exact with eager."""

from __future__ import annotations

import base64
import json

import pytest
import torch
from torch import Tensor
from torch.fx.experimental.proxy_tensor import make_fx

import neuron_compile
from neuron_compile import artifact, errors
from neuron_compile.lowering import lower_graph
from neuron_compile.lowering.lower_graph import LoweredGraph
from neuron_compile.targets import get_target
from neuron_compile.trainium.kernels import nki as nki_mod
from neuron_compile.trainium.legality import find_violations
from neuron_compile.trainium.legality_collectives import CollectiveConstraintWarning
from tests import nki_double

TRN2, CPU = get_target("trn2"), get_target("cpu")


def _fx(fn, *args):
    return make_fx(fn, tracing_mode="fake")(*args)


def _codes(gm, lowered, target=TRN2, **kw):
    return [(v.error.code, v.ncc_code) for v in find_violations(gm, lowered, target, **kw)]


def _text(body: str) -> LoweredGraph:
    return LoweredGraph(text=body, inputs=[], outputs=[], num_results=0)


def _module(args: str, results: str, body: str) -> str:
    """A verified hand-written module: ``body`` computes ``%r`` from ``%arg0``..."""
    text = f"""module @neuron_graph {{
  func.func public @main({args}) -> ({results}) {{
{body}
  }}
}}
"""
    artifact.verify(text)
    return text


ANY_GM = _fx(lambda x: x + 1, torch.ones(4))


# -- TopK (NCC_EVRF013) ---------------------------------------------------------------------------


def _chlo_topk(element: str) -> str:
    # chlo is not a dialect our MLIR context loads, so this text is checked line by line only.
    return f"""module @neuron_graph {{
  func.func public @main(%arg0: tensor<8x{element}>) -> (tensor<3x{element}>, tensor<3xi32>) {{
    %v, %i = chlo.top_k(%arg0, k = 3) : tensor<8x{element}> -> (tensor<3x{element}>, tensor<3xi32>)
    return %v, %i : tensor<3x{element}>, tensor<3xi32>
  }}
}}
"""


def _custom_topk(target: str, element: str) -> str:
    return _module(
        f"%arg0: tensor<8x{element}>",
        f"tensor<3x{element}>, tensor<3xi32>",
        f'    %r:2 = "stablehlo.custom_call"(%arg0) {{call_target_name = "{target}", '
        'backend_config = ""}'
        f" : (tensor<8x{element}>) -> (tensor<3x{element}>, tensor<3xi32>)\n"
        f"    return %r#0, %r#1 : tensor<3x{element}>, tensor<3xi32>",
    )


@pytest.mark.parametrize("element, codes", [("i32", [("NC512", "NCC_EVRF013")]), ("f32", [])])
def test_topk_on_integers_evrf013(element, codes):
    assert _codes(ANY_GM, _text(_chlo_topk(element))) == codes
    text = _custom_topk("AwsNeuronTopK", element)
    assert _codes(ANY_GM, _text(text)) == codes
    assert _codes(ANY_GM, _text(artifact.pretty(text))) == codes  # `custom_call @X(...)` form
    # XLA's own TopK target is not on neuronx-cc's list either: both problems are reported.
    assert (
        _codes(ANY_GM, _text(_custom_topk("TopK", element))) == [("NC505", "NCC_EHCA005")] + codes
    )


def test_our_integer_topk_is_a_sort_and_legal():
    gm = _fx(lambda x: torch.topk(x, 3), torch.arange(8, dtype=torch.int32))
    lowered = lower_graph(gm, target=TRN2)
    assert "stablehlo.sort" in lowered.text and _codes(gm, lowered) == []


# -- scatter with a reduction (NCC_EVRF016 / NCC_EVRF060) -----------------------------------------


def _scatter_codes(fn, x, src, **kw):
    index = torch.tensor([0, 1, 0])
    gm = _fx(fn, x, index, src)
    return [
        (v.error.code, v.ncc_code, v.node.name)
        for v in find_violations(gm, lower_graph(gm, target=TRN2), TRN2, **kw)
    ]


def test_bool_scatter_reduce_evrf016_whatever_the_downcast_flag():
    def put(x, i, s):
        return x.put(i, s, accumulate=True)

    bools = torch.zeros(4, dtype=torch.bool), torch.ones(3, dtype=torch.bool)
    assert _scatter_codes(put, *bools) == [("NC512", "NCC_EVRF016", "put")]
    flag = "--implicit-integer-downcast=all"  # the f32 emulation does not cover bool
    assert _scatter_codes(put, *bools, flags=flag) == [("NC512", "NCC_EVRF016", "put")]
    floats = torch.zeros(4), torch.ones(3)
    assert _scatter_codes(put, *floats) == []


def test_integer_scatter_reduce_is_evrf060_once():
    """An integer scatter-add is NCC_EVRF060 (lossy f32 emulation, allowed by the flag) and only
    that: reported once, by the FX rule for the ATen ops it knows, by the HLO rule otherwise."""
    ints = torch.zeros(2, 3, dtype=torch.int32), torch.ones(3, 3, dtype=torch.int32)

    def scatter_add(x, i, s):
        return x.scatter_add(0, i.unsqueeze(1).expand(3, 3), s)

    def index_reduce(x, i, s):
        return x.index_reduce(0, i, s, "prod")  # not among the FX rule's ops

    for fn, name in ((scatter_add, "scatter_add"), (index_reduce, "index_reduce")):
        assert _scatter_codes(fn, *ints) == [("NC504", "NCC_EVRF060", name)]
        assert _scatter_codes(fn, *ints, flags="--implicit-integer-downcast=scatter") == []


def test_one_code_per_scatter_when_a_reduction_emits_two():
    """Regression: ``scatter_reduce(include_self=False)`` emits two scatters (identity fill, then
    the reduction): one report for the node, under one code."""

    def f(x, i, s):
        return x.scatter_reduce(0, i, s, "sum", include_self=False)

    bools = torch.zeros(3, dtype=torch.bool), torch.ones(3, dtype=torch.bool)
    assert _scatter_codes(f, *bools) == [("NC512", "NCC_EVRF016", "scatter_reduce")]
    ints = torch.zeros(3, dtype=torch.int32), torch.ones(3, dtype=torch.int32)
    assert _scatter_codes(f, *ints) == [("NC504", "NCC_EVRF060", "scatter_reduce")]


def _scatter_module(element: str, combiner: str | None) -> str:
    ret = "%b" if combiner is None else "%c"
    op = "" if combiner is None else f"      %c = stablehlo.{combiner} %a, %b : tensor<{element}>\n"
    return _module(
        f"%arg0: tensor<4x{element}>, %arg1: tensor<2x1xi32>, %arg2: tensor<2x{element}>",
        f"tensor<4x{element}>",
        f'    %r = "stablehlo.scatter"(%arg0, %arg1, %arg2) ({{\n'
        f"    ^bb0(%a: tensor<{element}>, %b: tensor<{element}>):\n"
        f"{op}      stablehlo.return {ret} : tensor<{element}>\n"
        "    }) {scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0], "
        "scatter_dims_to_operand_dims = [0], index_vector_dim = 1>} : "
        f"(tensor<4x{element}>, tensor<2x1xi32>, tensor<2x{element}>) -> tensor<4x{element}>\n"
        f"    return %r : tensor<4x{element}>",
    )


@pytest.mark.parametrize(
    "element, combiner, codes",
    [
        ("i1", "or", [("NC512", "NCC_EVRF016")]),
        ("i32", "and", [("NC512", "NCC_EVRF016")]),  # no f32 emulation of a bitwise and
        ("i32", "add", [("NC504", "NCC_EVRF060")]),
        ("i32", None, []),  # overwriting: no reduction
        ("f32", "add", []),
    ],
)
def test_hand_written_scatter_reductions(element, combiner, codes):
    assert _codes(ANY_GM, _text(_scatter_module(element, combiner))) == codes


# -- shift right arithmetic (NCC_EVRF022) and its trn form ----------------------------------------


def test_narrow_shift_right_arithmetic_evrf022():
    text = _module(
        "%arg0: tensor<4xi16>, %arg1: tensor<4xi16>",
        "tensor<4xi16>",
        "    %r = stablehlo.shift_right_arithmetic %arg0, %arg1 : tensor<4xi16>\n"
        "    return %r : tensor<4xi16>",
    )
    assert _codes(ANY_GM, _text(text)) == [("NC512", "NCC_EVRF022")]
    assert _codes(ANY_GM, _text(text.replace("i16", "i32"))) == []


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16])
def test_trn_shift_form_is_legal_where_the_reference_form_is_not(dtype):
    args = torch.ones(4, dtype=dtype), torch.ones(4, dtype=dtype)
    gm = _fx(lambda a, b: a >> b, *args)
    element = {torch.int8: "i8", torch.int16: "i16"}[dtype]
    cpu = lower_graph(gm, target=CPU)  # the reference form, which XLA CPU runs unchanged
    assert f"shift_right_arithmetic %arg0, %arg1 : tensor<4x{element}>" in artifact.pretty(cpu.text)
    assert [(v.ncc_code, v.node.name) for v in find_violations(gm, cpu, TRN2)] == [
        ("NCC_EVRF022", "rshift")
    ]
    trn = lower_graph(gm, target=TRN2)
    assert "tensor<4xi32>" in trn.text and _codes(gm, trn) == []
    prim = _fx(torch.ops.prims.shift_right_arithmetic, *args)  # lowered through its reference
    assert _codes(prim, lower_graph(prim, target=TRN2)) == []


def _shift_cases(dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    info = torch.iinfo(dtype)
    values = [info.min, info.min + 1, -77, -5, -1, 0, 1, 6, 100, info.max]
    counts = [0, 1, 2, 3, info.bits - 2, info.bits - 1, info.bits, info.bits + 1, 31, 32]
    counts += [33, info.max] + ([-1, -3, info.min] if info.min < 0 else [info.max - 1])
    a = torch.tensor(values, dtype=dtype).repeat_interleave(len(counts))
    b = torch.tensor(counts, dtype=dtype).repeat(len(values))
    return a, b


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.uint8])
def test_trn_shift_form_equals_eager(dtype, no_neuronx_cc):
    """Every value against every count, out-of-range and negative counts included (eager fills
    with the sign), through the trn2 module run on XLA CPU."""

    def f(a, b):
        scalar_left = (100 if dtype == torch.uint8 else -100) >> b
        return a >> b, torch.bitwise_right_shift(a, 3), scalar_left, a >> 9

    a, b = _shift_cases(dtype)
    got = torch.compile(f, backend="neuron", options={"target": "trn2"})(a, b)
    for out, want in zip(got, f(a, b), strict=True):
        assert out.dtype == want.dtype and torch.equal(out, want)


# -- NKI kernel artifacts (NCC_EVRF059) -----------------------------------------------------------


def _nki_config(path: str) -> str:
    return base64.b64encode(
        json.dumps({"func_name": "k", "klir_binary": {"binary": path}}).encode()
    ).decode()


def _nki_module(path: str) -> str:
    return _module(
        "%arg0: tensor<4xf32>",
        "tensor<4xf32>",
        "    %r = stablehlo.custom_call @AwsNeuronCustomNativeKernel(%arg0) "
        f'{{backend_config = "{_nki_config(path)}"}} : (tensor<4xf32>) -> tensor<4xf32>\n'
        "    return %r : tensor<4xf32>",
    )


def test_hand_written_kernel_artifacts_evrf059(tmp_path):
    present = tmp_path / "kernel.klir"
    present.write_bytes(b"bir")
    assert _codes(ANY_GM, _text(_nki_module(str(present)))) == []
    missing = _text(_nki_module(str(tmp_path / "gone" / "kernel.klir")))
    assert _codes(ANY_GM, missing) == [("NC513", "NCC_EVRF059")]
    relative = _text(_nki_module("kernel.klir"))  # neuronx-cc wants the absolute path
    assert _codes(ANY_GM, relative) == [("NC513", "NCC_EVRF059")]


def _reference(x: Tensor, w: Tensor) -> Tensor:
    return x * w


def _kernel(x, w):
    raise AssertionError("an NKI kernel is never called off-device")


_KERNEL_OP = neuron_compile.nki_op("nkitest::legality_scale", reference=_reference)(_kernel)


@pytest.fixture
def traced_artifacts(monkeypatch):
    """The nki test double, answering with a config that names ``kernel.klir`` in the
    specialisation's artifacts dir (as the real toolchain's does); the paths are collected."""
    monkeypatch.setattr(nki_mod, "_WARNED", set())
    monkeypatch.setattr(nki_mod, "_CONFIGS", {})
    double = nki_double.install(monkeypatch)
    paths: list[str] = []

    def compile_kernel_to_nir(kernel, *, inputs, compile_opts, enable_cache):
        nir = double.compile_kernel_to_nir(
            kernel, inputs=inputs, compile_opts=compile_opts, enable_cache=enable_cache
        )
        config = nir.build_config()
        paths.append(f"{compile_opts.artifacts_dir}/kernel.klir")
        config.backend_config_b64 = _nki_config(paths[-1])
        return nir

    monkeypatch.setattr(
        __import__("sys").modules["nki.framework.compiled"],
        "compile_kernel_to_nir",
        compile_kernel_to_nir,
    )
    return paths


def test_traced_kernel_artifact_must_exist_evrf059(traced_artifacts):
    gm = _fx(lambda x, w: _KERNEL_OP(x, w) + 1, torch.ones(4, 8), torch.ones(8))
    lowered = lower_graph(gm, target=TRN2)
    assert "AwsNeuronCustomNativeKernel" in lowered.text
    (path,) = traced_artifacts
    node = [n.name for n in gm.graph.nodes if n.op == "call_function"][0]
    got = [(v.error.code, v.ncc_code, v.node.name) for v in find_violations(gm, lowered, TRN2)]
    assert got == [("NC513", "NCC_EVRF059", node)]
    with open(path, "wb") as f:  # what the real toolchain leaves in the persistent cache
        f.write(b"bir")
    assert _codes(gm, lowered) == []


def test_missing_artifact_through_torch_compile_names_node_and_user_line(
    traced_artifacts, no_neuronx_cc
):
    from tests.test_backend import _root_cause

    def f(x, w):
        return _KERNEL_OP(x, w).relu()

    with pytest.raises(Exception) as info:
        torch.compile(f, backend="neuron", options={"target": "trn2"})(
            torch.ones(4, 8), torch.ones(8)
        )
    err = _root_cause(info.value)
    assert isinstance(err, errors.KernelArtifactViolation), repr(info.value)
    assert err.code == "NC513" and err.ncc_code == "NCC_EVRF059" and err.rule == "kernel_artifacts"
    assert err.node_name == "legality_scale" and traced_artifacts[0] in str(err)
    assert "test_legality_ops.py" in err.where and "_KERNEL_OP(x, w).relu()" in err.source


# -- integer collectives (NCC_EVRF061 / NCC_EVRF063) ----------------------------------------------

_GROUPS = (
    "replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>, "
    "channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, use_global_device_ids"
)


def _collective(op: str, element: str) -> str:
    out, extra = ("4", "") if op == "all_reduce" else ("2", "scatter_dimension = 0 : i64, ")
    return _module(
        f"%arg0: tensor<4x{element}>",
        f"tensor<{out}x{element}>",
        f'    %r = "stablehlo.{op}"(%arg0) ({{\n'
        f"    ^bb0(%a: tensor<{element}>, %b: tensor<{element}>):\n"
        f"      %s = stablehlo.add %a, %b : tensor<{element}>\n"
        f"      stablehlo.return %s : tensor<{element}>\n"
        f"    }}) {{{extra}{_GROUPS}}} : (tensor<4x{element}>) -> tensor<{out}x{element}>\n"
        f"    return %r : tensor<{out}x{element}>",
    )


@pytest.mark.parametrize(
    "op, element, codes",
    [
        ("all_reduce", "i32", [("NC504", "NCC_EVRF061")]),
        ("all_reduce", "f32", []),
        ("all_reduce", "i16", []),  # exact in f32: the pages name 32- and 64-bit integers
        ("reduce_scatter", "i32", [("NC504", "NCC_EVRF063")]),
        ("reduce_scatter", "bf16", []),
    ],
)
def test_integer_collectives(op, element, codes):
    lowered = _text(_collective(op, element))
    # the replica groups break a constraint only a third-party write-up states (said once)
    with pytest.warns(CollectiveConstraintWarning, match="unverified"):
        assert _codes(ANY_GM, lowered) == codes
    assert _codes(ANY_GM, lowered, flags=f"--implicit-integer-downcast={op}") == []
    assert _codes(ANY_GM, lowered, flags="--implicit-integer-downcast=all") == []
    other = "reduce_scatter" if op == "all_reduce" else "all_reduce"
    assert _codes(ANY_GM, lowered, flags=f"--implicit-integer-downcast={other}") == codes
