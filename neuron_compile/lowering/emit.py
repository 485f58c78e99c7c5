"""A typed StableHLO text emitter.

Each builder computes its result type in Python, so a shape bug surfaces here with the FX node at
hand instead of as an MLIR verifier error. Ops are printed in MLIR's *generic* form
(``%1 = "stablehlo.add"(%0, %0) : (...) -> ...``): one printer covers every op and every attribute
is spelled exactly as the StableHLO spec names it. jaxlib re-prints the verified module in the
pretty form for dumps.

The emitter only produces pure ``stablehlo`` + ``func`` so that portable (VHLO) serialization
always succeeds: no ``arith``, no ``shape``, no ``chlo``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.fx as fx

from .literals import (
    dense_literal,
    element_type,
    escape_string,
    i64_array,
    i64_list,
    is_float,
    is_unsigned,
)


@dataclass(frozen=True)
class TensorType:
    shape: tuple[int, ...]
    dtype: torch.dtype

    def __str__(self) -> str:
        dims = "".join(f"{d}x" for d in self.shape)
        return f"tensor<{dims}{element_type(self.dtype)}>"

    @property
    def rank(self) -> int:
        return len(self.shape)

    def with_shape(self, shape: Sequence[int]) -> TensorType:
        return TensorType(tuple(int(d) for d in shape), self.dtype)

    def with_dtype(self, dtype: torch.dtype) -> TensorType:
        return TensorType(self.shape, dtype)


@dataclass(frozen=True)
class Value:
    """An SSA value with its type. ``name`` includes the leading ``%``."""

    name: str
    type: TensorType

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.type.dtype

    @property
    def rank(self) -> int:
        return self.type.rank


class Emitter:
    """Accumulates the body of ``func.func @main`` and hands out fresh SSA names."""

    def __init__(self) -> None:
        self._counter = 0
        self._blocks: list[list[str]] = [[]]
        self.args: list[Value] = []
        #: first body text line of each top-level op -> the FX node being lowered when it was
        #: emitted (for error reports); ``body_lines`` counts the body's text lines so far
        self.line_nodes: dict[int, fx.Node | None] = {}
        self.body_lines = 0
        self.current_node: fx.Node | None = None

    # ---- plumbing -------------------------------------------------------------------------
    def _fresh(self, prefix: str = "") -> str:
        self._counter += 1
        return f"%{prefix}{self._counter}"

    def _line(self, text: str) -> None:
        block = self._blocks[-1]
        if len(self._blocks) == 1:  # keyed by text line: an op with regions spans several
            self.line_nodes[self.body_lines] = self.current_node
            self.body_lines += text.count("\n") + 1
        block.append(text)

    def arg(self, type_: TensorType) -> Value:
        value = Value(f"%arg{len(self.args)}", type_)
        self.args.append(value)
        return value

    def op(
        self,
        name: str,
        operands: Sequence[Value],
        result_types: Sequence[TensorType],
        attrs: str = "",
        regions: Sequence[list[str]] = (),
    ) -> list[Value]:
        """Emit ``stablehlo.<name>`` in generic form; return its results."""
        results = [Value(self._fresh(), t) for t in result_types]
        lhs = ""
        if len(results) == 1:
            lhs = f"{results[0].name} = "
        elif results:
            base = self._fresh("m")
            results = [Value(f"{base}#{i}", t) for i, t in enumerate(result_types)]
            lhs = f"{base}:{len(results)} = "
        ops = ", ".join(v.name for v in operands)
        in_types = ", ".join(str(v.type) for v in operands)
        out_types = ", ".join(str(t) for t in result_types)
        if len(result_types) != 1:
            out_types = f"({out_types})"
        region_text = ""
        if regions:
            region_text = " (" + ", ".join("{\n" + "\n".join(r) + "\n}" for r in regions) + ")"
        attr_text = f" {{{attrs}}}" if attrs else ""
        self._line(
            f'{lhs}"stablehlo.{name}"({ops}){region_text}{attr_text} : ({in_types}) -> {out_types}'
        )
        return results

    def op1(
        self, name: str, operands: Sequence[Value], result_type: TensorType, attrs: str = ""
    ) -> Value:
        return self.op(name, operands, [result_type], attrs)[0]

    def custom_call(
        self,
        target: str,
        operands: Sequence[Value],
        result_types: Sequence[TensorType],
        backend_config: str = "",
        frontend_attributes: dict[str, str] | None = None,
    ) -> list[Value]:
        """``stablehlo.custom_call @target``: the form neuronx-cc's built-in kernels take
        (``api_version = 2``, no side effect, string ``backend_config``;
        ``docs/trainium-reference.md`` §R8). ``frontend_attributes`` become
        ``mhlo.frontend_attributes`` (HLO frontend attributes, e.g. ``has_collectives = "1"`` for
        NKI kernels; §R9)."""
        config = escape_string(backend_config)
        attrs = (
            f'call_target_name = "{target}", has_side_effect = false, '
            f'backend_config = "{config}", api_version = 2 : i32'
        )
        if frontend_attributes:
            items = ", ".join(
                f'{k} = "{escape_string(v)}"' for k, v in sorted(frontend_attributes.items())
            )
            attrs += f", mhlo.frontend_attributes = {{{items}}}"
        return self.op("custom_call", operands, result_types, attrs)

    def region(
        self, arg_types: Sequence[TensorType], body: Callable[..., Sequence[Value]]
    ) -> list[str]:
        """Build a single-block region; ``body`` receives block arguments and returns results."""
        block_args = [Value(self._fresh("b"), t) for t in arg_types]
        self._blocks.append([])
        results = body(*block_args)
        self._line(
            f'"stablehlo.return"({", ".join(v.name for v in results)}) : '
            f"({', '.join(str(v.type) for v in results)}) -> ()"
        )
        lines = self._blocks.pop()
        header = "^bb0(" + ", ".join(f"{v.name}: {v.type}" for v in block_args) + "):"
        return [header] + ["  " + ln for ln in lines]

    def module_text(
        self, results: Sequence[Value], name: str = "main", attributes: str = ""
    ) -> str:
        """The module; ``attributes``: module attributes (``mhlo.num_replicas = 4 : i32``)."""
        header = f" attributes {{{attributes}}}" if attributes else ""
        args = ", ".join(f"{v.name}: {v.type}" for v in self.args)
        outs = ", ".join(str(v.type) for v in results)
        body = "\n".join("    " + ln for ln in self._blocks[0])
        ret = (
            f"    return {', '.join(v.name for v in results)} : {outs}" if results else "    return"
        )
        return (
            f"module @neuron_graph{header} {{\n"
            f"  func.func public @{name}({args}) -> ({outs}) {{\n{body}\n{ret}\n  }}\n}}\n"
        )

    def body_line_offset(self) -> int:
        """1-based text line of the first body line in ``module_text`` (for verifier errors)."""
        return 3

    # ---- constants and shapes -------------------------------------------------------------
    def constant(self, value: float | int | bool | np.ndarray, type_: TensorType) -> Value:
        """A splat (scalar ``value``) or a dense array constant of ``type_``."""
        arr = np.asarray(value)
        if arr.ndim == 0:
            literal = dense_literal(arr, type_.dtype)
        else:
            assert tuple(arr.shape) == type_.shape, (arr.shape, type_)
            literal = dense_literal(arr, type_.dtype)
        return self.op1("constant", [], type_, f"value = {literal} : {type_}")

    def scalar(self, value: float | int | bool, dtype: torch.dtype) -> Value:
        return self.constant(value, TensorType((), dtype))

    def full(self, value: float | int | bool, shape: Sequence[int], dtype: torch.dtype) -> Value:
        return self.constant(value, TensorType(tuple(shape), dtype))

    def iota(self, shape: Sequence[int], dim: int, dtype: torch.dtype) -> Value:
        return self.op1(
            "iota", [], TensorType(tuple(shape), dtype), f"iota_dimension = {dim} : i64"
        )

    def convert(self, x: Value, dtype: torch.dtype) -> Value:
        if x.dtype == dtype:
            return x
        if dtype == torch.bool:  # convert rounds; torch's bool cast means "!= 0"
            return self.compare(x, self.full(0, x.shape, x.dtype), "NE")
        if x.dtype.is_floating_point and dtype in (torch.int16, torch.int8, torch.uint8):
            # Eager truncates to int32 and then wraps (-3.5 -> uint8 253, 300.0 -> 44); a
            # direct float -> narrow-int convert saturates (to 0 and 255).
            x = self.op1("convert", [x], x.type.with_dtype(torch.int32))
        return self.op1("convert", [x], x.type.with_dtype(dtype))

    def reshape(self, x: Value, shape: Sequence[int]) -> Value:
        shape = tuple(int(d) for d in shape)
        if shape == x.shape:
            return x
        assert math.prod(shape) == math.prod(x.shape), (x.shape, shape)
        return self.op1("reshape", [x], x.type.with_shape(shape))

    def broadcast_in_dim(self, x: Value, shape: Sequence[int], dims: Sequence[int]) -> Value:
        shape = tuple(int(d) for d in shape)
        if shape == x.shape and list(dims) == list(range(x.rank)):
            return x
        return self.op1(
            "broadcast_in_dim",
            [x],
            x.type.with_shape(shape),
            f"broadcast_dimensions = {i64_array(dims)}",
        )

    def transpose(self, x: Value, perm: Sequence[int]) -> Value:
        perm = [int(p) for p in perm]
        if perm == list(range(x.rank)):
            return x
        shape = [x.shape[p] for p in perm]
        return self.op1(
            "transpose", [x], x.type.with_shape(shape), f"permutation = {i64_array(perm)}"
        )

    def slice(
        self, x: Value, start: Sequence[int], limit: Sequence[int], strides: Sequence[int]
    ) -> Value:
        shape = [
            max(0, -(-(hi - lo) // st)) for lo, hi, st in zip(start, limit, strides, strict=True)
        ]
        if tuple(shape) == x.shape:
            return x
        attrs = (
            f"start_indices = {i64_array(start)}, limit_indices = {i64_array(limit)}, "
            f"strides = {i64_array(strides)}"
        )
        return self.op1("slice", [x], x.type.with_shape(shape), attrs)

    def concatenate(self, xs: Sequence[Value], dim: int) -> Value:
        if len(xs) == 1:
            return xs[0]
        shape = list(xs[0].shape)
        shape[dim] = sum(x.shape[dim] for x in xs)
        return self.op1("concatenate", xs, xs[0].type.with_shape(shape), f"dimension = {dim} : i64")

    def pad(
        self,
        x: Value,
        value: Value,
        low: Sequence[int],
        high: Sequence[int],
        interior: Sequence[int],
    ) -> Value:
        if any(p < 0 for p in (*low, *high)):
            # A negative edge crops. XLA CPU's emitter rejects it and leaves it to the algebraic
            # simplifier, which the executor does not run (runtime/xla_cpu.py): pad, then slice.
            padded = self.pad(x, value, [max(p, 0) for p in low], [max(p, 0) for p in high],
                              interior)  # fmt: skip
            start = [max(-p, 0) for p in low]
            limit = [d - max(-p, 0) for d, p in zip(padded.shape, high, strict=True)]
            return self.slice(padded, start, limit, [1] * padded.rank)
        shape = [
            lo + hi + d + max(d - 1, 0) * it
            for d, lo, hi, it in zip(x.shape, low, high, interior, strict=True)
        ]
        attrs = (
            f"edge_padding_low = {i64_array(low)}, edge_padding_high = {i64_array(high)}, "
            f"interior_padding = {i64_array(interior)}"
        )
        return self.op1("pad", [x, value], x.type.with_shape(shape), attrs)

    def reverse(self, x: Value, dims: Sequence[int]) -> Value:
        return self.op1("reverse", [x], x.type, f"dimensions = {i64_array(dims)}")

    # ---- elementwise ----------------------------------------------------------------------
    def unary(self, name: str, x: Value) -> Value:
        return self.op1(name, [x], x.type)

    def binary(self, name: str, a: Value, b: Value) -> Value:
        assert a.type == b.type, (name, a.type, b.type)
        return self.op1(name, [a, b], a.type)

    def compare(self, a: Value, b: Value, direction: str) -> Value:
        assert a.type == b.type, (a.type, b.type)
        kind = "FLOAT" if is_float(a.dtype) else ("UNSIGNED" if is_unsigned(a.dtype) else "SIGNED")
        attrs = (
            f"comparison_direction = #stablehlo<comparison_direction {direction}>, "
            f"compare_type = #stablehlo<comparison_type {kind}>"
        )
        return self.op1("compare", [a, b], a.type.with_dtype(torch.bool), attrs)

    def select(self, pred: Value, on_true: Value, on_false: Value) -> Value:
        assert on_true.type == on_false.type and pred.shape == on_true.shape
        return self.op1("select", [pred, on_true, on_false], on_true.type)

    def clamp(self, lo: Value, x: Value, hi: Value) -> Value:
        return self.op1("clamp", [lo, x, hi], x.type)

    # ---- contractions and reductions ------------------------------------------------------
    def dot_general(
        self,
        lhs: Value,
        rhs: Value,
        contract: tuple[Sequence[int], Sequence[int]],
        batch: tuple[Sequence[int], Sequence[int]] = ((), ()),
        out_dtype: torch.dtype | None = None,
    ) -> Value:
        (lc, rc), (lb, rb) = contract, batch
        shape = [lhs.shape[d] for d in lb]
        shape += [d for i, d in enumerate(lhs.shape) if i not in lc and i not in lb]
        shape += [d for i, d in enumerate(rhs.shape) if i not in rc and i not in rb]
        attrs = (
            "dot_dimension_numbers = #stablehlo.dot<"
            f"lhs_batching_dimensions = {i64_list(lb)}, rhs_batching_dimensions = {i64_list(rb)}, "
            f"lhs_contracting_dimensions = {i64_list(lc)}, rhs_contracting_dimensions = {i64_list(rc)}>"
        )
        out = TensorType(tuple(shape), out_dtype or lhs.dtype)
        return self.op1("dot_general", [lhs, rhs], out, attrs)

    def reduce(
        self,
        xs: Sequence[Value],
        inits: Sequence[Value],
        dims: Sequence[int],
        body: Callable[..., Sequence[Value]],
    ) -> list[Value]:
        """Variadic ``stablehlo.reduce``; ``body(*accs, *elems)`` combines scalars."""
        dims = sorted(int(d) for d in dims)
        scalar_types = [TensorType((), x.dtype) for x in xs]
        region = self.region(scalar_types + scalar_types, body)
        out_types = [
            x.type.with_shape([d for i, d in enumerate(x.shape) if i not in dims]) for x in xs
        ]
        return self.op(
            "reduce", [*xs, *inits], out_types, f"dimensions = {i64_array(dims)}", regions=[region]
        )

    def reduce_simple(
        self, x: Value, init: float | int | bool, dims: Sequence[int], combiner: str
    ) -> Value:
        """Single-operand reduction with a binary ``combiner`` op (add, maximum, and, ...)."""
        init_v = self.scalar(init, x.dtype)
        return self.reduce([x], [init_v], dims, lambda a, b: [self.binary(combiner, a, b)])[0]

    def while_(
        self,
        inits: Sequence[Value],
        cond: Callable[..., Sequence[Value]],
        body: Callable[..., Sequence[Value]],
    ) -> list[Value]:
        """``stablehlo.while`` over the carried ``inits``; ``cond(*carry)`` returns one scalar i1,
        ``body(*carry)`` the next carry (same types)."""
        types = [v.type for v in inits]
        regions = [self.region(types, cond), self.region(types, body)]
        return self.op("while", inits, types, regions=regions)

    def sort(
        self,
        xs: Sequence[Value],
        dim: int,
        comparator: Callable[..., Sequence[Value]],
        is_stable: bool = True,
    ) -> list[Value]:
        """Variadic ``stablehlo.sort`` along ``dim``; ``comparator(lhs0, rhs0, lhs1, rhs1, ...)``
        returns a scalar i1 that is true when lhs sorts strictly before rhs."""
        arg_types: list[TensorType] = []
        for x in xs:
            arg_types += [TensorType((), x.dtype)] * 2
        region = self.region(arg_types, comparator)
        attrs = f"dimension = {int(dim)} : i64, is_stable = {'true' if is_stable else 'false'}"
        return self.op("sort", xs, [x.type for x in xs], attrs, regions=[region])

    def bitcast_convert(self, x: Value, dtype: torch.dtype) -> Value:
        """Reinterpret the bits of ``x`` as ``dtype`` (same bit width)."""
        return self.op1("bitcast_convert", [x], x.type.with_dtype(dtype))

    def round_to_precision(self, x: Value, dtype: torch.dtype) -> Value:
        """Round float ``x`` to the nearest ``dtype`` value, keeping ``x``'s type: a convert to
        ``dtype`` and back, which compilers may not fold (it is lossy). Not ``reduce_precision``:
        XLA's flushes the narrow type's subnormals to zero (float16 1e-6 / 1e-6 floored to 0)."""
        if x.dtype == dtype or not dtype.is_floating_point:
            return x
        return self.convert(self.convert(x, dtype), x.dtype)

    def reduce_window(
        self,
        xs: Sequence[Value],
        inits: Sequence[Value],
        window: Sequence[int],
        strides: Sequence[int],
        padding: Sequence[tuple[int, int]],
        body: Callable[..., Sequence[Value]],
        window_dilations: Sequence[int] | None = None,
    ) -> list[Value]:
        dil = list(window_dilations or [1] * len(window))
        shape = []
        for d, w, s, (lo, hi), dl in zip(xs[0].shape, window, strides, padding, dil, strict=True):
            eff = (w - 1) * dl + 1
            shape.append((d + lo + hi - eff) // s + 1)
        scalar_types = [TensorType((), x.dtype) for x in xs]
        region = self.region(scalar_types + scalar_types, body)
        pad = np.asarray(padding, dtype=np.int64).reshape(len(window), 2)
        attrs = (
            f"window_dimensions = {i64_array(window)}, window_strides = {i64_array(strides)}, "
            f"window_dilations = {i64_array(dil)}, "
            f"padding = {dense_literal(pad, torch.int64)} : tensor<{len(window)}x2xi64>"
        )
        out_types = [x.type.with_shape(shape) for x in xs]
        return self.op("reduce_window", [*xs, *inits], out_types, attrs, regions=[region])

    def select_and_scatter(
        self,
        operand: Value,
        source: Value,
        init: Value,
        window: Sequence[int],
        strides: Sequence[int],
        padding: Sequence[tuple[int, int]],
        select_direction: str = "GE",
    ) -> Value:
        st = TensorType((), operand.dtype)
        select = self.region([st, st], lambda a, b: [self.compare(a, b, select_direction)])
        scatter = self.region(
            [TensorType((), source.dtype)] * 2, lambda a, b: [self.binary("add", a, b)]
        )
        pad = np.asarray(padding, dtype=np.int64).reshape(len(window), 2)
        attrs = (
            f"window_dimensions = {i64_array(window)}, window_strides = {i64_array(strides)}, "
            f"padding = {dense_literal(pad, torch.int64)} : tensor<{len(window)}x2xi64>"
        )
        return self.op(
            "select_and_scatter",
            [operand, source, init],
            [operand.type.with_dtype(source.dtype)],
            attrs,
            regions=[select, scatter],
        )[0]

    def convolution(
        self,
        lhs: Value,
        rhs: Value,
        out_shape: Sequence[int],
        *,
        dimension_numbers: str,
        strides: Sequence[int],
        padding: Sequence[tuple[int, int]],
        lhs_dilation: Sequence[int],
        rhs_dilation: Sequence[int],
        feature_group_count: int = 1,
        batch_group_count: int = 1,
        out_dtype: torch.dtype | None = None,
    ) -> Value:
        """``dimension_numbers`` like ``[b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1]``; ``out_dtype``
        (e.g. f32 for bf16 operands) sets the accumulation/result element type."""
        n = len(strides)
        pad = np.asarray(padding, dtype=np.int64).reshape(n, 2)
        attrs = (
            f"dimension_numbers = #stablehlo.conv<{dimension_numbers}>, "
            f"window_strides = {i64_array(strides)}, "
            f"padding = {dense_literal(pad, torch.int64)} : tensor<{n}x2xi64>, "
            f"lhs_dilation = {i64_array(lhs_dilation)}, rhs_dilation = {i64_array(rhs_dilation)}, "
            f"feature_group_count = {feature_group_count} : i64, "
            f"batch_group_count = {batch_group_count} : i64"
        )
        out = TensorType(tuple(int(d) for d in out_shape), out_dtype or lhs.dtype)
        return self.op1("convolution", [lhs, rhs], out, attrs)

    def gather(
        self,
        operand: Value,
        indices: Value,
        *,
        offset_dims: Sequence[int],
        collapsed_slice_dims: Sequence[int],
        start_index_map: Sequence[int],
        index_vector_dim: int,
        slice_sizes: Sequence[int],
        out_shape: Sequence[int],
        operand_batching_dims: Sequence[int] = (),
        start_indices_batching_dims: Sequence[int] = (),
    ) -> Value:
        batching = ""
        if operand_batching_dims:
            batching = (
                f", operand_batching_dims = {i64_list(operand_batching_dims)}, "
                f"start_indices_batching_dims = {i64_list(start_indices_batching_dims)}"
            )
        attrs = (
            f"dimension_numbers = #stablehlo.gather<offset_dims = {i64_list(offset_dims)}, "
            f"collapsed_slice_dims = {i64_list(collapsed_slice_dims)}{batching}, "
            f"start_index_map = {i64_list(start_index_map)}, index_vector_dim = {index_vector_dim}>, "
            f"slice_sizes = {i64_array(slice_sizes)}, indices_are_sorted = false"
        )
        return self.op1("gather", [operand, indices], operand.type.with_shape(out_shape), attrs)

    def scatter(
        self,
        operand: Value,
        indices: Value,
        updates: Value,
        *,
        update_window_dims: Sequence[int],
        inserted_window_dims: Sequence[int],
        scatter_dims_to_operand_dims: Sequence[int],
        index_vector_dim: int,
        combiner: str | None,
        input_batching_dims: Sequence[int] = (),
        scatter_indices_batching_dims: Sequence[int] = (),
    ) -> Value:
        """``combiner=None`` overwrites; otherwise a binary op name such as ``add``."""
        st = TensorType((), operand.dtype)
        if combiner is None:
            region = self.region([st, st], lambda old, new: [new])
        else:
            region = self.region([st, st], lambda old, new: [self.binary(combiner, old, new)])
        batching = ""
        if input_batching_dims:
            batching = (
                f", input_batching_dims = {i64_list(input_batching_dims)}, "
                f"scatter_indices_batching_dims = {i64_list(scatter_indices_batching_dims)}"
            )
        attrs = (
            "scatter_dimension_numbers = #stablehlo.scatter<"
            f"update_window_dims = {i64_list(update_window_dims)}, "
            f"inserted_window_dims = {i64_list(inserted_window_dims)}{batching}, "
            f"scatter_dims_to_operand_dims = {i64_list(scatter_dims_to_operand_dims)}, "
            f"index_vector_dim = {index_vector_dim}>, indices_are_sorted = false, "
            "unique_indices = false"
        )
        return self.op(
            "scatter", [operand, indices, updates], [operand.type], attrs, regions=[region]
        )[0]
