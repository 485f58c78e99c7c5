"""Fuzz the fallback boundary with storage-addressing ops (issue 17, build 1).

Hypothesis draws chains of views and strided ops (slices, permutes, transposes, ``_unsafe_view``
/ ``reshape``, ``as_strided`` with in-bounds sizes, strides and offsets, ``as_strided_scatter``)
around a forced CPU fallback (an op no backend lowers), on an input that is a whole tensor or a
view into a larger one. Each chain runs through AOTAutograd and ``compile_graph`` with
``fallback="cpu"`` (compiled regions on XLA CPU, the rest eager) and must match eager exactly:
values, dtype and shape. Inputs are ``arange`` values, so reading one wrong storage position
changes the answer.

A step is data (a name and small integers); ``_resolve`` turns it into concrete op arguments by
running the chain eagerly once, so ``as_strided`` parameters are in bounds of the storage eager
has at that point. CI runs ``NEURON_COMPILE_FUZZ_EXAMPLES`` examples (default 200), derandomized;
``NEURON_COMPILE_FUZZ_RANDOM=1`` explores.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch._functorch.aot_autograd import aot_function

from neuron_compile.compiler import compile_graph
from neuron_compile.config import NeuronConfig
from neuron_compile.errors import UnsupportedOpError

EXAMPLES = int(os.environ.get("NEURON_COMPILE_FUZZ_EXAMPLES", "200"))
DERANDOMIZE = os.environ.get("NEURON_COMPILE_FUZZ_RANDOM", "") != "1"
aten = torch.ops.aten
Tensor = torch.Tensor


@torch.library.custom_op("nctest::opaque_affine", mutates_args=())
def opaque_affine(x: Tensor) -> Tensor:
    """``2x + 1`` as a fresh contiguous tensor: an op neuron-compile cannot lower."""
    return (x * 2 + 1).contiguous()


@opaque_affine.register_fake
def _(x: Tensor) -> Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@dataclass(frozen=True)
class Step:
    """One op of a chain: ``kind`` and small integers that ``_resolve`` fits to the tensor."""

    kind: str
    params: tuple[int, ...]


def _storage_numel(x: Tensor) -> int:
    return x.untyped_storage().nbytes() // x.element_size()


def _fit_geometry(
    sizes: list[int], strides: list[int], room: int
) -> tuple[list[int], list[int]] | None:
    """Shrink ``sizes`` until the strided extent fits in ``room`` storage positions."""
    sizes = list(sizes)
    while True:
        if any(s == 0 for s in sizes):
            return sizes, strides
        extent = 1 + sum((s - 1) * st for s, st in zip(sizes, strides, strict=True))
        if extent <= room:
            return sizes, strides
        d = max(range(len(sizes)), key=lambda i: (sizes[i] - 1) * strides[i])
        if sizes[d] == 1:
            return None
        sizes[d] -= 1


def _strided_args(x: Tensor, p: tuple[int, ...], non_overlapping: bool) -> tuple | None:
    """(size, stride, offset) in bounds of ``x``'s storage; offset None means x's own."""
    rank = p[0] % 3 + 1
    sizes = [1 + (v % 4) for v in p[1 : 1 + rank]]
    if non_overlapping:  # nested strides, then a random dim order: no two elements collide
        strides, step = [0] * rank, 1 + p[4] % 2
        for d in reversed(range(rank)):
            strides[d] = step
            step *= sizes[d] + p[5] % 2
        order = sorted(range(rank), key=lambda d: (p[6] * (d + 1)) % 7)
        sizes, strides = [sizes[d] for d in order], [strides[d] for d in order]
    else:
        strides = [v % 5 for v in p[4 : 4 + rank]]
    # torch's own meta for as_strided_scatter (which every tracer runs) checks bounds against
    # the input's element count, with an omitted offset read as 0: stay inside what it accepts.
    room = x.numel() if non_overlapping else _storage_numel(x)
    keep_offset = p[7] % 4 == 0 and not (non_overlapping and x.storage_offset())
    start = x.storage_offset() if keep_offset else 0
    fitted = _fit_geometry(sizes, strides, room - start)
    if fitted is None:
        return None
    sizes, strides = fitted
    extent = 1 + sum((s - 1) * st for s, st in zip(sizes, strides, strict=True))
    if keep_offset:
        return sizes, strides, None
    return sizes, strides, p[8] % max(1, room - extent + 1)


def _resolve(step: Step, x: Tensor) -> Callable[[Tensor], Tensor] | None:
    """The op ``step`` means for ``x`` (None: it does not apply here, skip it)."""
    p, rank = step.params, x.dim()
    if step.kind == "slice" and rank:
        d = p[0] % rank
        n = x.shape[d]
        start, stop, stride = p[1] % (n + 1), p[1] % (n + 1) + p[2] % (n + 1), 1 + p[3] % 2
        return lambda t: aten.slice.Tensor(t, d, start, stop, stride)
    if step.kind == "permute" and rank > 1:
        perm = sorted(range(rank), key=lambda d: (p[0] * (d + 1) + p[1]) % (rank + 3))
        return lambda t: t.permute(perm)
    if step.kind == "transpose" and rank > 1:
        d0, d1 = p[0] % rank, p[1] % rank
        return lambda t: t.transpose(d0, d1)
    if step.kind == "view":
        n = x.numel()
        divisors = [k for k in range(1, n + 1) if n % k == 0] or [0]
        k = divisors[p[0] % len(divisors)]
        shape = [k, n // k] if k else [0, p[1] % 3]
        if x.is_contiguous() and p[2] % 2:
            return lambda t: aten._unsafe_view(t, shape)
        return lambda t: t.reshape(shape)
    if step.kind == "fallback":
        return opaque_affine
    if step.kind == "as_strided":
        args = _strided_args(x, p, non_overlapping=False)
        return None if args is None else (lambda t: aten.as_strided(t, *args))
    if step.kind == "as_strided_scatter":
        args = _strided_args(x, p, non_overlapping=True)
        if args is None:
            return None
        size, n = args[0], torch.Size(args[0]).numel()
        return lambda t: aten.as_strided_scatter(
            t, -1 - torch.arange(n, dtype=t.dtype).reshape(size), *args
        )
    if step.kind == "add":
        return lambda t: t + 100
    return None


KINDS = ("slice", "permute", "transpose", "view", "as_strided", "as_strided_scatter", "add")
_ints = st.tuples(*[st.integers(0, 30)] * 9)
steps = st.builds(Step, st.sampled_from(KINDS), _ints)


@st.composite
def programs(draw: st.DrawFn) -> tuple:
    dtype = draw(st.sampled_from([torch.float32, torch.int64]))
    shape = draw(st.lists(st.integers(0, 4), min_size=1, max_size=3))
    before = draw(st.lists(steps, max_size=3))
    after = draw(st.lists(steps, min_size=1, max_size=3))
    # The input: a whole tensor, or a caller's view into a larger one (its storage extends
    # beyond its elements, which only the caller's tensor knows).
    input_view = draw(st.sampled_from([0, 0, 0, 1, 2]))
    return dtype, shape, [*before, Step("fallback", ()), *after], input_view


def _input(dtype: torch.dtype, shape: list[int], input_view: int) -> Tensor:
    n = torch.Size(shape).numel()
    # Empty caller's views stay out: torch's own tracing (Dynamo's fakeification) can lose their
    # storage and raise before any backend runs; in-graph empty views are drawn all the same.
    if input_view == 0 or n == 0:
        return torch.arange(n, dtype=dtype).reshape(shape).clone()  # owns its storage
    base = torch.arange(2 * n + 5, dtype=dtype)
    if input_view == 1:  # contiguous, offset 3
        return base[3 : 3 + n].view(shape)
    return base[1 : 1 + 2 * n : 2].view(shape)  # every other element, offset 1


def _callers_view(x: Tensor) -> bool:
    """Whether ``x``'s storage holds more than its elements (a view into a larger tensor)."""
    return x.untyped_storage().nbytes() != x.numel() * x.element_size()


def _chain(program: list[Step], x: Tensor) -> tuple[Callable[[Tensor], Tensor], list[str]]:
    ops, names, t = [], [], x
    for step in program:
        op = _resolve(step, t)
        if op is None:
            continue
        t = op(t)
        ops.append(op)
        names.append(step.kind)

    def fn(t: Tensor) -> Tensor:
        for op in ops:
            t = op(t)
        return t + 0  # a graph output that is no view of the input

    return fn, names


def _compiled(fn: Callable[[Tensor], Tensor], dynamo: bool) -> Callable[[Tensor], Tensor]:
    """``fn`` through AOTAutograd and ``compile_graph`` (fallback on). Caller's views go through
    Dynamo, which fakeifies a view with its base's storage; ``aot_function`` alone (faster, used
    for the rest) fakeifies it as a tensor of its own."""
    if dynamo:
        torch._dynamo.reset()
        return torch.compile(fn, backend="neuron", options={"fallback": "cpu"})
    cfg = NeuronConfig(fallback="cpu")

    def compiler(gm: torch.fx.GraphModule, inputs: list) -> object:
        return compile_graph(gm, inputs, name="strided_fuzz", kind="inference", cfg=cfg)

    return aot_function(fn, fw_compiler=compiler)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=DERANDOMIZE,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(programs())
def test_strided_chain_around_fallback_matches_eager(program):
    dtype, shape, steps_, input_view = program
    x = _input(dtype, shape, input_view)
    fn, names = _chain(steps_, x)
    expected = fn(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            actual = _compiled(fn, dynamo=_callers_view(x))(x)
        except UnsupportedOpError as e:  # a refusal is allowed; a wrong answer is not
            assert "NC101" in str(e), names
            return
    assert actual.dtype == expected.dtype, names
    assert actual.shape == expected.shape, names
    assert torch.equal(actual, expected), f"{names}\n{expected}\n{actual}"
