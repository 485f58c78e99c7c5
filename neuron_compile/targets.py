"""Compilation targets: what the core asks of one, the ``cpu`` target, and how the others are found.

The core (backend, compiler, lowering, passes, cache, runtime) never names a target. It asks the
``Target`` of the config for everything that differs between targets: which lowering forms win
over the reference rules, which passes run, what to check before compiling, how to compile and
what the graph runs on. In the base class every hook is a no-op, and the graph runs on XLA's CPU
client; the ``cpu`` target is that, plus the ATen ops it keeps whole (``CpuTarget``).

Other targets are plugins, found through the ``neuron_compile.targets`` entry-point group (one
entry per target name, ``pyproject.toml``); their package is imported only when one of them is
chosen. Auto-detection asks the ``neuron_compile.device_probes`` group: each probe is a function
that imports nothing but the standard library and returns the local device's target name or
None. See ``docs/adding-a-target.md``.

Target selection (``resolve_target``): ``options={"target": ...}`` > ``NEURON_COMPILE_TARGET`` >
auto-detect (a probe that finds its device) > ``cpu``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from .cpu import CPU_KEY

if TYPE_CHECKING:
    import torch.fx as fx

    from .config import NeuronConfig
    from .lowering.lower_graph import LoweredGraph
    from .passes.base import GraphPass

log = logging.getLogger(__name__)

TARGET_GROUP = "neuron_compile.targets"
PROBE_GROUP = "neuron_compile.device_probes"


@dataclass(frozen=True)
class CompileJob:
    """One lowered graph on its way to an executable (``Target.compile``)."""

    gm: fx.GraphModule
    lowered: LoweredGraph
    cfg: NeuronConfig
    graph_name: str
    cache_name: str  # the graph's name in cache entries and dumps


@dataclass(frozen=True)
class Target:
    """A compilation target. Its hooks are the defaults: the graph runs on XLA's CPU client."""

    name: str = "cpu"
    #: Registry keys whose rules win over the reference rule for this target, in lookup order
    #: (``lowering/registry.py``). Empty: reference rules only.
    lowering_keys: tuple[str, ...] = ()
    #: Logical-core configs the ``lnc`` option accepts.
    lnc_choices: tuple[int, ...] = (1, 2)
    #: Whether graphs may be served from the FX index and AOTAutogradCache, which skip lowering.
    #: False for targets whose checks need the lowered graph on every compile.
    skips_lowering_when_cached: bool = True
    #: Whether a backward that reads a view of a parameter (a Linear's transposed weight) is
    #: handed the parameter and replays the view, instead of the forward returning a copy of the
    #: view (``saved_views.py``). It changes both graphs' interfaces.
    saves_parameters_for_views: bool = True

    def resolve_lnc(self, lnc: int | None) -> int | None:
        """The logical-core config graphs are compiled for (None: not meaningful here)."""
        return lnc

    def default_estimate(self) -> str:
        """The ``estimate`` option's default: a target name whose cost model to run, or ``off``."""
        return "off"

    def kept_ops(self) -> Iterable[Any]:
        """ATen ops that AOTAutograd must not decompose, because this target's lowering forms
        want them whole."""
        return ()

    def pipeline(self, core: tuple[GraphPass, ...]) -> tuple[GraphPass, ...]:
        """The passes run before lowering: the core pipeline plus this target's own."""
        return core

    def frame_routing(self, cfg: NeuronConfig) -> contextlib.AbstractContextManager[Any]:
        """A context entered while a frame is traced (AOTAutograd in the backend, ``make_fx`` in
        the bucket planner): it routes ops to this target's kernels (e.g. attention to a flash
        kernel) and picks the SDPA path. Default: eager's own kernel choice, whose ops the core
        lowers (``lowering/stablehlo/attention.py``)."""
        return contextlib.nullcontext()

    def prepare_frame(self, gm: fx.GraphModule, cfg: NeuronConfig) -> None:
        """Rewrite a Dynamo graph before AOTAutograd traces it (the same routing, on a graph)."""

    def check(self, job: CompileJob) -> None:
        """Raise what this target's compiler would reject, before any artifact exists."""

    def compile(self, job: CompileJob) -> Any | None:
        """An executable for ``job`` on this target's device, or None: XLA's CPU client runs the
        graph (its own module, or, if it holds this target's kernel calls, the same FX graph
        lowered for ``cpu``: the CPU stand-in)."""
        return None

    def executable_tag(self, cfg: NeuronConfig) -> str | None:
        """Distinguishes executables built from one module for different device configs in the
        in-memory executable cache (None: the module decides alone)."""
        return None

    def estimate(self, module_text: str, lnc: int | None) -> float | None:
        """Estimated device seconds of one module (the ``estimate`` option), None if unknown."""
        raise NotImplementedError(f"target {self.name} has no cost model")

    def diagnostics(self, text: str) -> list[Any]:
        """This target compiler's diagnostics found in an error's text or log, triaged
        (``report.model.NccDiagnostic``s), for CI reports."""
        return []


@dataclass(frozen=True)
class CpuTarget(Target):
    """The ``cpu`` target: the base hooks, and the ATen ops it keeps whole (``cpu/kept_ops.py``)."""

    def kept_ops(self) -> Iterable[Any]:
        from .cpu.kept_ops import KEPT_OPS

        return KEPT_OPS


CPU = CpuTarget(lowering_keys=(CPU_KEY,))


def _entries(group: str) -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=group)}


@functools.cache
def target_names() -> tuple[str, ...]:
    """Every installed target's name, ``cpu`` first (no plugin is imported)."""
    return ("cpu", *sorted(n for n in _entries(TARGET_GROUP) if n != "cpu"))


def target_choices() -> tuple[str, ...]:
    """What the ``target`` option accepts: ``auto`` (detect a device, else cpu) or a name."""
    return ("auto", *target_names())


@functools.cache
def get_target(name: str) -> Target:
    """The ``Target`` named ``name``; KeyError for a name no installed target has."""
    if name == "cpu":
        from .cpu import lowering, pooling, scans  # noqa: F401  (the cpu target's own forms)

        return CPU
    entry = _entries(TARGET_GROUP).get(name)
    if entry is None:
        raise KeyError(name)
    target = entry.load()
    if not isinstance(target, Target) or target.name != name:
        raise TypeError(f"entry point {entry.value} is not the Target {name!r}")
    return target


def _probes() -> list[Callable[[], str | None]]:
    return [ep.load() for ep in _entries(PROBE_GROUP).values()]


def detect_target() -> str:
    """The target of a local device a probe finds, else ``cpu``."""
    override = os.environ.get("NEURON_COMPILE_DETECTED_TARGET")  # tests of detection only
    if override:
        return override
    for probe in _probes():
        found = probe()
        if found is not None and found in target_names():
            return found
    return "cpu"


def resolve_target(name: str | None) -> str:
    """``auto``/None -> ``detect_target()``; otherwise ``name`` (validated by the config)."""
    return detect_target() if name in (None, "", "auto") else name
