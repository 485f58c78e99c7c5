"""Input specs describe tensors by metadata only (issue 16).

Compiled autograd hands the backend a list of tensors whose storage FSDP2 freed; ``input_specs``
used to ``repr()`` any input it could not hash, which read the freed storage (SIGSEGV on every
rank) and, for live tensors, cost 0.36 s and built a 1.1 MB string for a list of 200.
"""

from __future__ import annotations

import operator
import statistics
import time

import pytest
import torch
import torch.fx as fx

from neuron_compile.backend import neuron_backend
from neuron_compile.shapes import _signature, diagnose, input_specs


def _freed(*shape: int) -> torch.Tensor:
    """A tensor whose storage was released as FSDP2 releases unsharded parameters."""
    t = torch.randn(*shape)
    t.untyped_storage().resize_(0)
    return t


@pytest.fixture
def no_tensor_repr(monkeypatch: pytest.MonkeyPatch) -> None:
    """Printing a tensor fails the test instead of (for freed storage) crashing the process."""

    def refuse(self: torch.Tensor, *args: object, **kwargs: object) -> str:
        raise AssertionError("a tensor was printed")

    monkeypatch.setattr(torch.Tensor, "__repr__", refuse)
    monkeypatch.setattr(torch.Tensor, "__str__", refuse)


def test_containers_of_tensors_are_described_by_shape_dtype_and_stride(no_tensor_repr) -> None:
    x = torch.zeros(2, 3).t()
    specs = input_specs(
        ["xs", "pair", "named"],
        [[torch.zeros(4), x], (torch.zeros(1, dtype=torch.int32), 3), {"w": torch.zeros(5, 6)}],
    )
    by_name = {s.name: s for s in specs}
    assert by_name["xs"].value == "list of 2"
    assert by_name["xs[0]"].shape == (4,) and by_name["xs[0]"].dtype == "torch.float32"
    assert by_name["xs[1]"].shape == (3, 2) and by_name["xs[1]"].stride == (1, 3)
    assert by_name["pair[0]"].dtype == "torch.int32"
    assert by_name["pair[1]"].value == 3
    assert by_name["named['w']"].shape == (5, 6) and by_name["named['w']"].stride == (6, 1)


def test_freed_storage_is_described_never_read(no_tensor_repr) -> None:
    specs = input_specs(["inputs"], [[_freed(4, 8), _freed(8)]])
    by_name = {s.name: s for s in specs}
    assert by_name["inputs[0]"].shape == (4, 8) and by_name["inputs[0]"].stride == (8, 1)
    assert by_name["inputs[1]"].shape == (8,)


def test_a_list_element_that_changed_is_named() -> None:
    old = input_specs(["inputs"], [[torch.zeros(4), torch.zeros(2)]])
    new = input_specs(["inputs"], [[torch.zeros(4), torch.zeros(3)]])
    assert diagnose([old], new) == "inputs[1] dim 0=3 (was 2)"


def test_specializer_signature_takes_lists() -> None:
    """The automatic-dynamic path keys compiled graphs by this; a list used to raise
    ``unhashable type``."""
    a = _signature([[torch.zeros(4), _freed(2)], {"k": torch.zeros(1)}, [bytearray(2)]])
    b = _signature([[torch.zeros(4), _freed(2)], {"k": torch.zeros(1)}, [bytearray(2)]])
    assert a == b and hash(a) == hash(b)
    assert a != _signature([[torch.zeros(5), _freed(2)], {"k": torch.zeros(1)}, [bytearray(2)]])


def test_input_specs_of_200_tensors_is_fast() -> None:
    tensors = [torch.randn(16, 16) for _ in range(200)]
    times = []
    for _ in range(7):
        t0 = time.perf_counter()
        input_specs(["inputs"], [tensors])
        times.append(time.perf_counter() - t0)
    assert statistics.median(times) < 5e-3, times


# ---- the backend, as compiled autograd calls it -----------------------------------------------
def _list_input_graph() -> fx.GraphModule:
    """What Dynamo hands a backend under compiled autograd: the first input is a list of tensors
    (``steal_arg``: the graph may free them), read here for one element only."""
    graph = fx.Graph()
    inputs = graph.placeholder("inputs")
    inputs.meta["steal_arg"] = True
    y = graph.placeholder("y")
    graph.call_function(operator.getitem, (inputs, 0))
    graph.output((graph.call_function(torch.mul, (y, 2)),))
    return fx.GraphModule(torch.nn.Module(), graph)


def test_backend_takes_a_list_of_freed_tensors() -> None:
    freed = [_freed(4) for _ in range(200)]
    y = torch.randn(3)
    compiled = neuron_backend(_list_input_graph(), [freed, y])
    (out,) = compiled(freed, y)
    torch.testing.assert_close(out, y * 2, rtol=0, atol=0)


def test_compiled_function_of_a_freed_list_matches_eager() -> None:
    def fn(xs: list[torch.Tensor], y: torch.Tensor) -> torch.Tensor:
        return y * len(xs) + xs[0].shape[0]  # shapes only: the storage is gone

    freed = [_freed(4) for _ in range(3)]
    y = torch.arange(3.0)  # exact in float32 whatever the order of operations
    compiled = torch.compile(fn, backend="neuron")
    torch.testing.assert_close(compiled(freed, y), fn(freed, y), rtol=0, atol=0)
