"""Compile events: what the backend and the compiler tell metrics, dumps and ``neuron-compile
check`` (``report/collect.py``), instead of calling them or being patched by them.

``publish(event)`` calls every subscriber of the event's type synchronously, in subscription
order, in the compiling thread. A subscriber that raises is logged (a warning the first time,
then at debug level) and never breaks the compile. Two fields are the subscribers' to replace:
``FrameStarted.cfg`` (the config the frame compiles with) and ``FrameCompiled.compiled`` (what
Dynamo calls); ``neuron-compile check`` uses them for its device-time estimate and run mode.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch.fx as fx

    from .config import NeuronConfig
    from .lowering.lower_graph import LoweredGraph
    from .metrics import GraphRecord

log = logging.getLogger(__name__)


@dataclass
class FrameStarted:
    """A Dynamo frame reached the backend; its graphs are named ``{name}_{kind}_{n}``."""

    name: str
    model: str
    gm: fx.GraphModule  # Dynamo's
    example_inputs: Sequence[Any]
    cfg: NeuronConfig  # a subscriber may replace it before the frame compiles
    recompile: bool

    @property
    def where(self) -> str | None:
        """``file:line in function`` of the frame's first op in user code, if known."""
        from .errors import user_frame

        known = (w for w in map(user_frame, self.gm.graph.nodes) if w != "<unknown>")
        return next(known, None)


@dataclass
class FrameCompiled:
    """A Dynamo frame compiled; ``compiled`` is what Dynamo calls (a subscriber may wrap it)."""

    name: str
    gm: fx.GraphModule
    compiled: Any


@dataclass(frozen=True)
class GraphLowered:
    """A region of graph ``graph`` lowered to StableHLO (``name`` is the region's, or the graph's
    own when it has one region; a CPU stand-in ends in ``compiler.STAND_IN``)."""

    graph: str
    name: str
    kind: str
    gm: fx.GraphModule  # after the passes
    lowered: LoweredGraph  # ``lowered.text`` is the module


@dataclass(frozen=True)
class RegionCompiled:
    """A region's artifact and executable are ready (``gm`` is None on an AOT-cache warm start)."""

    graph: str
    name: str
    kind: str
    gm: fx.GraphModule | None
    lowered: LoweredGraph
    artifact: bytes
    cfg: NeuronConfig
    record: GraphRecord  # the graph's, as far as it got


@dataclass(frozen=True)
class GraphCompiled:
    """A graph is runnable: ``runner`` is its CompiledGraph or FallbackRunner; ``path`` is
    ``compile``, or ``aot_cache`` for one loaded by an AOTAutograd cache hit."""

    name: str
    kind: str
    record: GraphRecord  # ``metrics()`` keeps it
    runner: Any
    cfg: NeuronConfig
    gm: fx.GraphModule | None
    path: str = "compile"


@dataclass(frozen=True)
class GraphFailed:
    """Compiling a graph raised ``error`` (which propagates after the event)."""

    name: str
    kind: str
    gm: fx.GraphModule
    cfg: NeuronConfig
    error: BaseException


_lock = threading.Lock()
_subscribers: tuple[tuple[Callable[[Any], None], tuple[type, ...]], ...] = ()
_warned: set[int] = set()  # ids of subscriptions that failed once (warned)


def subscribe(callback: Callable[[Any], None], *types: type) -> Callable[[], None]:
    """Call ``callback(event)`` for every published event (of ``types``, if given); returns the
    function that unsubscribes it."""
    global _subscribers
    entry = (callback, types)
    with _lock:
        _subscribers = (*_subscribers, entry)

    def unsubscribe() -> None:
        global _subscribers
        with _lock:
            _subscribers = tuple(s for s in _subscribers if s is not entry)
            _warned.discard(id(entry))

    return unsubscribe


@contextlib.contextmanager
def subscribed(callback: Callable[[Any], None], *types: type) -> Iterator[None]:
    """``subscribe`` for the duration of a ``with`` block."""
    unsubscribe = subscribe(callback, *types)
    try:
        yield
    finally:
        unsubscribe()


def publish(event: Any) -> None:
    """Deliver ``event`` to its subscribers, in order; their exceptions are logged, not raised."""
    for entry in _subscribers:
        callback, types = entry
        if types and not isinstance(event, types):
            continue
        try:
            callback(event)
        except Exception:
            with _lock:
                first = id(entry) not in _warned
                _warned.add(id(entry))
            (log.warning if first else log.debug)(
                "compile event subscriber %r failed on %s",
                callback,
                type(event).__name__,
                exc_info=True,
            )
