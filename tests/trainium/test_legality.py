"""trn legality: one minimal graph per rule, the neuronx-cc code each pre-empts, and the error
fields (our code, NCC code, FX node, user line) through torch.compile."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from neuron_compile import artifact, errors
from neuron_compile.compiler import DowncastWarning
from neuron_compile.lowering import lower_graph
from neuron_compile.lowering.lower_graph import LoweredGraph
from neuron_compile.targets import get_target
from neuron_compile.trainium.legality import check_legality, estimate_hbm_bytes, find_violations

TRN2, TRN3 = get_target("trn2"), get_target("trn3")
NO_TEXT = LoweredGraph(text="", inputs=[], outputs=[], num_results=0)


def _fx(fn, *args, mode="fake"):
    return make_fx(fn, tracing_mode=mode)(*args)


def _codes(gm, lowered=NO_TEXT, target=TRN2, **kw):
    return [(v.error.code, v.ncc_code) for v in find_violations(gm, lowered, target, **kw)]


def _text(body: str) -> LoweredGraph:
    return LoweredGraph(text=body, inputs=[], outputs=[], num_results=0)


def test_static_shapes_emod025():
    gm = _fx(lambda x: x * 2, torch.randn(3, 4), mode="symbolic")
    assert ("NC501", "NCC_EMOD025") in _codes(gm)


@pytest.mark.parametrize(
    "dtype, code, trn3_ok",
    [
        (torch.complex64, "NCC_EVRF004", False),
        (torch.float8_e5m2fnuz, "NCC_EVRF005", False),
        (torch.float8_e4m3fn, "NCC_EVRF051", True),  # trn3 has native OCP e4m3fn
        (torch.float8_e8m0fnu, "NCC_ESPP004", False),
    ],
)
def test_dtypes(dtype, code, trn3_ok):
    gm = _fx(lambda x: x.view(-1), torch.zeros(4, dtype=torch.float32).to(dtype))
    assert ("NC502", code) in _codes(gm)
    assert (_codes(gm, target=TRN3) == []) is trn3_ok


def test_supported_dtypes_and_64bit_downcast_are_legal():
    gm = _fx(
        lambda a, b, c: (a.float() + b.float() * 2, c.to(torch.bfloat16)),
        *[torch.ones(4, dtype=torch.int64), torch.ones(4, dtype=torch.float64), torch.ones(4)],
    )
    lowered = lower_graph(gm)
    assert "i64" not in lowered.text and "f64" not in lowered.text
    assert _codes(gm, lowered) == [] and _codes(gm, lowered, TRN3) == []


def test_int64_type_reaching_the_compiler_evrf062():
    lowered = _text("%0 = stablehlo.add %a, %a : tensor<4xi64>")
    gm = _fx(lambda x: x + 1, torch.ones(4))
    assert _codes(gm, lowered) == [("NC503", "NCC_EVRF062")]
    assert _codes(gm, lowered, flags="--native-int64=enabled") == []


def test_int64_constant_beyond_int32_esfh002():
    gm = _fx(
        lambda x: x + torch.full((4,), 2**40, dtype=torch.int64), torch.ones(4, dtype=torch.int64)
    )
    assert ("NC503", "NCC_ESFH002") in _codes(gm)
    gm = _fx(lambda x: x[1:] + 3, torch.ones(4, dtype=torch.int64))  # slice end = INT64_MAX
    assert _codes(gm) == []


def test_integer_dot_evrf035_unless_downcast_allowed():
    ints = torch.ones(4, 4, dtype=torch.int32)
    gm = _fx(torch.mm, ints, ints)
    assert _codes(gm) == [("NC504", "NCC_EVRF035")]
    assert _codes(gm, flags="--implicit-integer-downcast=all") == []
    assert _codes(_fx(torch.mm, ints.float(), ints.float())) == []


def test_integer_scatter_add_evrf060():
    idx = torch.tensor([[0, 1, 0]])
    gm = _fx(
        lambda x, i: x.scatter_add(1, i, torch.ones_like(i)),
        torch.zeros(1, 3, dtype=torch.int64),
        idx.int().long(),
    )
    assert ("NC504", "NCC_EVRF060") in _codes(gm)
    assert _codes(gm, flags="--implicit-integer-downcast dot,scatter") == []


def test_custom_call_targets_ehca005():
    gm = _fx(lambda x: x + 1, torch.ones(4))
    bad = _text("%0 = stablehlo.custom_call @my_kernel(%arg0) : (tensor<4xf32>) -> tensor<4xf32>")
    good = _text(
        "%0 = stablehlo.custom_call @AwsNeuronSoftmax(%arg0) : (tensor<4xf32>) -> tensor<4xf32>"
    )
    assert _codes(gm, bad) == [("NC505", "NCC_EHCA005")]
    assert _codes(gm, good) == []


def _rng_module(algorithm: str, state: str) -> str:
    """A hand-written, verified module drawing 8 words from RngBitGenerator (generic form, as
    our lowering emitted it before Threefry moved into plain ui32 arithmetic)."""
    text = f"""module @neuron_graph {{
  func.func public @main(%arg0: tensor<{state}>) -> (tensor<8xui32>) {{
    %m1:2 = "stablehlo.rng_bit_generator"(%arg0) {{rng_algorithm = #stablehlo<rng_algorithm \
{algorithm}>}} : (tensor<{state}>) -> (tensor<{state}>, tensor<8xui32>)
    return %m1#1 : tensor<8xui32>
  }}
}}
"""
    artifact.verify(text)
    return text


@pytest.mark.parametrize(
    "algorithm, state, codes",
    [
        ("THREE_FRY", "2xui64", [("NC503", "NCC_EVRF062"), ("NC509", "NCC_EVRF006")]),
        ("PHILOX", "3xui64", [("NC503", "NCC_EVRF062"), ("NC509", "NCC_EVRF006")]),
        ("DEFAULT", "2xui64", [("NC503", "NCC_EVRF062")]),  # ui64 state: still 64-bit
        ("DEFAULT", "4xui32", []),
    ],
)
def test_rng_bit_generator_non_default_evrf006_and_ui64_state_evrf062(algorithm, state, codes):
    gm = _fx(lambda x: x + 1, torch.ones(4))
    text = _rng_module(algorithm, state)
    assert _codes(gm, _text(text)) == codes
    assert _codes(gm, _text(artifact.pretty(text))) == codes  # `algorithm = X` form too
    assert _codes(gm, _text(text), target=TRN3) == codes


def test_gather_index_range_evrf056():
    def emb(n):
        return _fx(lambda w: torch.nn.functional.embedding(torch.arange(n), w), torch.randn(8, 4))

    assert _codes(emb(16)) == [("NC506", "NCC_EVRF056")]
    assert _codes(emb(8)) == []


def test_scatter_index_range_evrf031():
    gm = _fx(
        lambda x, s: x.index_copy(0, torch.arange(2, 6), s), torch.zeros(4, 3), torch.ones(4, 3)
    )
    assert _codes(gm) == [("NC506", "NCC_EVRF031")]


def test_hbm_footprint_eoom001():
    gm = _fx(lambda x: (x @ x).relu(), torch.randn(64, 64))
    need, _ = estimate_hbm_bytes(gm)
    assert need >= 3 * 64 * 64 * 4
    tiny = dataclasses.replace(TRN2, hbm_per_core_bytes=need // 4)
    assert _codes(gm, target=tiny, lnc=2) == [("NC507", "NCC_EOOM001")]
    assert _codes(gm, target=tiny, lnc=1) == [("NC507", "NCC_EOOM001")]
    assert _codes(gm, target=dataclasses.replace(TRN2, hbm_per_core_bytes=need)) == []


def test_graph_size_proxy_ebvf030():
    gm = _fx(lambda x: (x @ x.T).relu().exp(), torch.randn(256, 1024))
    small = dataclasses.replace(TRN2, max_instructions=10)
    assert _codes(gm, target=small) == [("NC508", "NCC_EBVF030")]
    assert _codes(gm) == []


def test_check_legality_raises_the_first_violation_with_all_listed():
    gm = _fx(lambda x: x.view(-1), torch.zeros(4, dtype=torch.complex64))
    with pytest.raises(errors.DtypeViolation) as info:
        check_legality(gm, NO_TEXT, TRN2, graph_name="g")
    err = info.value
    assert err.code == "NC502" and err.ncc_code == "NCC_EVRF004" and err.target == "trn2"
    assert "pre-empts NCC_EVRF004" in str(err) and err.violations


class PosEmb(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wpe = torch.nn.Embedding(8, 4)

    def forward(self, x):
        pos = torch.arange(x.shape[1])
        return x + self.wpe(pos)  # a sequence longer than the table


def test_violation_through_torch_compile_names_node_and_user_line(no_neuronx_cc):
    from tests.test_backend import _root_cause

    model = torch.compile(PosEmb(), backend="neuron", options={"target": "trn2"})
    with pytest.raises(Exception) as info:
        model(torch.randn(2, 12, 4))
    err = _root_cause(info.value)
    assert isinstance(err, errors.IndexRangeViolation), repr(info.value)
    assert err.code == "NC506" and err.ncc_code == "NCC_EVRF056" and err.node_name == "embedding"
    assert "test_legality.py" in err.where and "self.wpe(pos)" in err.source
    torch._dynamo.reset()
    model = torch.compile(PosEmb(), backend="neuron", options={"target": "trn2"})
    assert model(torch.randn(2, 8, 4)).shape == (2, 8, 4)  # in range: legal, runs on CPU


def test_constant_index_tensors_are_read_outside_fake_mode(no_neuronx_cc):
    """Regression (conformance ``__getitem__``): the compiler callback runs under FakeTensorMode;
    reading the range of an in-graph constant index must not trip it."""

    def f(x):
        return x[torch.tensor([0, 2])] * 2  # a graph constant (get_attr), not an input

    out = torch.compile(f, backend="neuron", options={"target": "trn2"})(torch.ones(3, 2))
    assert torch.equal(out, torch.full((2, 2), 2.0))

    def g(x):
        return x[torch.tensor([0, 5])]

    with pytest.raises(Exception, match="NC506"):
        torch.compile(g, backend="neuron", options={"target": "trn2"})(torch.ones(3, 2))


def test_counting_decompositions_are_legal_and_exact_on_trn2():
    """embedding_bag's bag ids and segment_reduce's segment ids count with a float32 scatter-add
    (decompositions/counting.py): no integer scatter-add reaches trn2 (NCC_EVRF060), and the
    results are eager's."""
    weight = torch.randn(10, 3, requires_grad=True)
    idx, offsets = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9]), torch.tensor([0, 3, 3, 8])
    data, lengths = torch.randn(6, 2, requires_grad=True), torch.tensor([2, 0, 3, 1])

    def bags(w):
        return F.embedding_bag(idx, w, offsets, mode="mean")

    def segments(d):
        return torch.segment_reduce(d, "max", lengths=lengths, unsafe=True)

    for fn, x in ((bags, weight), (segments, data)):
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend="neuron", options={"target": "trn2"})
        # offsets and lengths are counted with (int64 -> int32 narrowed) arithmetic
        with pytest.warns(DowncastWarning, match="int64 -> int32"):
            out = compiled(x)
            (grad,) = torch.autograd.grad(out.sum(), x)
        expected = fn(x)
        torch.testing.assert_close(out, expected)
        torch.testing.assert_close(grad, torch.autograd.grad(expected.sum(), x)[0])


def test_scatter_count_counts_as_an_integer_scatter_add():
    from neuron_compile.decompositions.counting import scatter_count

    index = torch.randint(0, 5, (3, 40))
    hits = torch.rand(3, 40) > 0.3
    expected = torch.zeros(3, 5, dtype=torch.int64).scatter_add(1, index, hits.long())
    counted = scatter_count((3, 5), 1, index, hits)
    assert counted.dtype == torch.int64 and torch.equal(counted, expected)
