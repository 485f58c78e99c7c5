"""The only module that touches jaxlib's XLA client API (it shifts between jaxlib releases).

Runs a serialized StableHLO artifact on XLA's CPU client. Tensors cross in and out through dlpack
without copies where XLA can alias the memory.
"""

from __future__ import annotations

import atexit
import logging
import math
import re
import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

import torch

from .client import Client, intra_op_threads, make_cpu_client

log = logging.getLogger(__name__)


def _client():
    """Our own XLA CPU client, straight from jaxlib: ``import jax`` (for ``jax.extend``'s shared
    backend) would cost ~0.9 s before the first compile; the first array imports it anyway, but
    later, beside the compile (``_import_jax_meanwhile``). A process that also uses JAX simply has
    two CPU clients; tensors cross between them through dlpack anyway.

    Graphs without collectives always run here, on every rank: a rank may compile a graph the
    others never do (an evaluation on rank 0), which the distributed client could not allow."""
    return _local_client(None)


@lru_cache(maxsize=2)
def _local_client(threads: int | None):
    """A local client with ``threads`` intra-op threads (None: ``intra_op_threads()``)."""
    from jaxlib import xla_client

    backend = make_cpu_client(xla_client, threads=threads)
    device = backend.devices()[0]
    return backend, device, xla_client.DeviceList((device,)), xla_client


#: How XLA CPU compiles every module: LLVM at -O1, through the classic elemental emitters instead
#: of the MLIR fusion emitters. XLA spends most of a compile in LLVM (its HLO passes: a few per
#: cent), one function per fusion, and that way each fusion compiles in about half the time and
#: runs as fast (dots and convolutions are library calls either way). Forward graphs, best of 3
#: compiles: ResNet-18-style 1.06 -> 0.81 s, GPT-2 0.63 -> 0.40 s, Llama 0.79 -> 0.38 s, T5
#: 0.96 -> 0.45 s; executions within noise of XLA's defaults except a small MLP's (+0.1 ms).
#: Numbers and commands: docs/benchmarks.md.
OPT_LEVEL = 1
FUSION_EMITTERS = False
#: LLVM modules XLA splits a module's kernels into, compiled in parallel (XLA's default: 32). Each
#: module pays LLVM's setup once, and two cores keep busy with four: over the 26 graphs of
#: ``benchmarks/bench_models.py``, interleaved, compile CPU time -8 % and wall time -4 %,
#: executions within noise and the same bits (only which module holds a kernel changes).
CODEGEN_PARTS = 4
#: XLA passes the executor never runs. XLA's algebraic simplifier rewrites floating-point
#: expressions as if they were real numbers, which its authors deem "acceptable in the ML context"
#: and no option turns off: ``(x + C) - C`` becomes ``x`` (the round-to-integer trick
#: ``(x + 1.5 * 2**23) - 1.5 * 2**23`` returned ``x`` unrounded), ``log(exp(x))`` becomes ``x``,
#: ``sqrt(x * x)`` becomes ``|x|``, ``exp(a) * exp(b)`` becomes ``exp(a + b)``, ``x * C1 * C2``
#: becomes ``x * (C1 * C2)``, all of them finite where eager overflows to inf or NaN, and
#: ``x * convert(mask)`` becomes ``select(mask, x, 0)``: 0 where eager's ``inf * 0`` is NaN and
#: its ``-2.0 * 0`` is -0.0. The executor checks numerics against eager, so it evaluates the
#: module as written. Measured over the 26
#: graphs of ``benchmarks/bench_models.py`` (docs/benchmarks.md): compiles +3 %, executions +8 %
#: (conv nets: transposes around their convolutions stay copies); transformers within noise.
DISABLED_PASSES = ("algsimp",)


def compile_options(options: Any) -> Any:
    """``options`` with our XLA CPU settings. Only how XLA CPU compiles a module changes, never
    the module, so what neuronx-cc receives does not; a serialized executable in the on-disk cache
    is keyed by the artifact's bytes and this module's source, so it always matches them."""
    debug = options.executable_build_options.debug_options
    debug.xla_backend_optimization_level = OPT_LEVEL
    # Added to the passes the caller disabled (the distributed client keeps its collectives'
    # barriers that way), never in place of them.
    disabled = [p for p in debug.xla_disable_hlo_passes.split(",") if p]
    debug.xla_disable_hlo_passes = ",".join(
        disabled + [p for p in DISABLED_PASSES if p not in disabled]
    )
    options.env_option_overrides = [
        ("xla_cpu_use_fusion_emitters", FUSION_EMITTERS),
        ("xla_cpu_parallel_codegen_split_count", CODEGEN_PARTS),
    ]
    return options


#: True once a process has a second client beside the local one (distributed, or one-thread):
#: arrays may then belong to either, and ``to_xla`` checks which (a ~0.5 us device test nobody
#: else pays).
_TWO_CLIENTS = False

#: A module runs on one thread when it has no convolution, none of its matrix products exceeds
#: ``ONE_THREAD_MACS`` multiply-adds and none of its tensors ``ONE_THREAD_ELEMENTS`` elements.
#: Such a module's kernels are too small to gain from a second thread what waking it costs, and
#: beside eager PyTorch a second XLA thread contends for a core with torch's OpenMP workers,
#: which spin for ~2.5 ms after each parallel torch op (the optimizer's): in train steps of the
#: transformers of ``benchmarks/bench_models.py`` (products up to 4.2M multiply-adds), one
#: thread ran GPT-2 9 %, BERT 19 %, Llama 21 %, ViT 31 % and ConvNeXt 11 % faster; the conv nets
#: and the MLP (a 16.8M product) ran 10-40 % slower, so they keep every thread. The thread count
#: changes rounding in reductions, never the module: the same module always gets the same.
ONE_THREAD_MACS = 8 * 2**20
ONE_THREAD_ELEMENTS = 2**20
_DOT = re.compile(
    r'"stablehlo\.dot_general"[^\n]*?lhs_contracting_dimensions = \[([\d, ]*)\][^\n]*?'
    r": \(tensor<([^>]*)>, tensor<[^>]*>\) -> tensor<([^>]*)>"
)
_TENSOR = re.compile(r"tensor<([\dx]*)[a-z]")


def _dims(tensor_type: str) -> list[int]:
    return [int(d) for d in tensor_type.split("x")[:-1]]


def runs_on_one_thread(module_text: str) -> bool:
    """Whether the module ``module_text`` (our emitter's text) runs on a one-thread client."""
    if intra_op_threads() == 1 or '"stablehlo.convolution"' in module_text:
        return False
    for contracting, lhs, result in _DOT.findall(module_text):
        lhs_dims = _dims(lhs)
        depth = math.prod(lhs_dims[int(d)] for d in contracting.split(",") if d.strip())
        if math.prod(_dims(result)) * depth > ONE_THREAD_MACS:
            return False
    return all(
        math.prod(int(d) for d in dims.split("x") if d) <= ONE_THREAD_ELEMENTS
        for dims in set(_TENSOR.findall(module_text))
    )


def _one_thread_client():
    """A second local client, with one intra-op thread (``runs_on_one_thread``)."""
    global _TWO_CLIENTS
    _client()  # the default client comes first: arrays made without an executable are its
    _TWO_CLIENTS = True
    return _local_client(1)


def _client_for(ranks: tuple[int, ...], one_thread: bool = False) -> Client:
    """The client a module whose collectives reach ``ranks`` runs on: the local one (no
    collectives, or a group of this rank alone), or its one-thread twin when ``one_thread``, or
    the distributed one those ranks join (``runtime/distributed.py``)."""
    global _TWO_CLIENTS
    if len(ranks) <= 1:
        backend, device, devices, xla_client = _one_thread_client() if one_thread else _client()
        return Client(backend, device, devices, xla_client.CompileOptions)
    from .distributed import distributed_client

    _TWO_CLIENTS = True
    return distributed_client(ranks)


def _outside_tracing():
    """Leave every active dispatch mode (FakeTensorMode, functionalization) for a moment.

    The first executable is built inside AOTAutograd's compiler callback, where FakeTensorMode is
    active: a probe tensor made there is fake, has no data pointer, and would make the probe fail
    and pin the slow path for the rest of the process.
    """
    from torch.utils._python_dispatch import _disable_current_modes

    return _disable_current_modes()


@lru_cache(maxsize=1)
def _import_jax_meanwhile() -> None:
    """Import jax on another thread while XLA compiles the first executable (XLA releases the
    GIL). The first array the dlpack bridges make imports jax (~0.9 s: jaxlib's C++ reaches for
    ``jax._src.sharding_impls``), which the first call of every process paid on its own. A
    process that only compiles spends that CPU time on the other core, off its critical path.
    Python's import lock makes a user's own ``import jax`` wait for this one to finish."""
    if "jax" in sys.modules:
        return

    def run() -> None:
        try:
            import jax  # noqa: F401
        except Exception as e:  # pragma: no cover - the first array will raise it again
            log.debug("importing jax in the background failed: %s", e)

    thread = threading.Thread(target=run, name="neuron-compile-import-jax", daemon=True)
    thread.start()
    atexit.register(thread.join, 30)  # a process that exits right away lets the import finish


@lru_cache(maxsize=4)
def _importer(device: Any = None) -> Callable[[torch.Tensor], Any]:
    """Fastest available torch -> XLA buffer import (zero-copy for aligned dense tensors).

    ``_jax.dlpack_managed_tensor_to_buffer`` on ``torch._C._to_dlpack`` costs ~3 us per tensor
    vs ~25 us for the public ``jax.dlpack.from_dlpack`` (jaxlib 0.10.2); the C-level capsule also
    needs no ``detach()`` for tensors that require grad. Falls back when a release renames it.
    """
    device = device or _client()[1]
    try:
        from jaxlib import _jax

        raw = _jax.dlpack_managed_tensor_to_buffer
        capsule = torch._C._to_dlpack

        def fast(t: torch.Tensor) -> Any:
            return raw(capsule(t), device, None)

        with _outside_tracing():
            fast(torch.zeros(2))  # probe the signature once
        return fast
    except Exception as e:  # pragma: no cover - depends on the jaxlib release
        log.debug("fast dlpack import unavailable (%s); using jax.dlpack.from_dlpack", e)
        import jax.dlpack

        def public(t: torch.Tensor) -> Any:
            return jax.dlpack.from_dlpack(t.detach())

        return public


@lru_cache(maxsize=1)
def _exporters() -> tuple[
    Callable[[Any], torch.Tensor], Callable[[Sequence[Any]], list[torch.Tensor]]
]:
    """Fastest available XLA buffer -> torch export (zero-copy; waits for the buffer): one array,
    and many at once.

    ``_jax.buffer_to_dlpack_managed_tensor`` + ``torch._C._from_dlpack`` costs ~0.8 us per
    array in a loop (~4 us right after an execution, with cold caches) vs ~4.5 us for
    ``torch.from_dlpack(array)``, which goes through jax's Python ``__dlpack__``; both are C
    functions, so ``map`` runs a whole result list without a Python
    frame per array. Falls back when a release renames them.
    """
    try:
        from jaxlib import _jax

        raw = _jax.buffer_to_dlpack_managed_tensor
        from_capsule = torch._C._from_dlpack

        def one(a: Any) -> torch.Tensor:
            return from_capsule(raw(a))

        def many(arrays: Sequence[Any]) -> list[torch.Tensor]:
            return list(map(from_capsule, map(raw, arrays)))

        with _outside_tracing():
            probe = torch.arange(3, dtype=torch.float32)
            if not torch.equal(many([_importer()(probe)])[0], probe):
                raise RuntimeError("round trip changed the values")
        return one, many
    except Exception as e:  # pragma: no cover - depends on the jaxlib release
        log.debug("fast dlpack export unavailable (%s); using torch.from_dlpack", e)
        return torch.from_dlpack, lambda arrays: list(map(torch.from_dlpack, arrays))


def platform_version() -> str:
    import jaxlib

    backend, _, _, _ = _client()
    return f"XLA:{backend.platform.upper()} (jaxlib {jaxlib.__version__})"


#: XLA arrays behind tensors this module handed to torch, keyed by (data_ptr, shape, dtype).
#: A saved activation that comes back as a backward input is then passed to XLA without a
#: second dlpack import. An entry lives exactly as long as the torch tensor made from it (a
#: weakref callback drops it), so while it exists no other tensor can own that address.
_EXPORTED: dict[tuple[int, torch.Size, torch.dtype], tuple[Any, weakref.ref]] = {}


def _forget(key: tuple[int, torch.Size, torch.dtype]) -> Callable[[Any], None]:
    return lambda _ref: _EXPORTED.pop(key, None)


def _remember(t: torch.Tensor, array: Any) -> None:
    key = (t.data_ptr(), t.shape, t.dtype)
    _EXPORTED[key] = (array, weakref.ref(t, _forget(key)))  # the ref must outlive t


class XlaCpuExecutable:
    """A compiled artifact on the XLA CPU client.

    Crossing torch <-> XLA costs ~3 us per imported tensor, which dominates the per-call overhead
    of a graph with dozens of inputs. Two caches remove most imports without copying anything:
    parameters (the same ``nn.Parameter`` objects every call, updated in place by optimizers) keep
    their zero-copy XLA alias in the caller's per-input ``param_slots`` (``CompiledGraph`` owns
    them, so they live as long as the compiled graph: until ``torch._dynamo.reset()`` or the
    compiled function is dropped), checked by identity and data pointer each call; and
    tensors this executor produced are recognized by address (``_EXPORTED``). Inputs must be
    contiguous (``CompiledGraph`` guarantees it).
    """

    def __init__(
        self,
        artifact: bytes | None = None,
        *,
        serialized: bytes | None = None,
        ranks: tuple[int, ...] = (),
        one_thread: bool = False,
    ) -> None:
        """Compile ``artifact``, or load ``serialized`` (bytes from ``serialize()`` of an
        executable built by this jaxlib on a host with the same CPU features). Loading runs
        native code from those bytes: only pass bytes this machine's own cache wrote.

        ``ranks``: a module with collectives that reach these ranks (its replica groups numbered
        by their position in ``ranks``: ``distributed.over_ranks``), compiled on the client they
        share, one replica per rank; it runs on this rank's device. ``one_thread``: run on the
        one-thread client (``runs_on_one_thread``); the same executable either way."""
        client = _client_for(ranks, one_thread)
        self._backend, self._device = client.backend, client.device
        if serialized is not None:
            self._exe = self._backend.deserialize_executable(
                serialized, client.devices, client.options()
            )
        elif artifact is not None:
            options = compile_options(client.options())
            _import_jax_meanwhile()
            self._exe = self._backend.compile_and_load(artifact, client.devices, options)
        else:
            raise TypeError("XlaCpuExecutable needs an artifact or a serialized executable")

    # The dlpack bridges are resolved on first use, not at load: they create jax.Array objects,
    # and the first one imports jax (~0.9 s; begun during the first compile, see
    # ``_import_jax_meanwhile``), which a process loading its executables from the cache only
    # pays if it runs them.
    @property
    def _import(self) -> Callable[[torch.Tensor], Any]:
        return _importer(self._device)

    def serialize(self) -> bytes:
        """The compiled executable as bytes (for the on-disk cache)."""
        return bytes(self._backend.serialize_executable(self._exe))

    def to_xla(self, slots: list[Any] | None, slot: int, t: Any) -> Any:
        """``t`` as an executor array: a tensor is imported (zero-copy where possible) unless
        ``slots[slot]`` holds its parameter alias or this executor produced it; arrays pass."""
        if not isinstance(t, torch.Tensor):
            # Already an executor array (a saved activation kept on the device); one of the
            # other client's (collectives on one side of a forward/backward pair) crosses over.
            if _TWO_CLIENTS and t.device is not self._device:
                return self._import(to_torch(t))
            return t
        ptr = t.data_ptr()
        cached = slots[slot] if slots is not None else None
        if cached is not None and cached[0] is t and cached[1] == ptr:
            return cached[2]
        exported = _EXPORTED.get((ptr, t.shape, t.dtype))
        if exported is not None and not (_TWO_CLIENTS and exported[0].device is not self._device):
            return exported[0]
        array = self._import(t)
        if (
            slots is not None
            and isinstance(t, torch.nn.Parameter)
            and array.unsafe_buffer_pointer() == ptr
        ):
            # Zero-copy alias: in-place optimizer updates are visible to XLA without re-import.
            slots[slot] = (t, ptr, array)
        return array

    def adopt(self, arrays: Sequence[Any]) -> Sequence[Any]:
        """Executor arrays another graph returned (saved activations), on this executable's
        client: a forward with collectives runs on the distributed client, its backward without
        any on the local one, a small module's on the one-thread client. The same arrays when
        they are on this executable's device: they are one execution's results, so all on one
        client, and the first tells (``to_xla`` per array, or reading each array's device, cost
        a small GPT's backward 15-20 us a call)."""
        if not _TWO_CLIENTS or not arrays or arrays[0].device is self._device:
            return arrays
        return [self.to_xla(None, 0, a) for a in arrays]

    def run(self, arrays: list[Any], export: Sequence[int] | None, register: bool) -> list[Any]:
        """Execute on ``arrays`` (executor arrays in ``@main``'s order). The results listed in
        ``export`` (all when None) come back as tensors, remembered for a cheap re-import when
        ``register`` is set; the others stay executor arrays."""
        results = self._exe.execute(arrays)
        one, many = _exporters()
        if export is None:
            tensors = many(results)
            if register:
                for t, array in zip(tensors, results, strict=True):
                    _remember(t, array)
            return tensors
        for i in export:
            array = results[i]
            results[i] = t = one(array)
            if register:
                _remember(t, array)
        return results

    def __call__(
        self,
        inputs: Sequence[Any],
        param_slots: list[Any] | None = None,
        export: Sequence[int] | None = None,
        register: bool = True,
    ) -> list[Any]:
        """Run on ``inputs`` (tensors, or arrays this executor returned earlier).

        ``param_slots`` (one entry per input, owned by the caller) keeps parameters' XLA aliases
        between calls; the caller's lifetime bounds what it holds. ``export`` and ``register``:
        see ``run``.
        """
        to_xla = self.to_xla
        arrays = [to_xla(param_slots, i, t) for i, t in enumerate(inputs)]
        return self.run(arrays, export, register)


def to_torch(array: Any) -> torch.Tensor:
    """An executor array as a tensor (zero-copy)."""
    return _exporters()[0](array)
