"""``nki_op``: an NKI kernel as a PyTorch custom op that ``torch.compile`` keeps as one node.

Write the kernel against ``nki.language``/``nki.isa`` and a plain-PyTorch reference with the same
parameters (type hints required; they become the op's schema)::

    import torch
    from torch import Tensor

    import neuron_compile

    def rms_norm_reference(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    @neuron_compile.nki_op("mylib::rms_norm", reference=rms_norm_reference)
    @nki.jit                            # only where the real ``nki`` package is installed
    def rms_norm_kernel(x, weight, eps=1e-6):
        ...                             # returns its output (``nl.shared_hbm``)

    y = rms_norm_kernel(x, w)           # a torch custom op: torch.ops.mylib.rms_norm

What the op does where:

- **eager**: runs the reference (on any device; the kernel is not called in eager mode);
- **fake tensors** (Dynamo, AOTAutograd): the reference on fake tensors gives shapes and dtypes;
- **autograd**: ``backward=fn`` with ``fn(grad, *inputs) -> one gradient per input`` (``grad``
  is a tuple when the reference returns a tuple); without it, the backward is the reference's
  own, derived with ``torch.autograd.grad`` (a vjp of the reference). Either way it is plain
  PyTorch, so it traces into ATen in the backward graph;
- **torch.compile(backend="neuron_compile")**: one node in the FX graph. On trn2/trn3 the module
  for neuronx-cc gets ``stablehlo.custom_call @AwsNeuronCustomNativeKernel`` with the
  ``backend_config`` the NKI toolchain produced for the node's shapes
  (``docs/trainium-reference.md`` §R9). Without the real ``nki`` package the reference is lowered
  instead, with one ``NkiFallbackWarning`` per op, so compile-only flows work anywhere. On the
  CPU target, and in the XLA CPU stand-in of a trn graph, the reference is always what runs.

Kernels are functional: they return their outputs (``mutates_args`` is not supported). The NKI
toolchain is only touched in :func:`_kernel_config`; :func:`load_nki` never imports the PyPI
placeholder package called ``nki``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import json
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ...errors import LoweringError, NkiOpError
from ...versions import dist_version
from ...warn_once import NeuronCompileWarning, once_set, warn_once

if TYPE_CHECKING:
    from ...lowering.context import LoweringContext

__all__ = ["KernelConfig", "NkiFallbackWarning", "TensorSpec", "load_nki", "nki_op"]

#: custom-call target of embedded NKI kernels (docs/trainium-reference.md §R9)
NKI_CUSTOM_CALL = "AwsNeuronCustomNativeKernel"

_NAME = re.compile(r"^[A-Za-z_]\w*::[A-Za-z_]\w*$")
_WARNED: set[str] = once_set()  # ops whose fallback warning was shown (once per op and process)
_CONFIGS: dict[str, KernelConfig] = {}  # in-process memo: forward and recompiles reuse a trace


def clear_configs() -> None:
    """Forget the in-process memo of traced kernel configs (``neuron_compile.reset()``)."""
    _CONFIGS.clear()


class NkiFallbackWarning(NeuronCompileWarning):
    """A kernel was not used on a trn target; neuronx-cc gets the reference decomposition."""


class KernelSpecialisationError(LoweringError):
    """The NKI toolchain could not specialise a kernel for a node's arguments."""


@dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype of one kernel input, as the kernel is specialised on it."""

    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclass(frozen=True)
class KernelConfig:
    """What the NKI toolchain says about one kernel specialisation (beta-3 ``FrameworkConfig``)."""

    backend_config_b64: str  # passed through verbatim: never hand-roll it (EVRF065)
    output_specs: tuple[TensorSpec, ...]
    nki_version: str
    has_collectives: bool = False
    operand_output_aliases: dict[int, int] = field(default_factory=dict)


# ---- the optional toolchain --------------------------------------------------------------------
def load_nki() -> ModuleType | None:
    """The real ``nki`` module, or None. Never imports the PyPI placeholder (version 0.0.x)."""
    mod = sys.modules.get("nki")
    if mod is None:
        if importlib.util.find_spec("nki") is None:
            return None
        if dist_version("nki").startswith("0.0."):  # PyPI "WRONG PACKAGE" placeholder
            return None
        try:
            import nki as mod
        except Exception:  # a broken install is "not installed" for our purposes
            return None
    return mod if hasattr(mod, "jit") else None


def nki_version(mod: ModuleType) -> str:
    return str(getattr(mod, "__version__", None) or dist_version("nki"))


def _numpy_dtype(dtype: torch.dtype) -> Any:
    import numpy as np

    if dtype == torch.bfloat16:
        import ml_dtypes  # jaxlib's dependency: numpy has no bfloat16

        return np.dtype(ml_dtypes.bfloat16)
    # NOTE: by name, not via torch.empty(...).numpy(): lowering runs under a FakeTensorMode.
    return np.dtype(str(dtype).removeprefix("torch."))


def _torch_dtype(dtype: Any) -> torch.dtype:
    import numpy as np

    name = np.dtype(dtype).name
    return torch.bool if name == "bool" else getattr(torch, name)


def _artifacts_dir(digest: str) -> Path:
    """A persistent directory for one kernel trace: neuronx-cc reads the artifact by absolute
    path when it compiles the graph, possibly much later (EVRF059), so never a temp dir."""
    from ...cache.tiers import disk_cache

    disk = disk_cache()
    root = Path(disk.root) if disk is not None else None
    if root is None:
        from ...cache.store import default_root

        root = default_root()
    path = root / "nki-kernels" / digest[:2] / digest
    path.mkdir(parents=True, exist_ok=True)
    return path


def _kernel_config(
    kernel: Any,
    args: Mapping[str, TensorSpec | Any],
    *,
    target: str | None,
    lnc: int | None,
    grid: tuple[Any, ...] | None = None,
) -> KernelConfig:
    """Specialise ``kernel`` on ``args`` with the NKI toolchain (beta-3 API) and return its
    ``backend_config``. Tensors are passed as empty NumPy arrays of the right shape and dtype,
    everything else as the compile-time constant it is (``docs/trainium-reference.md`` §R9).
    ``grid`` is an SPMD launch grid: the kernel is specialised as ``kernel[grid]``, the launch
    syntax of NKI kernels (``flash_fwd[b, h](...)``).

    The one place that talks to ``nki``. API as used by NKIPy (``nkipy/core/nki_op.py``
    ``_beta3_compile_and_get_config``); unverified here: this machine has no ``nki``.
    """
    import numpy as np

    mod = load_nki()
    if mod is None:
        raise RuntimeError("the nki package is not installed")
    from nki.compiler.ncc_driver import CompileOptions
    from nki.framework.compiled import compile_kernel_to_nir

    version = nki_version(mod)
    inputs = {
        name: np.empty(a.shape, dtype=_numpy_dtype(a.dtype)) if isinstance(a, TensorSpec) else a
        for name, a in args.items()
    }
    what = {
        "kernel": f"{getattr(kernel, '__module__', '')}.{getattr(kernel, '__qualname__', kernel)}",
        "source": _source_hash(kernel),
        "args": {k: repr(v) for k, v in args.items()},
        "nki": version,
        "target": target,
        "lnc": lnc,
        "grid": repr(grid),
    }
    digest = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()
    if digest in _CONFIGS:
        return _CONFIGS[digest]
    out_dir = _artifacts_dir(digest)
    opts = CompileOptions(
        target=target,
        lnc=lnc or 1,
        artifacts_dir=str(out_dir),
        output_path=str(out_dir / "kernel.neff"),
    )
    launch = kernel if grid is None else kernel[grid]
    nir = compile_kernel_to_nir(launch, inputs=inputs, compile_opts=opts, enable_cache=False)
    built = nir.build_config()
    config = KernelConfig(
        backend_config_b64=built.backend_config_b64,
        output_specs=tuple(
            TensorSpec(tuple(int(d) for d in s.shape), _torch_dtype(s.dtype))
            for s in built.output_specs
        ),
        nki_version=version,
        has_collectives=bool(built.has_collectives),
        operand_output_aliases=dict(built.operand_output_aliases or {}),
    )
    _CONFIGS[digest] = config
    return config


def _source_hash(kernel: Any) -> str:
    fn = getattr(kernel, "func", kernel)  # @nki.jit objects keep the function in .func
    try:
        return hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()[:16]
    except (OSError, TypeError):  # no source (exec, some REPLs): hash the code object instead
        code = getattr(fn, "__code__", None)
        if code is None:
            return f"object-{id(kernel)}"  # unknowable: never shared with another kernel
        blob = code.co_code + repr(code.co_consts).encode() + repr(code.co_names).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


# ---- the op ------------------------------------------------------------------------------------
def nki_op(
    name: str,
    *,
    reference: Callable[..., Any] | None = None,
    backward: Callable[..., Any] | None = None,
) -> Callable[[Callable[..., Any]], Any]:
    """Decorator: turn an NKI kernel into the torch custom op ``name`` (``"namespace::op"``).

    ``reference`` is a plain-PyTorch function with the kernel's parameters and full type hints
    (Tensor, Tensor | None, int, float, bool, str, ...), returning a Tensor or a tuple of them.
    ``backward(grad, *inputs)`` returns one gradient (or None) per reference parameter; without
    it the backward is derived from the reference. Returns the op (a ``CustomOpDef``), which
    also carries ``.kernel`` and ``.reference``. Invalid definitions raise ``NkiOpError``
    (NC105).
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise NkiOpError(
            f"nki_op name {name!r} is not of the form 'namespace::name'",
            hint='e.g. neuron_compile.nki_op("mylib::rms_norm", reference=...)',
        )
    if reference is None or not callable(reference):
        raise NkiOpError(
            f"nki_op {name!r} has no reference implementation",
            reason="the reference is what eager mode, fake tensors, autograd and the CPU run",
            hint="pass reference=<a PyTorch function with the kernel's signature>",
        )
    if backward is not None and not callable(backward):
        raise NkiOpError(f"nki_op {name!r}: backward must be callable, got {backward!r}")
    _check_hints(name, reference)

    def define(kernel: Callable[..., Any]) -> Any:
        op = torch.library.custom_op(name, reference, mutates_args=())
        # The reference on fake tensors yields exactly the shapes/dtypes the op produces.
        op.register_fake(reference)
        multi = len(op._opoverload._schema.returns) != 1
        if backward is None:
            op.register_autograd(_derived_backward(reference), setup_context=_setup_context)
        else:
            op.register_autograd(
                _user_backward(name, backward, multi), setup_context=_setup_context
            )
        _register_lowering(name, op._opoverload, kernel, reference)
        op.kernel = kernel
        op.reference = reference
        return op

    return define


def _check_hints(name: str, reference: Callable[..., Any]) -> None:
    try:
        sig = inspect.signature(reference)
    except (TypeError, ValueError) as e:
        raise NkiOpError(f"nki_op {name!r}: cannot read the reference's signature: {e}") from e
    missing = [p.name for p in sig.parameters.values() if p.annotation is inspect.Parameter.empty]
    if sig.return_annotation is inspect.Signature.empty:
        missing.append("return")
    if missing:
        raise NkiOpError(
            f"nki_op {name!r}: the reference {reference.__qualname__} lacks type hints for "
            + ", ".join(missing),
            reason="the hints become the op's schema (torch.library.custom_op)",
            hint="annotate every parameter and the return, e.g. (x: Tensor, eps: float) -> Tensor",
        )


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    # Save every input: the derived backward re-runs the reference on them.
    ctx.is_tensor = [isinstance(x, Tensor) for x in inputs]
    ctx.constants = [None if isinstance(x, Tensor) else x for x in inputs]
    ctx.save_for_backward(*[x for x in inputs if isinstance(x, Tensor)])


def _saved_inputs(ctx: Any) -> list[Any]:
    tensors = iter(ctx.saved_tensors)
    return [next(tensors) if t else c for t, c in zip(ctx.is_tensor, ctx.constants, strict=True)]


def _derived_backward(reference: Callable[..., Any]) -> Callable[..., tuple[Any, ...]]:
    def backward(ctx: Any, *grads: Any) -> tuple[Any, ...]:
        inputs = _saved_inputs(ctx)
        result: list[Any] = [None] * len(inputs)
        wanted = [
            i
            for i, x in enumerate(inputs)
            if isinstance(x, Tensor)
            and ctx.needs_input_grad[i]
            and (x.is_floating_point() or x.is_complex())
        ]
        if not wanted:
            return tuple(result)
        leaves = list(inputs)
        for i in wanted:
            leaves[i] = inputs[i].detach().requires_grad_(True)
        with torch.enable_grad():  # backward runs with grad mode off
            out = reference(*leaves)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        pairs = [
            (o, g)
            for o, g in zip(outs, grads, strict=True)
            if g is not None and isinstance(o, Tensor) and o.requires_grad
        ]
        if pairs:
            got = torch.autograd.grad(
                [o for o, _ in pairs],
                [leaves[i] for i in wanted],
                [g for _, g in pairs],
                allow_unused=True,
            )
            for i, g in zip(wanted, got, strict=True):
                result[i] = g
        return tuple(result)

    return backward


def _user_backward(
    name: str, backward: Callable[..., Any], multi: bool
) -> Callable[..., tuple[Any, ...]]:
    def wrapped(ctx: Any, *grads: Any) -> tuple[Any, ...]:
        inputs = _saved_inputs(ctx)
        got = backward(tuple(grads) if multi else grads[0], *inputs)
        got = tuple(got) if isinstance(got, (tuple, list)) else (got,)
        if len(got) != len(inputs):
            raise NkiOpError(
                f"nki_op {name!r}: backward returned {len(got)} gradients for {len(inputs)} inputs",
                hint="return one gradient per reference parameter (None where there is none)",
            )
        return got

    wrapped.__qualname__ = getattr(backward, "__qualname__", "backward")
    return wrapped


# ---- lowering ----------------------------------------------------------------------------------
def _bind(schema: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Kernel arguments by parameter name, defaults filled in (FX nodes may omit them)."""
    bound: dict[str, Any] = {}
    for i, arg in enumerate(schema.arguments):
        if i < len(args):
            bound[arg.name] = args[i]
        elif arg.name in kwargs:
            bound[arg.name] = kwargs[arg.name]
        elif arg.has_default_value():
            bound[arg.name] = arg.default_value
    return bound


def _platform(ctx: LoweringContext) -> tuple[str | None, int | None]:
    """Target and LNC to specialise kernels for, from the module being lowered."""
    target = ctx.module.target
    return (target.name if target is not None else None), ctx.module.lnc


def _register_lowering(name: str, op: Any, kernel: Any, reference: Callable[..., Any]) -> None:
    from ...lowering.reference import lower_reference
    from ...lowering.registry import lowering
    from .. import TRN_KEY

    schema = op._schema

    def reference_rule(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Any:
        return lower_reference(ctx, reference, *args, **kwargs)

    def kernel_rule(ctx: LoweringContext, *args: Any, **kwargs: Any) -> Any:
        if load_nki() is None:
            warn_fallback(name, "the nki package is not installed")
            return lower_reference(ctx, reference, *args, **kwargs)
        return _emit_kernel(ctx, name, kernel, _bind(schema, args, kwargs))

    stem = f"_lower_nki_{name.replace('::', '_')}"
    reference_rule.__name__ = reference_rule.__qualname__ = stem + "_reference"
    kernel_rule.__name__ = kernel_rule.__qualname__ = stem
    lowering(op)(reference_rule)  # XLA CPU: the cpu target, and the stand-in of a trn graph
    lowering(op, key=TRN_KEY)(kernel_rule)


def warn_fallback(name: str, why: str) -> None:
    """One ``NkiFallbackWarning`` per op and process: ``name``'s kernel is not used (``why``)
    and neuronx-cc receives the reference decomposition instead."""
    warn_once(
        _WARNED,
        name,
        f"kernel {name} not used: {why}; neuronx-cc receives the reference decomposition",
        NkiFallbackWarning,
    )


def _emit_kernel(ctx: LoweringContext, name: str, kernel: Any, bound: dict[str, Any]) -> Any:
    val = ctx.out_val
    multi = isinstance(val, (tuple, list))
    result_types = [ctx.out_type(i) for i in range(len(val))] if multi else [ctx.out_type()]
    results = emit_kernel_call(ctx, name, kernel, bound, result_types)
    return list(results) if multi else results[0]


def emit_kernel_call(
    ctx: LoweringContext,
    name: str,
    kernel: Any,
    bound: Mapping[str, Any],
    result_types: Sequence[Any],
    *,
    grid: tuple[Any, ...] | None = None,
) -> list[Any]:
    """Specialise ``kernel`` on ``bound`` (kernel parameter name -> ``Value`` or constant, in
    parameter order) and emit its ``AwsNeuronCustomNativeKernel`` call; return its results.

    The operands are the ``Value``s of ``bound`` in order (``docs/trainium-reference.md`` §R9).
    The outputs the toolchain reports must be exactly ``result_types`` (``TensorType``s), else
    ``LoweringError``: a kernel whose interface drifted is never wired in silently.
    """
    from ...lowering.emit import Value

    specs = {
        k: TensorSpec(v.shape, v.dtype) if isinstance(v, Value) else v for k, v in bound.items()
    }
    target, lnc = _platform(ctx)
    try:
        config = _kernel_config(kernel, specs, target=target, lnc=lnc, grid=grid)
    except Exception as e:
        raise KernelSpecialisationError(
            f"the NKI toolchain could not specialise kernel {name}",
            node=ctx.node,
            reason=f"{type(e).__name__}: {e}",
            hint="run the kernel with nki.simulate on the same shapes to see the NKI error",
        ) from e
    got = [(s.shape, s.dtype) for s in config.output_specs]
    want = [(tuple(t.shape), t.dtype) for t in result_types]
    if got != want:
        raise LoweringError(
            f"kernel {name} and its reference disagree on the outputs",
            node=ctx.node,
            reason=f"kernel returns {got}, the reference {want}",
        )
    if config.operand_output_aliases:
        raise LoweringError(
            f"kernel {name} writes its inputs in place; nki_op supports functional kernels only",
            node=ctx.node,
            hint="allocate the output with nl.ndarray(..., buffer=nl.shared_hbm) and return it",
        )
    operands = [v for v in bound.values() if isinstance(v, Value)]
    attrs = {"nki_version": config.nki_version}  # in the module text, hence in the cache key
    if config.has_collectives:
        attrs["has_collectives"] = "1"
    return ctx.custom_call(
        NKI_CUSTOM_CALL, operands, list(result_types), config.backend_config_b64, attrs
    )
