"""``neuron_compile.eager_frames()``: ``torch.compile``'d frames that ran without reaching the
backend.

Dynamo skips a whole frame when it meets something it cannot trace and cannot break the graph
around (``nn.GRU`` without ``torch._dynamo.config.allow_rnn``, a graph break inside a block it
cannot resume): the frame then runs eagerly, prints nothing and compiles nothing. On Trainium
that code runs on the host CPU, so it is worth knowing.

Source of truth: Dynamo's own record of each frame it tried to convert,
``torch._dynamo.utils.get_compilation_metrics()`` (``CompilationMetrics``: the code's name, file
and first line, ``fail_type``/``fail_reason``, ``has_guarded_code``, ``graph_op_count``). That
deque keeps only the last 64 frames, so its new entries are copied here whenever Dynamo starts or
ends a compile (``torch._dynamo.callback``; ``torch._dynamo.reset()`` drops those callbacks, so
they are re-registered whenever a frame reaches our backend), and whenever records are read.
Nothing is patched.

Counted: a frame Dynamo gave up on with a soft failure (``Unsupported``/``UserError``, which
Dynamo always turns into "run this frame eagerly"), or with any other error it suppressed
(``torch._dynamo.config.suppress_errors``), that never compiled a graph otherwise. Not counted:
frames Dynamo skips without trying (dynamo-disabled hooks such as FSDP2's, skipfiles), frames with
no tensor work (resume functions with no content), compile errors of the backend (those are
errors, reported as such), and frames in torch or neuron_compile themselves.
"""

from __future__ import annotations

import ast
import collections
import functools
import linecache
import re
import sys
import threading
from dataclasses import dataclass
from typing import Any

from .warn_once import is_library_file

_lock = threading.Lock()
#: code key (file, first line, name) -> its record, in the order the frames ran
_FRAMES: dict[tuple[str, int, str], EagerFrame] = {}
#: code keys that compiled a graph (a frame that reached the backend at least once)
_COMPILED: set[tuple[str, int, str]] = set()
#: the CompilationMetrics objects already read; holding them keeps their ``id``s unique
_SEEN: collections.deque = collections.deque(maxlen=256)
_SOFT_FAILURES = ("Unsupported", "UserError")
_RESUME_RE = re.compile(r"^torch_dynamo_resume_in_(?P<name>.+)_at_(?P<line>\d+)$")
#: substrings of Dynamo's reason -> what the user can do about it
_FIXES = (("allow_rnn", "set torch._dynamo.config.allow_rnn = True before compiling"),)


@dataclass(frozen=True)
class EagerFrame:
    """A ``torch.compile``'d frame that ran and compiled zero graphs: it ran eagerly."""

    function: str  # ``TextClassifier.forward``; ``forward`` when the source cannot be read
    file: str
    line: int  # the frame's first line (its ``def``, or the line a resumed frame starts at)
    reason: str  # Dynamo's reason, one line
    fix: str | None  # how to make Dynamo compile it, when known
    #: ``file:line`` of the user code Dynamo gave up at (inside the frame or a function it
    #: calls), when Dynamo recorded it
    failed_at: str | None = None

    def __str__(self) -> str:
        return f"{self.function} at {self.file}:{self.line} ran eagerly: {self.reason}" + (
            f"; fix: {self.fix}" if self.fix else ""
        )


@functools.lru_cache(maxsize=64)
def _functions(file: str) -> tuple[tuple[str, str, int, int, int], ...]:
    """``(name, qualname, first_line, def_line, end_line)`` of every function in ``file``."""
    try:
        tree = ast.parse("".join(linecache.getlines(file)))
    except (SyntaxError, ValueError):
        return ()
    out: list[tuple[str, str, int, int, int]] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                first = min([d.lineno for d in child.decorator_list] + [child.lineno])
                qual = prefix + child.name
                out.append((child.name, qual, first, child.lineno, child.end_lineno or 0))
                walk(child, f"{qual}.<locals>.")
            else:
                walk(child, prefix)

    walk(tree, "")
    return tuple(out)


def _function_name(co_name: str, file: str, line: int) -> str:
    """The qualified name of the code at ``file:line`` (read from its source), else ``co_name``.
    A Dynamo resume function is named after the function it continues."""
    resumed = _RESUME_RE.match(co_name)
    if resumed:
        name, at = resumed["name"], int(resumed["line"])
        qual = next((q for n, q, _, d, e in _functions(file) if n == name and d <= at <= e), name)
        return f"{qual} (after the graph break at line {at})"
    return next(
        (q for n, q, first, d, _ in _functions(file) if n == co_name and line in (first, d)),
        co_name,
    )


def _reason(fail_type: str, fail_reason: str) -> str:
    """Dynamo's reason in one line: its first line and its ``Explanation:``."""
    lines = [ln.strip() for ln in fail_reason.splitlines() if ln.strip()]
    if not lines:
        return fail_type
    explanation = next(
        (ln.removeprefix("Explanation:").strip() for ln in lines if ln.startswith("Explanation:")),
        "",
    )
    head = lines[0].rstrip(".")
    text = f"{head} ({explanation.rstrip('.')})" if explanation else head
    return text if len(text) <= 240 else text[:237] + "..."


def _fix(fail_reason: str) -> str | None:
    return next((fix for needle, fix in _FIXES if needle in fail_reason), None)


def _counts(m: Any) -> bool:
    """Whether Dynamo's record ``m`` is a frame it gave up on and ran eagerly."""
    if m.has_guarded_code or not m.fail_type or m.co_name is None or m.is_forward is False:
        return False
    if m.fail_type not in _SOFT_FAILURES and not (
        m.config_suppress_errors and not _backend_error(m.fail_type)
    ):
        return False  # the error reached the user: the frame did not run
    return not is_library_file(m.co_filename or "")


def _backend_error(fail_type: str) -> bool:
    """A backend failure as Dynamo records it: its wrapper's name, or one of our errors' (they
    leave the backend unwrapped, errors.through_dynamo)."""
    from . import errors

    cls = getattr(errors, fail_type, None)
    return fail_type == "BackendCompilerFailed" or (
        isinstance(cls, type) and issubclass(cls, errors.NeuronCompileError)
    )


def harvest() -> None:
    """Read Dynamo's compilation records made since the last call (cheap; idempotent)."""
    try:
        from torch._dynamo.utils import get_compilation_metrics
    except ImportError:  # pragma: no cover - torch without Dynamo
        return
    _ensure_callbacks()
    try:
        records = get_compilation_metrics()
    except RuntimeError:  # another thread appended while the deque was copied: read it next time
        return
    with _lock:
        seen = {id(m) for m in _SEEN}
        for m in records:
            if id(m) in seen:
                continue
            _SEEN.append(m)
            key = (m.co_filename or "", m.co_firstlineno or 0, m.co_name or "")
            if m.has_guarded_code and m.graph_op_count:
                _COMPILED.add(key)
            if key in _FRAMES or not _counts(m):
                continue
            reason = m.fail_reason or ""
            _FRAMES[key] = EagerFrame(
                function=_function_name(key[2], key[0], key[1]),
                file=key[0],
                line=key[1],
                reason=_reason(m.fail_type, reason),
                fix=_fix(reason),
                failed_at=(
                    f"{m.fail_user_frame_filename}:{m.fail_user_frame_lineno}"
                    if m.fail_user_frame_filename and m.fail_user_frame_lineno
                    else None
                ),
            )


def _on_compile(_args: Any = None) -> None:
    try:
        harvest()
    except Exception:  # never let bookkeeping break a compile
        pass


def _ensure_callbacks() -> None:
    """Register ``_on_compile`` with Dynamo's compile callbacks unless it still is
    (``torch._dynamo.reset()`` clears them)."""
    import torch._dynamo

    handler = torch._dynamo.callback_handler
    if _on_compile not in handler.start_callbacks:
        torch._dynamo.callback.on_compile_start(_on_compile)
    if _on_compile not in handler.end_callbacks:
        torch._dynamo.callback.on_compile_end(_on_compile)


def eager_frames() -> list[EagerFrame]:
    """Frames ``torch.compile`` ran eagerly since the last ``reset_metrics()``, oldest first:
    Dynamo skipped them, so no graph of theirs reached the backend (on Trainium they run on the
    host CPU). Each names the function, its ``file:line``, Dynamo's reason and the fix if known.
    Empty when every compiled frame produced at least one graph; an ordinary graph break does
    not count (see ``torch._dynamo.explain`` / ``TORCH_LOGS=graph_breaks`` for those)."""
    harvest()
    with _lock:
        return [f for key, f in _FRAMES.items() if key not in _COMPILED]


def reset_eager_frames() -> None:
    """Forget the frames recorded so far (``reset_metrics()``); Dynamo's earlier records stay
    read, so they do not come back."""
    harvest()
    with _lock:
        _FRAMES.clear()
        _COMPILED.clear()


def _on_frame_started(_event: Any) -> None:
    _on_compile()  # re-registers the callbacks after a torch._dynamo.reset()


def _install() -> None:
    from . import events

    events.subscribe(_on_frame_started, events.FrameStarted)
    # Importing Dynamo costs about 0.7 s, which `import neuron_compile` (and the CLI) must not
    # pay: without it loaded, the first harvest registers the callbacks, and until then the
    # records wait in Dynamo's deque.
    if "torch._dynamo" in sys.modules:
        try:
            _ensure_callbacks()
        except Exception:  # an older or newer Dynamo without callbacks: read records when asked
            pass


_install()
