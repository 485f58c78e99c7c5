"""The runtime side of one compiled graph: marshal inputs, execute, rebuild outputs.

A training step calls each graph once, and everything a call does outside the executor is
overhead over eager PyTorch. Right after an execute the CPU caches are cold (the executor just
streamed every activation through them), so each Python-level step per tensor costs ~1-2 us; a
GPT block's forward and backward move ~80 tensors apiece. So after the first call, a graph runs
from a *call plan* (``_FastPlan``): every input and output position is sorted into a group
(parameters with a cached zero-copy alias, saved activations from the forward's token,
constants, the rest), and a call moves each group with one C-level gather
(``operator.itemgetter``, ``map``) instead of a Python loop over positions. Only the "rest" (token
ids, tangents, the RNG seed) is handled one by one. Whenever a precondition fails (a parameter
was replaced, saved-tensor hooks are active, an executor without the array interface) the call
takes the general path, which also rebuilds the plan.
"""

from __future__ import annotations

import math
import operator
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

from .errors import BUG_HINT, ExecutorError
from .lowering.context import canonical_dtype
from .lowering.lower_graph import LoweredGraph
from .metrics import GraphRecord
from .saved import SavedLink, externally_observed, token_arrays, token_holding

#: Largest input of unchanged dtype that a call copies into a staging buffer.
STAGE_BYTES = 1 << 16
_is = operator.is_
_data_ptr = torch.Tensor.data_ptr


def gather(indices: Sequence[int]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """``seq -> tuple(seq[i] for i in indices)``, in C for any length (itemgetter returns a
    bare item, not a 1-tuple, for one index)."""
    if not indices:
        return lambda seq: ()
    if len(indices) == 1:
        (i,) = indices
        return lambda seq: (seq[i],)
    return operator.itemgetter(*indices)


class _OutputPlan:
    """Outputs from ``results + passthrough inputs + [None, *constants] (+ [token])``."""

    def __init__(
        self,
        plan: Sequence[tuple[str, int, Any, Any, tuple[int, ...] | None]],
        num_results: int,
        num_inputs: int,
        export: list[int] | None,
        num_saved: int = 0,
    ) -> None:
        self.export = export  # results the executor returns as tensors (None: all)
        consts = [value for kind, _, _, value, _ in plan if kind == "const"]
        self.tail = [None, *consts]
        none_at = num_results + num_inputs
        token_at = none_at + len(self.tail)
        scatter = [num_results + num_inputs] * num_saved  # the tail's None: not resident
        where, inputs, n_const = [], 0, 0
        # Results the executor returns in another dtype than the caller expects (the 64-bit
        # policy), by result index: a result in two output slots is converted once, so both
        # slots hold the same tensor, as they would in eager.
        converts: dict[int, torch.dtype] = {}
        # Results eager lays out otherwise than contiguously (OutputSpec.stride), by index.
        restrides: dict[int, tuple[int, ...]] = {}
        # Outputs eager returns as views of another output or of an input: (base's index in the
        # sources, size, stride, storage offset from the base's), built after everything else;
        # empty outputs as (-1, size, dtype, 0). Input bases follow the passthrough inputs the
        # "input" outputs take.
        views: list[tuple[int, tuple[int, ...], tuple[int, ...], int]] = []
        view_inputs = num_results + sum(1 for kind, *_ in plan if kind == "input")
        for kind, index, dtype, value, stride in plan:
            if kind in ("result_view", "input_view"):
                base = index if kind == "result_view" else view_inputs
                view_inputs += kind == "input_view"
                where.append(-1 - len(views))  # placed once the sources' length is known
                views.append((base, value[0], stride, value[1]))
            elif kind == "empty":
                where.append(-1 - len(views))
                views.append((-1, value, dtype, 0))
            elif kind == "result":
                where.append(index)
                if canonical_dtype(dtype) != dtype:
                    converts[index] = dtype
                if stride is not None:
                    restrides[index] = stride
            elif kind == "input":
                where.append(num_results + inputs)
                inputs += 1
            elif kind == "none":
                where.append(none_at)
            elif kind == "const":
                n_const += 1
                where.append(none_at + n_const)
            else:  # "saved": the token
                where.append(token_at)
                scatter[value] = index
        self.converts = list(converts.items())
        self.restrides = list(restrides.items())
        self.scatter = gather(scatter) if num_saved else None
        self.views = views
        views_at = token_at + (1 if num_saved else 0)
        self.outputs = gather([w if w >= 0 else views_at - 1 - w for w in where])

    def assemble(self, results: list[Any], inputs: list[Any]) -> list[Any]:
        """The graph's outputs from the executor's ``results`` (a fresh list, edited in place)."""
        for index, dtype in self.converts:
            r = results[index]
            if r.dtype != dtype:
                results[index] = r.to(dtype)
        for index, stride in self.restrides:  # one copy, as eager's kernel would have written
            r = results[index]
            if r.stride() != stride:
                results[index] = _laid_out(r, stride)
        src = results + inputs + self.tail
        if self.scatter is not None:
            src.append(token_holding(list(self.scatter(src))))
        for base, size, stride, offset in self.views:
            if base < 0:  # "empty": ``stride`` is the dtype
                src.append(torch.empty(size, dtype=stride))
                continue
            b = src[base]
            src.append(b.as_strided(size, stride, b.storage_offset() + offset))
        return list(self.outputs(src))


def _laid_out(r: torch.Tensor, stride: tuple[int, ...]) -> torch.Tensor:
    """``r``'s values with eager's ``stride``; a 0 stride (a broadcast dim) keeps one element of
    that dim, which the others then share, as in eager's expanded tensor."""
    if 0 not in stride:
        return torch.empty_strided(r.shape, stride, dtype=r.dtype).copy_(r)
    one = r[tuple(slice(0, 1) if step == 0 else slice(None) for step in stride)]
    dense = torch.empty_strided(one.shape, [step or 1 for step in stride], dtype=r.dtype)
    return dense.copy_(one).as_strided(r.shape, stride)


class _FastPlan:
    """Where each ``@main`` argument comes from (module docstring)."""

    def __init__(self, graph: CompiledGraph) -> None:
        slots = graph._param_slots
        self.slots = list(slots)  # the aliases it was built from: a call that changes one rebuilds
        aliased = [s for s, alias in enumerate(slots) if alias is not None]
        saved = graph._saved_slots
        static = [s for s, (_, const, _) in enumerate(graph._inputs) if const is not None]
        exe = graph._exe
        staged = self._stageable(graph, {*aliased, *saved, *static})
        taken = {*aliased, *saved, *static, *staged}
        self.other = [s for s in range(len(slots)) if s not in taken]
        self.alias_args = gather([graph._inputs[s][0] for s in aliased])
        self.alias_tensors = tuple(slots[s][0] for s in aliased)
        self.alias_ptrs = tuple(slots[s][1] for s in aliased)
        # Constants are ours and never change: import each once.
        self.fixed = (
            [slots[s][2] for s in aliased]
            + [exe.to_xla(None, s, graph._inputs[s][1]) for s in static]
            + [array for _, array in staged.values()]
        )
        self.staging = [(graph._inputs[s][0], buf) for s, (buf, _) in staged.items()]
        self.busy = threading.Lock() if self.staging else None  # held while staging is in use
        self.saved_args = gather([graph._inputs[s][0] for s in saved])
        order = saved + aliased + static + list(staged) + self.other
        where = {slot: i for i, slot in enumerate(order)}
        self.arguments = gather([where[s] for s in range(len(slots))])

    def _stageable(self, graph: CompiledGraph, taken: set[int]) -> dict[int, tuple[Any, Any]]:
        """Inputs the 64-bit policy narrows (token ids: int64 -> int32) and other small
        inputs (a loss's tangent), each with a buffer of ``@main``'s dtype that XLA aliases: a
        call copies into it (one torch op, ~20 us with cold caches) where it would import a new
        buffer (~40 us, and as much again to convert first). Large same-dtype inputs import
        zero-copy instead: copying them would cost more.

        Only when every call hands some result to torch, which waits for the execution: the
        buffer is never overwritten while an execution still reads it.
        """
        plans = [p for p in (graph._plain_out, graph._resident_out) if p is not None]
        if not all(p.export is None or p.export for p in plans) or not graph.lowered.num_results:
            return {}
        staged = {}
        for slot, spec in enumerate(graph.lowered.inputs):
            index, _, dtype = graph._inputs[slot]
            small = spec.dtype.itemsize * math.prod(spec.shape) <= STAGE_BYTES
            if slot in taken or index < 0 or (spec.dtype == dtype and not small):
                continue
            buf = torch.empty(spec.shape, dtype=dtype)
            array = graph._exe.to_xla(None, slot, buf)
            if array.unsafe_buffer_pointer() == buf.data_ptr():  # zero-copy alias
                staged[slot] = (buf, array)
        return staged

    def arguments_of(self, graph: CompiledGraph, args: list[Any]) -> list[Any] | None:
        """``@main``'s arguments for this call, or None if the plan does not hold for it."""
        params = self.alias_args(args)
        if not all(map(_is, params, self.alias_tensors)):
            return None
        if tuple(map(_data_ptr, params)) != self.alias_ptrs:
            return None
        saved: tuple[Any, ...] = ()
        if graph._token_arg is not None:
            arrays = token_arrays(args[graph._token_arg])
            if arrays is None:
                return None
            saved = graph._exe.adopt(self.saved_args(arrays))
        for index, buf in self.staging:
            # No autograd edge into ``buf``: AOTAutograd runs compiled graphs with grad off.
            buf.copy_(args[index])
        src = [*saved, *self.fixed]
        for slot in self.other:
            src.append(graph._argument(args, slot))
        return list(self.arguments(src))


class CompiledGraph:
    """The runtime side of one graph: marshal inputs, execute, rebuild outputs."""

    def __init__(
        self,
        name: str,
        lowered: LoweredGraph,
        executable: Any,
        constants: dict[str, torch.Tensor],
        record: GraphRecord,
    ) -> None:
        # An instance attribute, not a class one: AOTAutograd wraps backward compilers in
        # functools.wraps-based decorators that copy __dict__ only.
        self._boxed_call = True
        # False for regions of a partitioned graph: its FallbackRunner counts the calls.
        self.count_calls = False
        self._first_call = True
        self.name = name
        self.record = record
        self.lowered = lowered
        self._exe = executable
        # Per-argument plans: (graph-input index, or RNG_SEED; constant or None; dtype @main
        # takes). Constants (get_attr) are converted once here, not on every call. This runs
        # inside AOTAutograd's compiler callback, where FakeTensorMode is active: leave it, or
        # the converted constant would be a fake tensor without data.
        with _disable_current_modes():
            self._inputs = [
                (
                    spec.index,
                    constants[spec.attr].to(spec.arg_dtype).contiguous() if spec.attr else None,
                    spec.arg_dtype,
                )
                for spec in lowered.inputs
            ]
        # Parameters' XLA aliases between calls (see XlaCpuExecutable); per graph, not per
        # executable, because executables are shared by identical graphs of different models.
        self._param_slots: list[Any] = [None] * len(lowered.inputs)
        # Inputs handed back: returned as they are, then those some output is a view of.
        self._passthrough = [o.index for o in lowered.outputs if o.kind == "input"] + [
            o.index for o in lowered.outputs if o.kind == "input_view"
        ]
        self._passthrough_args = gather(self._passthrough)
        # How outputs are rebuilt from the results, on every path.
        self._plain_out = _OutputPlan(
            [(o.kind, o.index, o.dtype, o.value, o.stride) for o in lowered.outputs],
            lowered.num_results,
            len(self._passthrough),
            None,
        )
        # Saved activations kept on the device (neuron_compile/saved.py). Forward: per result,
        # True if it stays an executor array; ``_resident_out`` rebuilds the outputs then.
        self._resident_out: _OutputPlan | None = None
        # Backward: which argument holds the forward's token, and the argument slots that
        # take saved values from it (saved value i is graph input i).
        self._token_arg: int | None = None
        self._saved_slots: list[int] = []
        self._register_outputs = True  # remember our outputs' addresses for a later re-import
        #: The graph's FX index key (cache/fx_index.py), when it has one: the AOTAutograd cache
        #: entry refers to the graph by it (aot_cache.py).
        self.fx_key: str | None = None
        # Executors with the array interface (XlaCpuExecutable) get the call plan, built after
        # the first call has cached the parameters' aliases.
        self._fast: _FastPlan | None = None
        self._plan_enabled = hasattr(executable, "run")

    def keep_saved_resident(self, link: SavedLink) -> None:
        """Forward graph: keep saved activations that only the backward reads as arrays."""
        outputs = self.lowered.outputs
        num_saved = len(outputs) - link.num_fwd_outputs
        user_results = {o.index for o in outputs[: link.num_fwd_outputs] if o.kind == "result"}
        resident = []
        plan = [(o.kind, o.index, o.dtype, o.value, o.stride) for o in outputs]
        keep = [False] * self.lowered.num_results
        for pos in range(link.num_fwd_outputs, len(outputs)):
            o = outputs[pos]
            if o.kind == "result" and o.index not in user_results:
                keep[o.index] = True  # a value saved twice is one array behind both slots
                resident.append(pos - link.num_fwd_outputs)
                plan[pos] = ("saved", o.index, o.dtype, pos - link.num_fwd_outputs, None)
        if not resident:
            return
        link.resident = tuple(resident)
        export = [i for i, kept in enumerate(keep) if not kept]
        self._resident_out = _OutputPlan(
            plan, self.lowered.num_results, len(self._passthrough), export, num_saved
        )
        self._fast = None

    def read_saved_from(self, link: SavedLink) -> None:
        """Backward graph: take the forward's resident activations from its token."""
        if link.resident:
            self._token_arg = link.resident[0]
            resident = set(link.resident)
            self._saved_slots = [
                slot for slot, (index, _, _) in enumerate(self._inputs) if index in resident
            ]
        self._register_outputs = False  # gradients go to .grad, not into another graph
        self._fast = None

    def _tensor(self, args: list[Any], slot: int) -> torch.Tensor:
        """``@main``'s argument ``slot`` as a contiguous tensor of the dtype it takes."""
        index, const, dtype = self._inputs[slot]
        if const is not None:
            t = const
        elif index >= 0:
            t = args[index]
        else:  # RNG_SEED: drawn from torch's default generator, so manual_seed reproduces runs
            t = torch.randint(-(2**31), 2**31 - 1, (4,), dtype=torch.int32)
        if t.is_neg() or t.is_conj():
            # A lazy view (``z.conj().imag`` from an eager op before this region): dlpack
            # exports its storage, not the values it stands for.
            t = t.resolve_conj().resolve_neg()
        if t.dtype != dtype:
            t = t.to(dtype)
        # No detach(): the executor's dlpack export ignores autograd metadata.
        return t if t.is_contiguous() else t.contiguous()

    def _argument(self, args: list[Any], slot: int) -> Any:
        """One ``@main`` argument that no group of the call plan covers, as an array."""
        return self._exe.to_xla(None, slot, self._tensor(args, slot))

    def __call__(self, args: list[Any]) -> list[Any]:
        if self.count_calls:
            self.record.calls += 1
        fast = self._fast
        if fast is None:
            if self._first_call:  # timed once, off the planned path: metrics().first_run_s
                self._first_call = False
                started = time.perf_counter()
                try:
                    return self._call_general(args)
                finally:
                    self.record.first_run_s += time.perf_counter() - started
            return self._call_general(args)
        if fast.busy is None:
            return self._call_planned(fast, args)
        # Staging buffers are the plan's: a call made while another thread's call of this graph
        # is using them takes the general path (own buffers) rather than waiting.
        if not fast.busy.acquire(blocking=False):
            return self._call_general(args)
        try:
            return self._call_planned(fast, args)
        finally:
            fast.busy.release()

    def _call_planned(self, fast: _FastPlan, args: list[Any]) -> list[Any]:
        arguments = fast.arguments_of(self, args)
        if arguments is None:
            return self._call_general(args)
        inputs = list(self._passthrough_args(args))
        args.clear()  # boxed convention: let the caller's references go before we run
        plan = self._output_plan()
        try:
            results = self._exe.run(arguments, plan.export, self._register_outputs)
        except Exception as e:
            raise self._failed(e) from e
        return plan.assemble(results, inputs)

    def _output_plan(self) -> _OutputPlan:
        """Resident saved activations unless saved-tensor hooks must see real tensors."""
        if self._resident_out is not None and not externally_observed():
            return self._resident_out
        return self._plain_out

    def _failed(self, e: Exception) -> ExecutorError:
        return ExecutorError(
            f"XLA CPU failed to run graph {self.name}: {type(e).__name__}: {e}", hint=BUG_HINT
        )

    def _call_general(self, args: list[Any]) -> list[Any]:
        """Any call the plan does not cover; then (re)build the plan for the next calls."""
        saved = token_arrays(args[self._token_arg]) if self._token_arg is not None else None
        slots = self._param_slots
        ins = []
        for slot, (index, const, _) in enumerate(self._inputs):
            if const is None and index >= 0:
                t = args[index]
                alias = slots[slot]
                if alias is not None and alias[0] is t and alias[1] == t.data_ptr():
                    ins.append(alias[2])  # a parameter's zero-copy XLA alias (see the executor)
                    continue
                if saved is not None and index < len(saved) and saved[index] is not None:
                    ins.append(saved[index])  # the forward's array, still on the device
                    continue
            ins.append(self._tensor(args, slot))
        inputs = list(self._passthrough_args(args))
        args.clear()  # boxed convention: let the caller's references go before we run
        plan = self._output_plan()
        try:
            results = self._exe(ins, self._param_slots, plan.export, self._register_outputs)
        except Exception as e:
            raise self._failed(e) from e
        fast = self._fast
        if self._plan_enabled and (
            fast is None or not all(map(_is, fast.slots, self._param_slots))
        ):
            with _disable_current_modes():  # the first call can run under FakeTensorMode
                self._fast = _FastPlan(self)
        return plan.assemble(results, inputs)
