"""Driver for AWS's Neuron compiler ``neuronx-cc``: find it, build its command, run it, triage it.

The command is TorchNeuron's (``/work/shared/reference/torchneuron.md`` §2.5)::

    neuronx-cc compile <work>/module.mlir --framework XLA --target <trn2|trn3> --lnc <1|2> -O<k>
        --model-type transformer --auto-cast=none <$NEURON_CC_FLAGS> --output <work>/model.neff

with ``module.hlo.pb`` (an ``HloModuleProto``) instead of ``module.mlir`` (StableHLO bytecode)
under ``artifact="hlo"``. User flags come last, so they override ours where neuronx-cc lets the
last occurrence win. It runs in a fresh work directory with a timeout, its output streams to
this module's logger at DEBUG, and a failure becomes ``NeuronxCcError`` (NC522) carrying the
first ``NCC_*`` code and its triage class; a timeout is ``NeuronxCcTimeout`` (NC523).

Environment: ``NEURON_COMPILE_NEURONX_CC`` (path of the compiler; default: ``neuronx-cc`` on
PATH), ``NEURON_COMPILE_NEURONX_CC_TIMEOUT`` (seconds, default 7200), ``NEURON_CC_FLAGS``
(AWS's variable: extra flags, part of every NEFF cache key).

Pure stdlib at import time: precompile workers import this module without torch.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .cache.binding import NEFF_FILE

log = logging.getLogger(__name__)

ENV_PATH = "NEURON_COMPILE_NEURONX_CC"
ENV_TIMEOUT = "NEURON_COMPILE_NEURONX_CC_TIMEOUT"
ENV_FLAGS = "NEURON_CC_FLAGS"
DEFAULT_TIMEOUT = 7200.0
LOG_FILE = "neuronx-cc.log"

#: ``NCC_`` + E(rror)/I(nternal) + 3-letter class + 3 digits; older logs print ``[TEN404]``.
NCC_CODE = re.compile(r"NCC_[EI][A-Z]{3}\d{3}")
_VERSION = re.compile(r"\d+\.\d+(?:\.\d+)*(?:[+.\-][\w.]+)?")

#: Triage classes of neuronx-cc codes (trainium-nki.md §6): class -> (codes, what to do).
TRIAGE: dict[str, tuple[tuple[str, ...], str]] = {
    "user-shape-dtype": (
        ("EMOD025", "ESPP", "ESFH002", "EVRF004", "EVRF005", "EVRF035", "EVRF051", "EVRF052")
        + tuple(f"EVRF06{i}" for i in range(4)),
        "pad/bucket the shapes, cast the dtype, or pass a downcast flag in NEURON_CC_FLAGS",
    ),
    "unsupported-op": (
        ("EUOC002", "EVRF001", "EVRF006", "EVRF010", "EVRF011", "EVRF013", "EVRF016", "EVRF017")
        + ("EVRF018", "EVRF019", "EVRF022"),
        "run the op on the CPU (fallback) or rewrite it; report it so a decomposition is added",
    ),
    "lowering-bug": (
        ("EHCA005", "EVRF015", "EVRF031", "EVRF064")
        + tuple(f"EVRF0{i}" for i in (*range(36, 51), 53, 54, 55, 56, 57, 58)),
        "a neuron-compile lowering bug: report it with NEURON_COMPILE_DUMP_DIR's dump",
    ),
    "nki-toolchain": (
        ("EVRF059", "EVRF065"),
        "re-trace the NKI kernel; check the artifact path and the nki/neuronx-cc versions",
    ),
    "capacity": (
        ("EOOM", "EXSP001", "EVRF007", "EVRF009", "EBVF030", "EXTP004", "EBIR023"),
        "split the graph, use a smaller bucket/batch, LNC=2 or sharding",
    ),
    "configuration": (("EARG001",), "fix --target / --lnc (NEURON_COMPILE_TARGET / _LNC)"),
    "compiler-internal": (("I",), "a neuronx-cc internal error: report it to AWS with the log"),
}


def triage(ncc_code: str | None) -> tuple[str, str]:
    """``(class, action)`` of an ``NCC_*`` code; ``unknown`` for codes outside the table."""
    if not ncc_code:
        return "unknown", "read the neuronx-cc log tail in the error"
    code = ncc_code.removeprefix("NCC_")
    if code.startswith("I"):
        return "compiler-internal", TRIAGE["compiler-internal"][1]
    for name, (codes, action) in TRIAGE.items():
        if name != "compiler-internal" and any(code.startswith(c) for c in codes):
            return name, action
    return "unknown", "look the code up in the Neuron SDK's compiler/error-codes"


def find_neuronx_cc() -> str | None:
    """``$NEURON_COMPILE_NEURONX_CC`` if set (must exist), else ``neuronx-cc`` on PATH."""
    explicit = os.environ.get(ENV_PATH, "").strip()
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    return shutil.which("neuronx-cc")


def timeout_seconds() -> float:
    raw = os.environ.get(ENV_TIMEOUT, "").strip()
    try:
        return float(raw) if raw else DEFAULT_TIMEOUT
    except ValueError:
        log.warning("ignoring %s=%r (not a number of seconds)", ENV_TIMEOUT, raw)
        return DEFAULT_TIMEOUT


def compiler_version(exe: str) -> str:
    """``neuronx-cc --version`` of ``exe`` (cached per path, mtime and size)."""
    try:
        st = os.stat(exe)
    except OSError:
        return "unknown"
    return _version(exe, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=8)
def _version(exe: str, _mtime: int, _size: int) -> str:
    try:
        out = subprocess.run(
            [exe, "--version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("cannot run %s --version: %s", exe, e)
        return "unknown"
    m = _VERSION.search(out.stdout + out.stderr)
    return m.group(0) if m else "unknown"


def build_command(
    exe: str,
    input_path: str,
    output_path: str,
    *,
    target: str,
    lnc: int,
    optlevel: int = 2,
    flags: str = "",
) -> list[str]:
    """The exact argv neuronx-cc is run with (see the module docstring)."""
    return [
        exe,
        "compile",
        input_path,
        "--framework",
        "XLA",
        "--target",
        target,
        "--lnc",
        str(lnc),
        f"-O{optlevel}",
        "--model-type",
        "transformer",
        "--auto-cast=none",
        *shlex.split(flags or ""),
        "--output",
        output_path,
    ]


@dataclass
class NeffJob:
    """One graph to compile to a NEFF: JSON-able, so precompile can ship it to workers."""

    graph_name: str
    key: str  # cache digest of the NEFF entry
    components: dict[str, str]
    input_name: str  # module.mlir / module.hlo.pb
    input_path: str  # where the input bytes are (a collected job's file)
    target: str
    lnc: int
    optlevel: int
    flags: str
    cache_name: str = ""  # graph name without the per-process frame id (cache entries)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class NeffResult:
    graph_name: str
    key: str
    status: str  # compiled | cached | failed | cached-failure | timeout
    seconds: float = 0.0
    neff_bytes: int = 0
    error_code: str | None = None  # ours (NC5xx / NC402)
    ncc_code: str | None = None
    triage: str | None = None
    message: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _stream(proc: subprocess.Popen, tail: deque, name: str) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip("\n")
        tail.append(line)
        log.debug("neuronx-cc[%s]: %s", name, line)


def run_neuronx_cc(
    input_name: str,
    data: bytes,
    *,
    target: str,
    lnc: int,
    optlevel: int = 2,
    flags: str | None = None,
    graph_name: str = "graph",
    exe: str | None = None,
    timeout: float | None = None,
) -> tuple[bytes, str]:
    """Compile ``data`` (written as ``input_name`` in a fresh work dir) to a NEFF.

    Returns ``(neff bytes, log tail)``. Raises NC521 without a compiler, NC522 on a non-zero
    exit (with ``ncc_code``/``triage``) and NC523 on timeout.
    """
    from . import errors  # lazy: errors imports torch.fx

    exe = exe or find_neuronx_cc()
    if exe is None:
        raise errors.NeuronxCcNotFound(
            f"neuronx-cc is needed to compile graph {graph_name} for {target}",
            hint=f"install the Neuron SDK (neuronx-cc is on AWS's pip repository, not PyPI), or "
            f"set {ENV_PATH} to its path",
        )
    flags = os.environ.get(ENV_FLAGS, "") if flags is None else flags
    timeout = timeout_seconds() if timeout is None else timeout
    work = Path(tempfile.mkdtemp(prefix="nc-neuronx-cc-"))
    try:
        (work / input_name).write_bytes(data)
        argv = build_command(
            exe,
            str(work / input_name),
            str(work / NEFF_FILE),
            target=target,
            lnc=lnc,
            optlevel=optlevel,
            flags=flags,
        )
        log.info("graph %s: %s", graph_name, shlex.join(argv))
        tail: deque[str] = deque(maxlen=200)
        start = time.perf_counter()
        proc = subprocess.Popen(
            argv,
            cwd=work,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            start_new_session=True,  # so a timeout kills the compiler's own children too
        )
        reader = threading.Thread(target=_stream, args=(proc, tail, graph_name), daemon=True)
        reader.start()
        try:
            returncode = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with _suppress():
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            reader.join(5)
            raise errors.NeuronxCcTimeout(
                f"neuronx-cc did not finish graph {graph_name} within {timeout:g} s",
                hint=f"raise {ENV_TIMEOUT}, or make the graph smaller (bucket, split)",
                ncc_code=None,
                triage="timeout",
                argv=argv,
                returncode=None,
                log_tail="\n".join(tail),
            ) from None
        reader.join(5)
        seconds = time.perf_counter() - start
        text = "\n".join(tail)
        logfile = work / "log-neuron-cc.txt"
        if returncode != 0:
            full = text + ("\n" + logfile.read_text(errors="replace") if logfile.exists() else "")
            codes = NCC_CODE.findall(full)
            code = next((c for c in codes if c.startswith("NCC_E")), codes[0] if codes else None)
            klass, action = triage(code)
            first = next((ln for ln in full.splitlines() if code and code in ln), "")
            raise errors.NeuronxCcError(
                f"neuronx-cc failed on graph {graph_name} (exit {returncode})"
                + (f" with {code}" if code else ""),
                reason=first.strip() or (text.splitlines()[-1] if text else "no output"),
                hint=f"[{klass}] {action}",
                ncc_code=code,
                triage=klass,
                argv=argv,
                returncode=returncode,
                log_tail=text[-4000:],
            )
        neff = work / NEFF_FILE
        if not neff.exists():
            raise errors.NeuronxCcError(
                f"neuronx-cc exited 0 but wrote no NEFF for graph {graph_name}",
                ncc_code=None,
                triage="unknown",
                argv=argv,
                returncode=0,
                log_tail=text[-4000:],
            )
        log.info("graph %s: NEFF %d bytes in %.1f s", graph_name, neff.stat().st_size, seconds)
        return neff.read_bytes(), text
    finally:
        shutil.rmtree(work, ignore_errors=True)


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return exc[0] is not None and issubclass(exc[0], OSError)  # type: ignore[arg-type]


def compile_job(job: NeffJob | dict[str, Any], *, disk: Any = None) -> NeffResult:
    """Compile one job into the disk cache (or find it there); never raises.

    ``disk`` defaults to the process-wide cache. The entry holds ``model.neff`` and the log;
    a failure leaves a negative entry (NC402 until its TTL or a version/flags change).
    """
    if isinstance(job, dict):
        job = NeffJob(**job)
    if disk is None:
        from .cache.tiers import disk_cache

        disk = disk_cache()
    start = time.perf_counter()

    def build() -> dict[str, bytes]:
        data = Path(job.input_path).read_bytes()
        neff, text = run_neuronx_cc(
            job.input_name,
            data,
            target=job.target,
            lnc=job.lnc,
            optlevel=job.optlevel,
            flags=job.flags,
            graph_name=job.graph_name,
        )
        return {NEFF_FILE: neff, LOG_FILE: text.encode()}

    result = NeffResult(job.graph_name, job.key, "compiled")
    try:
        if disk is None:
            files, source = build(), "uncached"
        else:
            files, source = disk.get_or_create(
                job.key,
                build,
                graph_name=(job.cache_name or job.graph_name) + ".neff",
                components=job.components,
            )
        result.status = "compiled" if source in ("compiled", "uncached") else "cached"
        result.neff_bytes = len(files[NEFF_FILE])
    except Exception as e:  # recorded in the report; the negative entry is already written
        result.status = {"NC402": "cached-failure", "NC523": "timeout"}.get(
            getattr(e, "code", ""), "failed"
        )
        result.error_code = getattr(e, "code", type(e).__name__)
        result.ncc_code = getattr(e, "ncc_code", None)
        if result.ncc_code is None and result.error_code == "NC402":
            codes = NCC_CODE.findall(getattr(e, "message", "") or "")
            result.ncc_code = codes[0] if codes else None
        result.triage = getattr(e, "triage", None) or (
            triage(result.ncc_code)[0] if result.ncc_code else None
        )
        result.message = str(e).splitlines()[0]
    result.seconds = time.perf_counter() - start
    return result


# -- the compile path of one graph (called by compiler._compile_region for trn targets) --------

_said: set[str] = set()
_said_lock = threading.Lock()


def _say_once(key: str, message: str) -> None:
    with _said_lock:
        if key in _said:
            return
        _said.add(key)
    log.info(message)
    import warnings

    warnings.warn(f"neuron-compile: {message}", UserWarning, stacklevel=4)


def neff_key(
    module_text: str, io_specs: object, *, artifact_form: str, cfg: Any, exe: str, input_name: str
) -> Any:
    """Cache key of a graph's NEFF: the graph key with target, LNC and ``$NEURON_CC_FLAGS``
    (``graph_key``'s own components) plus the compiler version, -O level and input form."""
    from .cache.key import graph_key
    from .targets import get_target

    target = get_target(cfg.target)
    return graph_key(
        module_text,
        io_specs=io_specs,
        artifact_form=artifact_form,
        target=str(target.neuronx_cc_target),
        lnc=str(cfg.lnc),
        flags=os.environ.get(ENV_FLAGS, ""),
    ).extend(
        entry="neff",
        neuronx_cc_version=compiler_version(exe),
        optlevel=str(cfg.optlevel),
        neuronx_cc_input=input_name,
    )


def neff_for_graph(
    text: str,
    io_specs: object,
    *,
    cfg: Any,
    graph_name: str,
    cache_name: str,
    disk: Any,
    device: bool,
) -> bytes | None:
    """NEFF of one lowered graph for ``cfg.target`` (a trn target), or None when none is made.

    - precompile collection (``neuron-compile precompile``): record a job, return None;
    - neuronx-cc present: the cached NEFF, or compile it now (negative entry on failure);
    - no neuronx-cc and no device (compile-only): verify the neuronx-cc input, say once that
      graphs stop there, return None; no neuronx-cc but a device: NC521.
    """
    from . import artifact as artifact_mod
    from . import precompile

    input_name, data = artifact_mod.neuronx_cc_input(text, cfg.artifact)
    exe = find_neuronx_cc()
    if exe is None:
        if device:
            run_neuronx_cc(input_name, data, target=cfg.target, lnc=cfg.lnc, graph_name=graph_name)
        artifact_mod.artifact_text(data, "hlo" if input_name.endswith(".pb") else "bytecode")
        _say_once(
            "no-neuronx-cc",
            f"target {cfg.target} without neuronx-cc: graphs stop after their verified "
            f"artifacts ({input_name}); no NEFF is compiled (set {ENV_PATH} or install the "
            "Neuron SDK); the XLA CPU executor runs them",
        )
        return None
    key = neff_key(
        text, io_specs, artifact_form=cfg.artifact, cfg=cfg, exe=exe, input_name=input_name
    )
    digest = key.digest()
    collect = precompile.collect_dir()
    if collect is not None:
        job = NeffJob(
            graph_name=graph_name,
            key=digest,
            components=key.components(),
            input_name=input_name,
            input_path="",
            target=cfg.target,
            lnc=int(cfg.lnc),
            optlevel=int(cfg.optlevel),
            flags=os.environ.get(ENV_FLAGS, ""),
            cache_name=cache_name,
        )
        entry = disk.get(digest) if disk is not None else None
        cached = len(entry.read(NEFF_FILE)) if entry is not None else 0
        precompile.record_job(collect, job, data, cached_neff_bytes=cached)
        return None
    if not device:
        _say_once(
            "compile-only",
            f"compile-only mode: no Neuron device, graphs are compiled to {cfg.target} NEFFs "
            "into the cache and run on the XLA CPU executor",
        )

    def build() -> dict[str, bytes]:
        neff, tail = run_neuronx_cc(
            input_name,
            data,
            target=cfg.target,
            lnc=int(cfg.lnc),
            optlevel=int(cfg.optlevel),
            flags=os.environ.get(ENV_FLAGS, ""),
            graph_name=graph_name,
            exe=exe,
        )
        return {NEFF_FILE: neff, LOG_FILE: tail.encode()}

    if disk is None:
        return build()[NEFF_FILE]
    files, source = disk.get_or_create(
        digest, build, graph_name=cache_name + ".neff", components=key.components()
    )
    log.debug("graph %s: NEFF from %s", graph_name, source)
    return files[NEFF_FILE]
