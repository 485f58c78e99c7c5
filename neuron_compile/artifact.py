"""StableHLO verification and serialization with jaxlib's bundled MLIR.

The verified module is serialized once; that byte string is both what the CPU executor runs and
what neuronx-cc receives on Trainium, so numerics checked here are numerics of the shipped artifact.
"""

from __future__ import annotations

import io
import re
import threading
from dataclasses import dataclass
from functools import lru_cache

_LINE_RE = re.compile(r'"-":(\d+):(\d+): (?:error: )?(.*)')
_local = threading.local()


@dataclass(frozen=True)
class VerifyFailure(Exception):
    line: int | None
    message: str


@lru_cache(maxsize=1)
def _registry():
    from jaxlib.mlir import ir
    from jaxlib.mlir._mlir_libs import _jax_mlir_ext

    reg = ir.DialectRegistry()
    _jax_mlir_ext.register_dialects(
        reg
    )  # func, arith, ... (stablehlo alone cannot parse func.func)
    return reg


def _context():
    # MLIR contexts are not thread-safe; Dynamo may compile on more than one thread.
    ctx = getattr(_local, "ctx", None)
    if ctx is None:
        from jaxlib.mlir import ir
        from jaxlib.mlir.dialects import stablehlo

        ctx = ir.Context()
        ctx.append_dialect_registry(_registry())
        ctx.load_all_available_dialects()
        stablehlo.register_dialect(ctx)
        _local.ctx = ctx
    return ctx


@lru_cache(maxsize=1)
def stablehlo_version() -> str:
    # The native library alone loads in ~25 ms; the Python dialect bindings take ~80 ms more,
    # which a warm start (cache hit: nothing to parse or verify) would otherwise pay for this.
    try:
        from jaxlib.mlir._mlir_libs import _stablehlo
    except ImportError:  # pragma: no cover - depends on the jaxlib release layout
        from jaxlib.mlir.dialects import stablehlo as _stablehlo
    return str(_stablehlo.get_current_version())


def verify(text: str):
    """Parse and verify ``text``; return the module or raise ``VerifyFailure`` with the line."""
    from jaxlib.mlir import ir

    with _context(), ir.Location.unknown():
        try:
            module = ir.Module.parse(text)
        except ir.MLIRError as e:
            raise _failure(str(e)) from None
        if not module.operation.verify():
            raise VerifyFailure(None, "module failed verification")
    return module


def _failure(message: str) -> VerifyFailure:
    for line in message.splitlines():
        m = _LINE_RE.search(line)
        if m:
            return VerifyFailure(int(m.group(1)), m.group(3).strip())
    return VerifyFailure(None, message.strip())


#: Artifact forms: ``portable`` (StableHLO portable artifact = VHLO bytecode), ``bytecode`` (plain
#: MLIR bytecode of the StableHLO module; what TorchNeuron hands neuronx-cc as ``module.mlir``),
#: ``hlo`` (XLA ``HloModuleProto``; neuronx-cc's documented input ``module.hlo.pb``).
FORMS = ("portable", "bytecode", "hlo")
#: File name neuronx-cc receives per artifact form (``portable`` is re-encoded as ``bytecode``:
#: neuronx-cc reads the StableHLO dialect, not VHLO).
NEURONX_CC_INPUT = {"portable": "module.mlir", "bytecode": "module.mlir", "hlo": "module.hlo.pb"}


def serialize(text: str, form: str = "portable") -> bytes:
    """Serialize verified ``text``: ``portable`` = StableHLO portable artifact (VHLO bytecode,
    readable by later StableHLO versions), ``bytecode`` = plain MLIR bytecode, ``hlo`` = XLA
    ``HloModuleProto`` bytes (jaxlib's ``mlir_module_to_xla_computation``)."""
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo

    if form == "hlo":
        from jaxlib import _jax  # internal path; the same converter jax.jit uses

        comp = _jax.mlir.mlir_module_to_xla_computation(
            text, use_tuple_args=False, return_tuple=False
        )
        return bytes(comp.as_serialized_hlo_module_proto())
    if form == "portable":
        # The _str variant works on a copy: serialize_portable_artifact(module) rewrites the module
        # itself into vhlo ops.
        return bytes(
            stablehlo.serialize_portable_artifact_str(text, stablehlo.get_current_version())
        )
    with _context(), ir.Location.unknown():
        module = ir.Module.parse(text)
        buf = io.BytesIO()
        module.operation.write_bytecode(buf)
        return buf.getvalue()


def pretty(text: str) -> str:
    """The verified module re-printed by MLIR in pretty form (what dumps and golden tests show)."""
    return str(verify(text))


def deserialize_portable(artifact: bytes) -> str:
    """Portable artifact back to StableHLO text (used by tests and the CLI to inspect artifacts)."""
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo

    with _context(), ir.Location.unknown():
        return str(stablehlo.deserialize_portable_artifact(_context(), artifact))


def hlo_to_stablehlo(proto: bytes) -> bytes:
    """``HloModuleProto`` bytes -> StableHLO MLIR bytecode (raises on anything else)."""
    from jaxlib import _jax

    return bytes(_jax.mlir.hlo_to_stablehlo(proto))


def executable_input(artifact: bytes, form: str) -> bytes:
    """Bytes XLA's ``compile_and_load`` accepts for an artifact of ``form``: the artifact itself,
    or for ``hlo`` the StableHLO jaxlib converts the proto back into (same numbers)."""
    return hlo_to_stablehlo(artifact) if form == "hlo" else artifact


def artifact_text(artifact: bytes, form: str) -> str:
    """Parse and verify an artifact of any form; return its StableHLO text. Raises
    ``VerifyFailure`` when the bytes are not a valid module of that form."""
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo

    try:
        if form == "portable":
            with _context(), ir.Location.unknown():
                module = stablehlo.deserialize_portable_artifact(_context(), artifact)
        else:
            data = hlo_to_stablehlo(artifact) if form == "hlo" else artifact
            with _context(), ir.Location.unknown():
                module = ir.Module.parse(data)
    except Exception as e:  # jaxlib raises MLIRError, JaxRuntimeError or ValueError here
        raise VerifyFailure(None, f"not a valid {form} artifact: {type(e).__name__}: {e}") from None
    with _context():
        if not module.operation.verify():
            raise VerifyFailure(None, f"{form} artifact failed verification")
        return str(module)


def neuronx_cc_input(text: str, form: str) -> tuple[str, bytes]:
    """``(file name, bytes)`` handed to neuronx-cc for the module ``text`` in artifact ``form``.

    Always serialized from the text, whose hash is the cache key's ``module`` component, never
    taken from a cached artifact: a NEFF cannot be checked against its source once built, so what
    neuronx-cc compiles must be bound to the key first (docs/cache-security.md)."""
    return NEURONX_CC_INPUT[form], serialize(text, "bytecode" if form == "portable" else form)
