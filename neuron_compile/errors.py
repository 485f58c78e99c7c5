"""Exceptions with stable codes.

Every message answers: what failed (code, op), where (FX node and the user's source line), why, and
what to do next. Codes are stable across releases; neuronx-cc's own codes look like ``NCC_EXXX000``
and are reported next to ours, never instead of them.

| code  | class               | meaning                                                        |
|-------|---------------------|----------------------------------------------------------------|
| NC001 | OptionsError        | unknown or invalid ``options`` key / env value                 |
| NC101 | UnsupportedOpError  | no lowering for an ATen op (or its support predicate said no)  |
| NC102 | LoweringError       | a lowering rule failed or produced the wrong type (our bug)    |
| NC103 | VerifierError       | jaxlib's StableHLO verifier rejected our module (our bug)      |
| NC104 | DtypePolicyError    | a 64-bit tensor under ``sixty_four_bit="error"``               |
| NC105 | NkiOpError          | an ``nki_op`` definition is invalid (name, reference, hints)   |
| NC201 | DynamicShapeError   | symbolic shapes requested (``dynamic=True`` / mark_dynamic)    |
| NC202 | RecompileLimitError | ``max_recompiles`` exceeded, or a recompile in strict mode     |
| NC301 | ExecutorError       | the XLA CPU executor failed to compile or run an artifact      |
| NC401 | CacheMissError      | strict mode (NEURON_COMPILE_CACHE_ONLY=1) hit a cache miss     |
| NC402 | CachedCompileFailure | this key failed to compile before; the failure is cached      |
| NC403 | CacheBundleError    | a cache bundle failed validation (paths, checksums, schema)    |
| NC404 | CacheUnsafeError    | cache dir writable by others / not ours (warned, not raised)   |
| NC601 | (report finding)    | a Dynamo graph break (``neuron-compile check``, report/)       |
| NC602 | (report finding)    | run mode: compiled outputs differ from eager (report/)         |
| NC603 | (report finding)    | a compiled frame Dynamo skipped: it ran eagerly (``eager_frames()``, report/) |
| NC501 | StaticShapeViolation | trn legality: a symbolic dim (pre-empts NCC_EMOD025)          |
| NC502 | DtypeViolation      | trn legality: dtype the target lacks (EVRF004/005/051, ESPP004) |
| NC503 | Int64Violation      | trn legality: 64-bit value/type reaching neuronx-cc (EVRF062, ESFH002) |
| NC504 | IntegerDatapathViolation | trn legality: integer dot/conv/scatter-add (EVRF035/060) |
| NC505 | CustomCallViolation | trn legality: custom-call target not accepted (EHCA005)        |
| NC506 | IndexRangeViolation | trn legality: static gather/scatter index out of range (EVRF056/031) |
| NC507 | HbmViolation        | trn legality: estimated HBM footprint > one core (EOOM001)     |
| NC508 | GraphSizeViolation  | trn legality: graph-size proxy over the instruction limit (EBVF030) |
| NC509 | RngAlgorithmViolation | trn legality: RngBitGenerator with a non-default algorithm (EVRF006) |
| NC510 | ConvolutionFormViolation | trn legality: convolution with input+kernel dilation or stride+input dilation (EVRF010/011) |
| NC511 | ReduceWindowViolation | trn legality: reduce-window with dilation or more than one operand (EVRF017/018/019) |
| NC512 | OpDtypeViolation    | trn legality: TopK on ints, scatter-reduce on int/bool, non-32-bit arithmetic shift right (EVRF013/016/022) |
| NC513 | KernelArtifactViolation | trn legality: an NKI kernel's artifact is missing at compile time (EVRF059) |
| NC514 | CollectiveViolation | trn legality: a collective, its element type or its replica groups the target does not take (EUOC002/EVRF064) |
| NC521 | NeuronxCcNotFound   | a trn target needs neuronx-cc (PATH / NEURON_COMPILE_NEURONX_CC) |
| NC522 | NeuronxCcError      | neuronx-cc failed; fields ``ncc_code`` and ``triage``          |
| NC523 | NeuronxCcTimeout    | neuronx-cc exceeded NEURON_COMPILE_NEURONX_CC_TIMEOUT          |
| NC531 | NeuronRuntimeError  | the Neuron runtime failed to load or run a NEFF                |

Legality errors (NC50x) carry ``ncc_code`` (the neuronx-cc error they pre-empt), ``target`` and
``rule``, besides the FX node and the user's line.
"""

from __future__ import annotations

import re
import types
from typing import Any

import torch.fx as fx

_FRAME_RE = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
BUG_HINT = (
    "this is a neuron-compile bug: please report it with the dump from NEURON_COMPILE_DUMP_DIR"
)


def user_frame(node: fx.Node | None) -> str:
    """Return the innermost user frame of ``node`` as ``file:line in fn`` (or ``<unknown>``)."""
    trace = node.meta.get("stack_trace") if node is not None else None
    if not trace:
        return "<unknown>"
    frames = _FRAME_RE.findall(trace)
    if not frames:
        return "<unknown>"
    # Dynamo records the user's frames outermost first; the last one is where the op was called.
    path, line, fn = frames[-1]
    return f"{path}:{line} in {fn}"


def user_source_line(node: fx.Node | None) -> str | None:
    """The source text of the user's line that produced ``node``, if the trace carries it."""
    trace = node.meta.get("stack_trace") if node is not None else None
    if not trace:
        return None
    # The trace ends with the source line, optionally followed by a ^^^^ marker line.
    lines = [ln.strip() for ln in trace.strip().splitlines() if ln.strip().strip("^~")]
    return lines[-1] if lines and not lines[-1].startswith("File ") else None


def _rebuild(cls: type[NeuronCompileError], fields: dict, message: str) -> NeuronCompileError:
    err = cls.__new__(cls)
    RuntimeError.__init__(err, message)
    err.__dict__.update(fields)
    err._message = message
    return err


# Attributes Dynamo attaches to an exception on its way out (frames, its user stack, its compile
# id): meaningless in another process, and frames do not pickle.
_DYNAMO_ATTRS = frozenset(
    (
        "first_useful_frame",
        "_torch_dynamo_tracer_output",
        "frame_exec_strategy",
        "real_stack",
        "innermost_user_frame_summary",
        "compile_id",
        "record_filename",
    )
)


class NeuronCompileError(RuntimeError):
    """Base class. Subclasses set ``code``; instances carry fields for reports."""

    code = "NC000"

    def __init__(
        self,
        what: str,
        *,
        node: fx.Node | None = None,
        reason: str | None = None,
        hint: str | None = None,
        **fields: Any,
    ) -> None:
        self.what = what
        self.node_name = node.name if node is not None else None
        self.op = str(node.target) if node is not None and node.op == "call_function" else None
        self.where = user_frame(node)
        self.source = user_source_line(node)
        self.reason = reason
        self.hint = hint
        self.__dict__.update(fields)
        self._message = self._format()
        super().__init__(self._message)

    def __str__(self) -> str:
        # Dynamo appends its own advice to ``args[0]`` of any exception crossing it
        # (``augment_exc_message``: "Set TORCHDYNAMO_VERBOSE=1 ... reporting a bug to PyTorch");
        # our text stays ours, with or without torch.compile around it.
        return self.__dict__.get("_message") or super().__str__()

    def _format(self) -> str:
        msg = f"[{self.code}] {self.what}"
        if self.node_name is not None:
            msg += f" (node %{self.node_name}"
            msg += f", op {self.op})" if self.op else ")"
        if self.where != "<unknown>":
            msg += f"\n  at {self.where}"
            if self.source:
                msg += f"\n    {self.source}"
        if self.reason:
            msg += f"\n  reason: {self.reason}"
        if self.hint:
            msg += f"\n  hint: {self.hint}"
        return msg

    def __reduce__(self):  # survive worker processes with fields intact
        fields = {k: v for k, v in vars(self).items() if k not in _DYNAMO_ATTRS}
        return (_rebuild, (type(self).public_class(), fields, str(self)))

    @classmethod
    def public_class(cls) -> type[NeuronCompileError]:
        """The importable class: ``cls`` itself, or the class ``through_dynamo`` derived from."""
        return cls.__dict__.get("_public_class", cls)


_THROUGH_DYNAMO: dict[type, type] = {}


def through_dynamo(err: NeuronCompileError, entry: types.FrameType | None) -> NeuronCompileError:
    """``err``, made to leave a Dynamo backend as itself with its message on top.

    Dynamo wraps every backend exception in ``BackendCompilerFailed(...) from None`` (ours only
    as its ``inner_exception``, printed under Dynamo's frames and followed by PyTorch's advice)
    except its own ``ShortenTraceback``, which it re-raises unchanged with the traceback cut to
    ``first_useful_frame`` (``TORCHDYNAMO_VERBOSE=1`` keeps it whole). So ``err`` becomes an
    instance of a subclass of its own class and ``ShortenTraceback``, cut at ``entry`` (the
    innermost of our entry frames it crossed). The subclass is made here, not in the class
    statements: importing ``torch._dynamo`` costs the CLI about a second, and errors raised
    outside ``torch.compile`` stay exactly what they were. Dynamo's ``compile_wrapper``
    turns it back into its public class on the way out (``_remove_dynamo_frames``), so the user
    catches exactly a ``DynamicShapeError``; until then, ``except DynamicShapeError`` catches it
    too, it prints as ``neuron_compile.errors.DynamicShapeError`` and pickles as that.
    """
    cls = type(err)
    if "_public_class" not in cls.__dict__:
        derived = _THROUGH_DYNAMO.get(cls)
        if derived is None:
            from torch._dynamo.exc import ShortenTraceback

            namespace = {
                "__module__": cls.__module__,
                "__qualname__": cls.__qualname__,
                "__doc__": cls.__doc__,
                "_public_class": cls,
                "first_useful_frame": None,
                # read by Dynamo's convert_frame on any TorchDynamoException
                "_torch_dynamo_tracer_output": None,
                "frame_exec_strategy": None,
                "remove_dynamo_frames": _remove_dynamo_frames,
            }
            derived = _THROUGH_DYNAMO[cls] = type(cls.__name__, (cls, ShortenTraceback), namespace)
        err.__class__ = derived
    if err.first_useful_frame is None:
        err.first_useful_frame = entry
    return err


def _remove_dynamo_frames(self: Any) -> Any:
    """``ShortenTraceback.remove_dynamo_frames``, called by Dynamo's ``compile_wrapper`` as the
    error leaves ``torch.compile``: the traceback cut at ``first_useful_frame`` (kept whole when
    that frame is not in it, the error re-raised from elsewhere, rather than failing an
    assertion), and the error made its public class again, its message without the advice
    Dynamo appended to ``args``: the user catches exactly a ``DynamicShapeError``."""
    from torch._dynamo import config

    tb = self.__traceback__
    while tb is not None and tb.tb_frame is not self.first_useful_frame:
        tb = tb.tb_next
    self.__class__ = self.public_class()
    self.__dict__.pop("first_useful_frame", None)
    if self.__dict__.get("_message"):
        self.args = (self._message,)
    return self if tb is None or config.verbose else self.with_traceback(tb)


class OptionsError(NeuronCompileError, ValueError):
    code = "NC001"


class UnsupportedOpError(NeuronCompileError):
    code = "NC101"


class LoweringError(NeuronCompileError):
    code = "NC102"


class VerifierError(NeuronCompileError):
    code = "NC103"


class DtypePolicyError(NeuronCompileError):
    code = "NC104"


class NkiOpError(NeuronCompileError, ValueError):
    """``neuron_compile.nki_op`` was given something it cannot turn into a custom op: raised
    where the op is defined (or where a user backward returns the wrong number of gradients)."""

    code = "NC105"


class DynamicShapeError(NeuronCompileError):
    code = "NC201"


class RecompileLimitError(NeuronCompileError):
    code = "NC202"


class ExecutorError(NeuronCompileError):
    code = "NC301"


class RegistryError(RuntimeError):
    """A lowering registered twice: raised at import time, never seen by users."""


class CacheError(NeuronCompileError):
    """Base of the on-disk cache errors (``neuron_compile/cache/store.py``)."""

    code = "NC400"


class CacheMissError(CacheError):
    code = "NC401"

    @classmethod
    def for_key(
        cls,
        key: str,
        *,
        graph_name: str,
        components: dict[str, str],
        explanation: list[str],
        root: str,
    ) -> CacheMissError:
        listed = "".join(f"\n    {name} = {value}" for name, value in sorted(components.items()))
        reason = (
            "nearest entry of this graph differs in: " + "; ".join(explanation)
            if explanation
            else f"no entry for graph {graph_name!r} in {root}"
        )
        return cls(
            f"cache miss for graph {graph_name!r} (key {key[:16]}) in strict mode "
            f"(NEURON_COMPILE_CACHE_ONLY=1)\n  key components:{listed}",
            reason=reason,
            hint="warm the cache with a run without NEURON_COMPILE_CACHE_ONLY, or "
            "`neuron-compile cache import BUNDLE` a bundle exported where it was compiled",
            key=key,
            graph_name=graph_name,
            components=dict(components),
            explanation=list(explanation),
        )


class CachedCompileFailure(CacheError):
    code = "NC402"

    @classmethod
    def from_record(cls, record: dict[str, Any], *, retry_at: float) -> CachedCompileFailure:
        import time

        def when(t: float) -> str:
            return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))

        first = (record.get("message") or "").splitlines()
        return cls(
            f"graph {record.get('graph_name')!r} (key {str(record.get('key'))[:16]}) failed to "
            f"compile at {when(float(record.get('created', 0)))}: "
            f"{record.get('error_type')}: {first[0] if first else ''}",
            reason=f"the failure is cached; it is retried automatically after {when(retry_at)} "
            "or when the compiler version or flags change",
            hint="retry now with NEURON_COMPILE_CACHE_RETRY_FAILED=1 (DiskCache(retry_failed=True))"
            " or `neuron-compile cache clear --failures`",
            key=record.get("key"),
            graph_name=record.get("graph_name"),
            error_type=record.get("error_type"),
            fingerprint=record.get("fingerprint"),
            message=record.get("message"),
            retry_at=retry_at,
        )


class CacheBundleError(CacheError, ValueError):
    code = "NC403"


class CacheUnsafeError(CacheError):
    code = "NC404"


class LegalityError(NeuronCompileError):
    """Base of the trn legality violations (``neuron_compile/trainium/legality.py``)."""

    code = "NC500"


class StaticShapeViolation(LegalityError):
    code = "NC501"


class DtypeViolation(LegalityError):
    code = "NC502"


class Int64Violation(LegalityError):
    code = "NC503"


class IntegerDatapathViolation(LegalityError):
    code = "NC504"


class CustomCallViolation(LegalityError):
    code = "NC505"


class IndexRangeViolation(LegalityError):
    code = "NC506"


class HbmViolation(LegalityError):
    code = "NC507"


class GraphSizeViolation(LegalityError):
    code = "NC508"


class RngAlgorithmViolation(LegalityError):
    code = "NC509"


class ConvolutionFormViolation(LegalityError):
    code = "NC510"


class ReduceWindowViolation(LegalityError):
    code = "NC511"


class OpDtypeViolation(LegalityError):
    code = "NC512"


class KernelArtifactViolation(LegalityError):
    code = "NC513"


class CollectiveViolation(LegalityError):
    code = "NC514"


class NeuronxCcNotFound(NeuronCompileError):
    code = "NC521"


class NeuronxCcError(NeuronCompileError):
    """neuronx-cc exited non-zero. Fields: ``ncc_code`` (first ``NCC_*`` code or None),
    ``triage`` (a class of ``trainium/triage.py``'s ``CLASSES``), ``argv``, ``returncode``,
    ``log_tail``."""

    code = "NC522"


class NeuronxCcTimeout(NeuronxCcError):
    code = "NC523"


class NeuronRuntimeError(NeuronCompileError):
    code = "NC531"
