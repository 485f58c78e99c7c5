"""rebase_strided_views: as_strided(_scatter) address eager's storage, across fallbacks too.

Issue 17, reproduction 1: ``as_strided`` of an intermediate view read a compiled region's fresh
buffer instead of the storage eager addresses (wrong values; "setStorage ... out of bounds" on an
empty view). ``tests/fuzz/test_strided_fallback.py`` fuzzes the same boundary.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch._functorch.aot_autograd import aot_function, make_boxed_func

from neuron_compile.errors import UnsupportedOpError
from neuron_compile.passes import rebase_strided_views, run_pipeline
from neuron_compile.passes.rebase_strided_views import EagerLayouts

aten = torch.ops.aten


def _compiled(fn, *args):
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # FallbackWarning where a caller's view runs eagerly
        return torch.compile(fn, backend="neuron")(*args)


def _check(fn, *args):
    expected = fn(*args)
    actual = _compiled(fn, *args)
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert torch.equal(actual, expected), (expected, actual)
    return actual


def test_issue17_as_strided_of_unsafe_view_of_slice_reads_the_base_storage():
    def f(x):
        return aten.as_strided(aten._unsafe_view(x[1:3], [4, 4]), (2, 2), (8, 1), 0)

    x = torch.arange(24.0).reshape(3, 2, 4)
    assert _check(f, x).tolist() == [[0.0, 1.0], [8.0, 9.0]]


@pytest.mark.parametrize("compute", [False, True], ids=["input", "intermediate"])
def test_as_strided_of_an_empty_view_reads_the_storage_behind_it(compute):
    """The view is empty, its storage is not: eager reads it (was: setStorage out of bounds)."""

    def f(x):
        base = x + 1 if compute else x
        return aten.as_strided(base[1:1], (2, 2), (8, 1), 0)

    x = torch.arange(24.0).reshape(3, 2, 4)
    _check(f, x)


def test_as_strided_reading_nothing_from_an_empty_storage():
    f = lambda x: aten.as_strided((x + 1)[1:1], (0, 2), (8, 1), 0)  # noqa: E731
    _check(f, torch.zeros(0, 2, 4))


def test_as_strided_of_a_transposed_intermediate_uses_its_dense_layout():
    f = lambda x: aten.as_strided((x * 2).t(), (2, 2), (8, 1), 0)  # noqa: E731
    _check(f, torch.arange(24.0).reshape(6, 4))


def test_as_strided_of_a_callers_view_runs_on_the_callers_storage():
    """The input is a view into a larger tensor: only the caller's tensor knows the rest."""

    def f(x):
        return aten.as_strided(x * 1, (2, 2), (8, 1), 0) + aten.as_strided(x, (2, 2), (1, 4), 3)

    _check(f, torch.arange(24.0).reshape(3, 2, 4)[1:])


def test_as_strided_without_offset_keeps_the_views_offset():
    f = lambda x: aten.as_strided((x + 1)[1:], (2, 2), (8, 1))  # noqa: E731
    _check(f, torch.arange(24.0).reshape(3, 2, 4))


def test_as_strided_without_offset_of_a_callers_view_follows_each_calls_offset():
    """No offset means the caller's view's own, call by call: the first call's was baked in, so
    a same-shaped view at another offset read the wrong place (or out of its storage)."""
    f = lambda y: y.as_strided((2, 3), (3, 1)) * 1  # noqa: E731
    # t() keeps y's offset: the view may be taken of an in-graph view of the caller's
    g = lambda y: y.t().as_strided((2, 2), (1, 3)) + 1  # noqa: E731
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cf, cg = torch.compile(f, backend="neuron"), torch.compile(g, backend="neuron")
        base, rows = torch.arange(30.0), torch.arange(40.0).reshape(4, 10)
        for y in (base[5:15], base[3:13], torch.arange(10.0)):
            assert torch.equal(cf(y), f(y))
        for y in (rows[:, 2:5], rows[:, 1:4]):
            assert torch.equal(cg(y), g(y))


def test_as_strided_without_offset_on_a_shifted_view_of_a_callers_view_is_refused():
    f = lambda y: y[1:].as_strided((2, 2), (2, 1)) * 1  # noqa: E731
    with pytest.raises(UnsupportedOpError, match=r"(?s)\[NC101\].*shifted from a caller's view"):
        _compiled(f, torch.arange(30.0)[5:15])


def test_as_strided_scatter_into_a_view_keeps_the_whole_storage():
    def f(x):
        out = aten.as_strided_scatter((x + 1)[1:], torch.zeros(2, 2), (2, 2), (8, 1), 0)
        return out * 3, aten.as_strided(out, (3,), (1,), 0)

    x = torch.arange(24.0).reshape(3, 2, 4)
    expected = f(x)
    actual = _compiled(f, x)
    for a, e in zip(actual, expected, strict=True):
        assert torch.equal(a, e)


def test_slice_scatter_result_carries_its_inputs_storage():
    """slice_scatter clones its input's whole storage (AOTAutograd's metadata says it does not)."""

    def f(x):
        out = aten.slice_scatter((x + 1)[1:], torch.zeros(1, 2, 4), 0, 0, 1)
        return aten.as_strided(out, (3,), (1,), 0)

    _check(f, torch.arange(24.0).reshape(3, 2, 4))


def test_dtype_view_of_an_intermediate_addresses_bytes_of_its_storage():
    f = lambda x: aten.as_strided((x + 1).view(torch.int32)[1:], (2, 2), (8, 1), 0)  # noqa: E731
    _check(f, torch.arange(24.0).reshape(3, 2, 4))


def test_dtype_view_of_a_callers_view_is_refused_with_a_code():
    f = lambda x: aten.as_strided(x.view(torch.int32)[1:], (2, 2), (8, 1), 0)  # noqa: E731
    x = torch.arange(24.0).reshape(3, 2, 4)[1:]
    with pytest.raises(
        UnsupportedOpError, match=r"\[NC101\] cannot compute aten.as_strided"
    ) as info:
        _compiled(f, x)
    assert info.value.code == "NC101"  # our error itself, not Dynamo's wrapper


# ---- the pass on its own -----------------------------------------------------------------------


def _graphs(fn, *args):
    seen = []

    def compiler(gm, _inputs):
        seen.append(gm)
        return make_boxed_func(gm)

    aot_function(fn, compiler)(*args)
    return seen[0]


def test_graph_without_views_under_as_strided_is_unchanged():
    gm = _graphs(lambda x: aten.as_strided(x, (2, 2), (4, 1), 1), torch.arange(8.0))
    before = gm.code
    assert rebase_strided_views(gm) is False
    assert gm.code == before


def test_rewritten_graph_reads_a_flat_storage_and_is_idempotent():
    def f(x):
        return aten.as_strided(aten._unsafe_view(x[1:3], [4, 4]), (2, 2), (8, 1), 0)

    x = torch.arange(24.0).reshape(3, 2, 4)
    gm = _graphs(f, x)
    assert run_pipeline(gm, [rebase_strided_views]) == ["rebase_strided_views"]
    (node,) = [n for n in gm.graph.nodes if n.target is aten.as_strided.default]
    source = node.args[0].meta["val"]
    assert source.dim() == 1 and source.numel() == 24 and node.args[3] == 0
    assert rebase_strided_views(gm) is False
    assert torch.equal(gm(x)[0], f(x))


@pytest.mark.parametrize("scatter", [False, True])
def test_layouts_are_replayed_only_above_a_storage_cloning_op(scatter):
    """The replay (a fake run of everything above the as_strided) differs from AOTAutograd's
    metadata only where a ``*_scatter`` op clones a storage; elsewhere it is skipped."""

    def f(x):
        y = (x + 1).reshape(3, 8)
        if scatter:
            y = aten.slice_scatter(y, torch.zeros(3, 2), 1, 0, 2)
        return aten.as_strided(y.t(), (2, 2), (8, 1), 0)

    gm = _graphs(f, torch.arange(24.0))
    targets = [n for n in gm.graph.nodes if n.target is aten.as_strided.default]
    layouts = EagerLayouts(gm.graph, targets)
    assert bool(layouts.vals) is scatter
    assert layouts(targets[0]).shape == (2, 2)
