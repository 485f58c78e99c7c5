"""LoweringContext: what a rule sees, plus the one shared helper for broadcasting and promotion.

Rules never broadcast or promote by hand: they call ``ctx.promote(...)``, which applies PyTorch's
own elementwise type-promotion rules (``torch._prims_common.elementwise_dtypes``) and NumPy-style
broadcasting, so every rule agrees with eager PyTorch on the same corner cases.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

from .emit import Emitter, TensorType, Value

if TYPE_CHECKING:
    from ..targets import Target

#: the 64-bit policy: what each dtype becomes inside compiled graphs
_CANONICAL = {torch.float64: torch.float32, torch.int64: torch.int32}

Scalar = int | float | bool


def canonical_dtype(dtype: torch.dtype) -> torch.dtype:
    return _CANONICAL.get(dtype, dtype)


def tensor_type(val: torch.Tensor) -> TensorType:
    """TensorType of a (fake) tensor after the 64-bit policy."""
    return TensorType(tuple(int(d) for d in val.shape), canonical_dtype(val.dtype))


def broadcast_shapes(*shapes: Sequence[int]) -> tuple[int, ...]:
    return tuple(torch.broadcast_shapes(*[torch.Size(s) for s in shapes]))


def _promotion_stand_in(arg: Value | torch.Tensor | Scalar) -> torch.Tensor | Scalar:
    # elementwise_dtypes only looks at dtype and whether a tensor is 0-d (a tensor, fake or
    # traced, passes as it is: making a stand-in would record an op in a traced graph).
    if isinstance(arg, Value):
        return torch.empty((1,) * min(arg.rank, 1), dtype=arg.dtype)
    return arg


def promote_types(
    *args: Value | torch.Tensor | Scalar,
    kind: ELEMENTWISE_TYPE_PROMOTION_KIND = ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT,
) -> tuple[torch.dtype, torch.dtype]:
    """``(computation dtype, result dtype)`` of an elementwise op over ``args`` (lowering
    ``Value``s, tensors or Python numbers), by PyTorch's own rules: a 0-d tensor or a number
    only raises the category (int -> float), a dimensioned tensor sets the width.

    The one place promotion is decided: ``LoweringContext.promote`` for rules, and the
    promoting decompositions (``neuron_compile/decompositions/promoting.py``) for ATen ops
    whose PyTorch decomposition does not promote as eager's kernel does.
    """
    return elementwise_dtypes(*[_promotion_stand_in(a) for a in args], type_promotion_kind=kind)


#: Result dtypes eager rounds a scalar operand to before computing in float32.
_HALF_FLOATS = (torch.bfloat16, torch.float16)


def _is_scalar(a: Any) -> bool:
    """A Python number or a 0-d tensor: the operands eager casts to the common dtype."""
    if isinstance(a, Value):
        return a.rank == 0
    return isinstance(a, (int, float)) and not isinstance(a, bool)


def _is_integer_tensor(a: Any) -> bool:
    """A dimensioned integer tensor: eager casts it to a half common dtype like any operand."""
    return (
        isinstance(a, Value)
        and a.rank > 0
        and not a.dtype.is_floating_point
        and not a.dtype.is_complex
    )


def _rounded(value: int | float, dtype: torch.dtype) -> float:
    return torch.tensor(value, dtype=dtype).item()


@dataclass(frozen=True)
class CollectiveInfo:
    """One collective of a module: its StableHLO op, the c10d group it came from, the
    partition of the world it runs over and its channel handle."""

    op: str
    group_name: str
    replica_groups: tuple[tuple[int, ...], ...]
    channel: int


@dataclass
class ModuleContext:
    """What every rule of one module shares: the target it is lowered for, and state that
    outlives one node. The ``Emitter`` only prints."""

    #: ``None``: the cpu target (``targets.CPU``); typed loosely to keep this module target-free.
    target: Target | None = None
    #: logical-core config kernels are specialised for (None: not meaningful for the target)
    lnc: int | None = None
    #: RNG: the seed argument's position in the emitter's args and the graph's Threefry key
    rng_arg_index: int | None = None
    rng_state: Value | None = None
    #: custom-call targets in emission order (``LoweringContext.custom_call``)
    custom_call_targets: list[str] = field(default_factory=list)
    #: collectives in emission order (``lowering/stablehlo/collectives.py``)
    collectives: list[CollectiveInfo] = field(default_factory=list)
    #: the last collective's result: the next one is ordered after it (``collectives.py``)
    last_collective: Value | None = None

    @property
    def num_replicas(self) -> int:
        """Ranks the module runs on: 1 without collectives, else the world the groups cover."""
        return max((sum(map(len, c.replica_groups)) for c in self.collectives), default=1)


@dataclass
class LoweringContext:
    emit: Emitter
    node: fx.Node
    module: ModuleContext = field(default_factory=ModuleContext)

    def custom_call(self, target: str, *args: Any, **kwargs: Any) -> list[Value]:
        """``Emitter.custom_call(target, ...)``, recorded in the module's custom-call targets."""
        self.module.custom_call_targets.append(target)
        return self.emit.custom_call(target, *args, **kwargs)

    # ---- output metadata ------------------------------------------------------------------
    @property
    def out_val(self) -> Any:
        return self.node.meta["val"]

    def out_type(self, index: int | None = None) -> TensorType:
        val = self.out_val if index is None else self.out_val[index]
        return tensor_type(val)

    @property
    def out_dtype(self) -> torch.dtype:
        return self.out_type().dtype

    @property
    def out_shape(self) -> tuple[int, ...]:
        return self.out_type().shape

    # ---- promotion and broadcasting -------------------------------------------------------
    def result_dtype(
        self,
        *args: Value | Scalar,
        kind: ELEMENTWISE_TYPE_PROMOTION_KIND = ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT,
    ) -> torch.dtype:
        """PyTorch's computation dtype for an elementwise op over ``args``."""
        return canonical_dtype(promote_types(*args, kind=kind)[0])

    def promote(
        self,
        *args: Value | Scalar,
        dtype: torch.dtype | None = None,
        kind: ELEMENTWISE_TYPE_PROMOTION_KIND = ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT,
        opmath_scalars: bool = False,
    ) -> list[Value]:
        """Convert every argument to one dtype and broadcast all to their common shape.

        ``dtype`` overrides the promoted dtype (e.g. a rule that computes in float32).
        Python scalars become splat constants of the target shape. When the operands' common
        dtype (the one eager's kernels cast them to) is bfloat16/float16, operands that are not
        already floating point are first rounded to it, as eager reads them: a scalar (a Python
        number or a 0-d tensor: ``x + 0.1`` adds bfloat16's 0.10009765625; eager's mul and div
        read scalars unrounded, ``opmath_scalars``) and an integer tensor (int32 257 == bfloat16
        256 is true in eager: both are 256 once cast).
        """
        common = promote_types(*args, kind=ELEMENTWISE_TYPE_PROMOTION_KIND.NO_OPMATH)[1]
        rounding = common if common in _HALF_FLOATS else None
        dtype = dtype or self.result_dtype(*args, kind=kind)
        shape = broadcast_shapes(*[a.shape for a in args if isinstance(a, Value)])
        out = []
        for a in args:
            if rounding is not None and (
                (_is_scalar(a) and not opmath_scalars) or _is_integer_tensor(a)
            ):
                a = (
                    self.emit.convert(a, rounding)
                    if isinstance(a, Value)
                    else _rounded(a, rounding)
                )
            if isinstance(a, Value):
                out.append(self.broadcast_to(self.emit.convert(a, dtype), shape))
            else:
                out.append(self.emit.full(a, shape, dtype))
        return out

    def broadcast_to(self, x: Value, shape: Sequence[int]) -> Value:
        """NumPy-style (right-aligned) broadcast of ``x`` to ``shape``."""
        shape = tuple(int(d) for d in shape)
        if x.shape == shape:
            return x
        offset = len(shape) - x.rank
        return self.emit.broadcast_in_dim(x, shape, list(range(offset, len(shape))))

    def full_like(self, value: Scalar, like: Value, dtype: torch.dtype | None = None) -> Value:
        return self.emit.full(value, like.shape, dtype or like.dtype)

    def compute_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """Accumulation dtype: low-precision floats compute in float32, as eager's opmath does."""
        return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype
