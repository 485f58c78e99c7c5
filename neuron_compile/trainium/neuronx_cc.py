"""Driver for AWS's Neuron compiler ``neuronx-cc``: find it, build its command, run it, triage it.

The command is TorchNeuron's (``docs/trainium-reference.md`` §R5)::

    neuronx-cc compile <work>/module.mlir --framework XLA --target <trn2|trn3> --lnc <1|2> -O<k>
        --model-type transformer --auto-cast=none <$NEURON_CC_FLAGS> --output <work>/model.neff

with ``module.hlo.pb`` (an ``HloModuleProto``) instead of ``module.mlir`` (StableHLO bytecode)
under ``artifact="hlo"``. User flags come last, so they override ours where neuronx-cc lets the
last occurrence win. It runs in a fresh work directory with a timeout, its output streams to
this module's logger at DEBUG, and a failure becomes ``NeuronxCcError`` (NC522) carrying the
first ``NCC_*`` code and its triage class (``triage.py``, §R7); a timeout is ``NeuronxCcTimeout``
(NC523).

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

from ..cache.binding import NEFF_FILE
from .triage import triage_class

log = logging.getLogger(__name__)

ENV_PATH = "NEURON_COMPILE_NEURONX_CC"
ENV_TIMEOUT = "NEURON_COMPILE_NEURONX_CC_TIMEOUT"
ENV_FLAGS = "NEURON_CC_FLAGS"
DEFAULT_TIMEOUT = 7200.0
LOG_FILE = "neuronx-cc.log"

#: ``NCC_`` + E(rror)/I(nternal) + 3-letter class + 3 digits; older logs print ``[TEN404]``.
NCC_CODE = re.compile(r"NCC_[EI][A-Z]{3}\d{3}")
_VERSION = re.compile(r"\d+\.\d+(?:\.\d+)*(?:[+.\-][\w.]+)?")


def find_neuronx_cc() -> str | None:
    """``$NEURON_COMPILE_NEURONX_CC`` if set (an executable file), else ``neuronx-cc`` on PATH."""
    explicit = os.environ.get(ENV_PATH, "").strip()
    if explicit:
        return explicit if os.path.isfile(explicit) and os.access(explicit, os.X_OK) else None
    return shutil.which("neuronx-cc")


def not_found_reason() -> str:
    """Why ``find_neuronx_cc()`` found nothing, and what to do, for messages."""
    explicit = os.environ.get(ENV_PATH, "").strip()
    if explicit:
        return f"{ENV_PATH}={explicit!r} is not an executable file: point it at neuronx-cc"
    return (
        f"neuronx-cc is not on PATH: install the Neuron SDK (neuronx-cc is on AWS's pip "
        f"repository, not PyPI) or set {ENV_PATH} to its path"
    )


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
    from .. import errors  # lazy: errors imports torch.fx

    exe = exe or find_neuronx_cc()
    if exe is None:
        raise errors.NeuronxCcNotFound(
            f"neuronx-cc is needed to compile graph {graph_name} for {target}",
            hint=not_found_reason(),
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
            klass, action = triage_class(code)
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
        from ..cache.tiers import disk_cache

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
            triage_class(result.ncc_code)[0] if result.ncc_code else None
        )
        result.message = str(e).splitlines()[0]
    result.seconds = time.perf_counter() - start
    return result


# -- the compile path of one graph (called by compiler._compile_region for trn targets) --------
