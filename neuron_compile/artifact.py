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


def stablehlo_version() -> str:
    from jaxlib.mlir.dialects import stablehlo

    return str(stablehlo.get_current_version())


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


def serialize(text: str, form: str = "portable") -> bytes:
    """Serialize verified ``text``: ``portable`` = StableHLO portable artifact (VHLO bytecode,
    readable by later StableHLO versions), ``bytecode`` = plain MLIR bytecode."""
    from jaxlib.mlir import ir
    from jaxlib.mlir.dialects import stablehlo

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
