"""Warm starts that skip AOTAutograd tracing: PyTorch's AOTAutogradCache carrying our graphs.

Our disk cache makes a warm start skip lowering, verify and the XLA compile, but Dynamo's graph
still goes through AOTAutograd (functionalization, joint tracing, partitioning): ~0.9 s of a
TinyGPT first step. PyTorch's AOTAutogradCache (``torch/_functorch/_aot_autograd/
autograd_cache.py``) skips that for any backend whose forward compiler is a
``SerializableAOTDispatchCompiler`` returning ``OutputCode`` objects: on a hit it unpickles the
runtime metadata and wrappers it saved, calls ``OutputCode.post_compile`` on the forward and the
backward, and wraps them exactly as a traced compile would.

``NeuronOutputCode`` is our ``OutputCode``. Its pickled form is small and holds no executable,
no constant and no weight: the graph's FX index key (cache/fx_index.py), its graph key, its kind
and node count, and for a forward/backward pair the saved-activation plan (saved.py). Loading
reads the FX index entry from our disk cache and rebuilds the ``CompiledGraph`` through the same
tiers as any warm start (``compiler.compile_whole``), then ends as every compiled graph does
(``compiler.finish_graph``: the 64-bit warning, metrics, the ``GraphCompiled`` event). Whatever
fails there (our disk cache emptied, an entry evicted, a changed plan) raises, and
AOTAutogradCache then counts a bypass and traces as usual: a normal compile, which refills our
cache.

The entry's key is AOTAutograd's own (Dynamo graph, input metadata, torch/functorch/Inductor
configs, system) plus ``torch.compiler.config.cache_key_tag``, which we extend while our backend
runs with a digest of the ``NeuronConfig`` and of the toolchain components of our cache keys
(schema, this package's sources, jaxlib/torch versions, target): entries never collide with
Inductor's (whose tag lacks it) nor between two of our configs. Nothing PyTorch hands
``post_compile`` names that key, so each ``NeuronOutputCode`` records the ``frame_key``
(aot_trust.py) of the Dynamo graph it was saved for: a digest of the graph, its arguments and our
tag, which the loading frame recomputes (~1 ms); another frame's entry placed under this key is
refused at load (``GraphRecord.aot_cache_refused`` says why) instead of running its graphs.

AOTAutogradCache saves the entry right after the backward compiler returns, and stores our
``OutputCode`` itself only when ``bundled_autograd_cache`` is on at that moment; a lazily
lowered backward compiles at the first ``backward()``, outside our scope. So inside ``frame``
AOTAutograd lowers the backward eagerly (``force_non_lazy_backward_lowering``, as PyTorch's own
serializable compiles do), and our backward compiler only records the graph and its FX index key
(``defer``): the real compile still happens at the first backward.

Only graphs that can be rebuilt from our cache are stored: CPU target (trn targets run legality
checks on the FX graph and build NEFFs), no ``dump_dir``, fully supported (no CPU-fallback
regions, which run the FX graph), no graph constants, an FX index entry on disk. Any other graph
of the pair makes AOTAutogradCache bypass the save (``BypassAOTAutogradCache``), never fail.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from torch._inductor.output_code import OutputCode

from .aot_trust import directory_is_ours as _directory_is_ours
from .aot_trust import frame_key
from .cache.fx_index import ArgSpec, arg_spec, graph_signature, signature_mismatch
from .config import NeuronConfig
from .lowering.lower_graph import is_effect_token
from .saved import META_KEY, SavedLink, partition_attaching

log = logging.getLogger(__name__)

PAIR_KEY = "neuron_aot_pair"
#: Bumped when NeuronOutputCode's pickled form changes (part of the cache key tag).
#: 2: graphs are traced with unlifted effect tokens and entries record their ``Convention``.
#: 3: entries record the frame key of the Dynamo graph they were saved for (``frame_key``).
FORMAT_VERSION = 3
_TAKES_TOKENS = "graph takes lifted effect tokens (a cache hit would not pass them)"
_UNKEYED = "the frame's Dynamo graph cannot be keyed (aot_trust.frame_key)"
#: Config fields that only name or dump graphs (``dump_dir`` turns the cache off).
_KEY_EXCLUDED = ("model_name", "dump_dir", "extra")


class AotCacheMiss(RuntimeError):
    """An AOTAutograd cache entry whose graphs cannot be rebuilt here; AOTAutograd traces."""


@dataclass(frozen=True)
class Convention:
    """How AOTAutograd calls a compiled graph, recorded when it compiles and checked when a cache
    hit loads it: a loaded runner must take the arguments the cache hit's wrappers pass and
    return what they unpack, or it is refused (AOTAutograd then traces and compiles again).

    ``tokens`` counts inputs that are lifted effect tokens: the cold path's
    ``EffectTokensWrapper`` passes them, the cache-hit path rebuilds no such wrapper, so a graph
    that takes one can never be called alike from both (backend traces with unlifted tokens).
    ``flat`` says the inputs are the frame's own arguments one for one (no deduplicated or
    synthetic-base arguments, no RNG state), so a forward or inference hit can compare them with
    the arguments it is loaded for."""

    inputs: tuple[ArgSpec, ...]
    outputs: int
    tokens: int
    flat: bool

    @staticmethod
    def of(gm: fx.GraphModule, frame_args: tuple[ArgSpec, ...] | None) -> Convention:
        inputs, outputs = graph_signature(gm)
        tokens = sum(map(is_effect_token, gm.graph.find_nodes(op="placeholder")))
        return Convention(inputs, outputs, tokens, frame_args is not None and inputs == frame_args)

    def mismatch(self, lowered: Any, kind: str, loaded_with: Sequence[Any]) -> str | None:
        """Why a runner built from ``lowered`` (the FX index entry's specs) cannot be called as
        this convention says, or by a cache hit loaded with ``loaded_with``; None if it can."""
        if self.tokens:
            return _TAKES_TOKENS
        why = signature_mismatch(self.inputs, self.outputs, lowered)
        if why is not None:
            return why
        if kind != "backward" and self.flat:
            got = tuple(arg_spec(a) for a in loaded_with)
            if got != self.inputs:
                return "the cache hit's arguments differ from the graph's inputs"
        return None


@dataclass
class AotPair:
    """Shared by the forward and backward graph of one partition (``gm.meta[PAIR_KEY]``) and,
    pickled once, by their two ``NeuronOutputCode``s in the cache entry."""

    num_fwd_outputs: int
    #: Saved indices the forward kept resident when it compiled (SavedLink.resident).
    resident: tuple[int, ...] = ()
    #: FX index keys of both graphs, so loading the forward checks the backward's entry too.
    fx_keys: list[str] = field(default_factory=list)

    def __deepcopy__(self, memo: dict) -> AotPair:
        return self  # AOTAutograd deep-copies the backward graph (and its meta) before compiling


def partition_with_pair(partition_fn: Any) -> Any:
    """Wrap an AOTAutograd ``partition_fn`` to attach one ``AotPair`` to both graphs."""
    return partition_attaching(partition_fn, PAIR_KEY, AotPair)


def cache_tag(cfg: NeuronConfig) -> str:
    """Our part of ``torch.compiler.config.cache_key_tag``: backend, config and toolchain."""
    from .cache.key import environment_components

    options = {
        f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name not in _KEY_EXCLUDED
    }
    payload = json.dumps(
        {
            "backend": "neuron_compile",
            "format": FORMAT_VERSION,
            "options": options,
            **environment_components(cfg.artifact, target=cfg.target, lnc=str(cfg.lnc)),
        },
        sort_keys=True,
        default=str,
    )
    return "neuron_compile-" + hashlib.sha256(payload.encode()).hexdigest()[:32]


def enabled(cfg: NeuronConfig) -> bool:
    """Whether this config's graphs go through AOTAutogradCache (see the module docstring)."""
    from torch._functorch._aot_autograd.autograd_cache import should_use_local_autograd_cache

    from .cache.tiers import disk_cache
    from .targets import get_target

    return (
        cfg.aot_cache
        and not cfg.dump_dir
        and get_target(cfg.target).skips_lowering_when_cached
        and should_use_local_autograd_cache()
        and disk_cache() is not None
        and _directory_is_ours()
    )


@dataclass
class _Frame:
    """What loading needs from the ``compile_frame`` call it happens in."""

    cfg: NeuronConfig
    next_name: Callable[[str], str]
    start: float
    recompile: bool
    #: ``arg_spec`` of each argument AOTAutograd got from Dynamo (``Convention.flat``).
    args: tuple[ArgSpec, ...] = ()
    #: Why a cache hit of this frame was refused at load ("" if none was).
    refused: str = ""
    #: ``frame_key`` of the Dynamo graph (None: not keyed, so nothing stored nor loaded).
    key: str | None = None
    #: Seconds spent computing ``key``, charged to the first graph record of the frame.
    key_s: float = 0.0

    def charge_key_time(self) -> float:
        """``key_s`` the first time, 0 afterwards."""
        spent, self.key_s = self.key_s, 0.0
        return spent


_local = threading.local()


@contextlib.contextmanager
def frame(
    cfg: NeuronConfig,
    next_name: Callable[[str], str],
    start: float,
    recompile: bool,
    args: Sequence[Any] = (),
    gm: fx.GraphModule | None = None,
) -> Iterator[None]:
    """Around one AOTAutograd call with our compilers for the Dynamo graph ``gm``: tag the
    cache key with our config, make AOTAutogradCache store our OutputCode itself (bundled), key
    the frame (``frame_key``; without ``gm`` nothing is stored nor loaded), and tell
    ``post_compile`` how to name and record what it loads."""
    import torch._functorch.config as functorch_config

    user_tag = torch.compiler.config.cache_key_tag
    tag = cache_tag(cfg) + (f"|{user_tag}" if user_tag else "")
    partitions = _collective_partitions(gm) if gm is not None else []
    if partitions:  # one entry per world size and layout, not one overwriting the other
        tag += "|groups=" + hashlib.sha256(repr(partitions).encode()).hexdigest()[:16]
    previous = getattr(_local, "frame", None)
    ctx = _Frame(cfg, next_name, start, recompile, tuple(arg_spec(a) for a in args))
    if gm is not None:
        t0 = time.perf_counter()
        ctx.key = frame_key(gm, args, tag, cfg.artifact)
        ctx.key_s = time.perf_counter() - t0
    _local.frame = ctx
    try:
        with (
            torch.compiler.config.patch(cache_key_tag=tag),
            # The entry is saved right after the backward "compiles", with the config of that
            # moment: have AOTAutograd call our backward compiler now, inside this scope. It
            # only records the graph (``defer``); the real compile stays at the first backward.
            functorch_config.patch(
                bundled_autograd_cache=True, force_non_lazy_backward_lowering=True
            ),
            _without_inductor_backend_registration(),
        ):
            yield
    finally:
        _local.frame = previous


def _collective_partitions(gm: fx.GraphModule) -> list[object]:
    """The partition each collective of ``gm`` and its nested graphs reduces over now. A group is
    named by a per-process counter ("0" is the world at any size), so the same Dynamo graph at
    another world size or DeviceMesh layout reduces over other ranks: an entry saved for one must
    not serve the other (the frame key, made with the tag, tells them apart too)."""
    from .collectives import graph_replica_groups

    return [
        groups
        for module in gm.modules()
        if isinstance(module, fx.GraphModule)
        for groups in graph_replica_groups(module)
    ]


def refused_reason() -> str:
    """Why the current frame's AOTAutogradCache hit was refused at load, or ""."""
    ctx: _Frame | None = getattr(_local, "frame", None)
    return ctx.refused if ctx is not None else ""


def _frame_args() -> tuple[ArgSpec, ...] | None:
    ctx: _Frame | None = getattr(_local, "frame", None)
    return ctx.args if ctx is not None else None


def _frame_key() -> str | None:
    ctx: _Frame | None = getattr(_local, "frame", None)
    return ctx.key if ctx is not None else None


@contextlib.contextmanager
def _without_inductor_backend_registration() -> Iterator[None]:
    """AOTAutogradCache's key (``FxGraphHashDetails``) first registers Inductor's device code
    generators to hash their custom passes: an import of Inductor's codegen worth ~0.75 s, as
    long as the AOTAutograd tracing the cache saves. None of it affects our graphs, so inside our
    scope registration is skipped; the key still hashes whatever is already registered (the same
    in every process that has not run Inductor), and Inductor registers for itself when it runs.
    """
    import torch._inductor.codecache as codecache

    real = getattr(codecache, "init_backend_registration", None)
    if real is None:  # another torch: nothing to skip
        yield
        return
    codecache.init_backend_registration = lambda: None
    try:
        yield
    finally:
        codecache.init_backend_registration = real


class NeuronOutputCode(OutputCode):
    """A compiled graph as AOTAutograd's cache sees it: the runner, plus how to find it again."""

    def __init__(
        self,
        runner: Any,
        kind: str,
        pair: AotPair | None,
        reason: str | None,
        convention: Convention,
        *,
        fx_key: str | None = None,
        node_count: int = 0,
        pending: Callable[[], Any] | None = None,
        frame_key: str | None = None,
    ) -> None:
        super().__init__()
        self._boxed_call = True
        self._fx_graph_cache_key = None  # not in Inductor's FX graph cache
        self._fx_graph_cache_debug_lines = None
        record = getattr(runner, "record", None)
        self._time_taken_ns = int(1e9 * getattr(record, "backend_s", 0.0))
        self.runner = runner
        self.pending = pending  # the deferred compile of a backward graph
        self.kind = kind
        self.pair = pair
        self.reason = reason  # why this graph cannot be stored, or None
        self.convention = convention
        self.fx_key: str | None = getattr(runner, "fx_key", fx_key)
        #: The graph key, checked against the FX index entry at load (None: deferred backward).
        self.graph_key: str | None = getattr(record, "cache_key", None)
        self.node_count: int = getattr(record, "node_count", node_count)
        #: The ``frame_key`` of the Dynamo graph this was compiled for, checked at load.
        self.frame_key = frame_key

    def __call__(self, args: list[Any]) -> Any:
        if self.runner is None:  # a deferred backward's first call
            self._compile_now()
        return self.runner(args)

    def _compile_now(self) -> None:
        pending, self.pending = self.pending, None
        if pending is None:
            raise AotCacheMiss(f"{self.kind} graph was never compiled nor loaded")
        self.runner = pending()
        if getattr(self.runner, "fx_key", None) != self.fx_key and self.reason is None:
            log.warning(  # the stored entry then misses our cache at load and traces again
                "%s graph: FX index key changed between AOTAutograd's save and the compile",
                self.kind,
            )

    # Pickling: AOTAutogradCache pickles a shallow copy after prepare_for_serialization().
    def prepare_for_serialization(self) -> None:
        if self.reason is not None:
            from torch._functorch._aot_autograd.autograd_cache import BypassAOTAutogradCache

            raise BypassAOTAutogradCache(f"neuron_compile: {self.reason}")
        self.runner = self.pending = None

    def __getstate__(self) -> dict[str, Any]:  # never the runner: copy() and pickle use this
        return {
            "reason": self.reason,
            "kind": self.kind,
            "pair": self.pair,
            "convention": self.convention,
            "fx_key": self.fx_key,
            "graph_key": self.graph_key,
            "node_count": self.node_count,
            "time_taken_ns": self._time_taken_ns,
            "frame_key": self.frame_key,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init_loaded(**state)

    def __init_loaded(
        self,
        reason: str | None,
        kind: str,
        pair: AotPair | None,
        convention: Convention,
        fx_key: str,
        graph_key: str | None,
        node_count: int,
        time_taken_ns: int,
        frame_key: str | None,
    ) -> None:
        self._boxed_call = True
        self._fx_graph_cache_key = None
        self._fx_graph_cache_debug_lines = None
        self._time_taken_ns = time_taken_ns
        self.runner = self.pending = None
        self.kind, self.pair, self.reason, self.convention = kind, pair, reason, convention
        self.fx_key, self.graph_key, self.node_count = fx_key, graph_key, node_count
        self.frame_key = frame_key

    def post_compile(self, example_inputs: Any, constants: Any, graph_kwargs: Any) -> None:
        """A cache hit: rebuild the runner from our disk cache (raises ``AotCacheMiss``)."""
        if self.runner is not None or self.pending is not None:
            return
        if self.reason is not None:  # never stored; defensive
            raise AotCacheMiss(self.reason)
        self.runner = _load(self, example_inputs)

    def set_triton_bundle(self, triton_bundle: Any) -> None:
        pass


def wrap(runner: Any, gm: fx.GraphModule, kind: str, cfg: NeuronConfig) -> NeuronOutputCode:
    """Our compiler's result for ``gm`` as an ``OutputCode`` (every graph must be one while the
    forward compiler is serializable), marked uncacheable with the reason when it is."""
    if kind == "forward":
        _declare_no_donated_buffers()
    pair = gm.meta.get(PAIR_KEY)
    convention = Convention.of(gm, _frame_args())
    reason = _why_not_stored(runner, convention)
    key = _frame_key()
    if reason is None and key is None:
        reason = _UNKEYED
    ctx: _Frame | None = getattr(_local, "frame", None)
    record = getattr(runner, "record", None)
    if ctx is not None and record is not None:
        record.backend_s += ctx.charge_key_time()
    if pair is not None:
        if reason is None:
            pair.fx_keys.append(runner.fx_key)
        if kind == "forward":
            link: SavedLink | None = gm.meta.get(META_KEY)
            pair.resident = tuple(link.resident) if link is not None else ()
    return NeuronOutputCode(runner, kind, pair, reason, convention, frame_key=key)


def _why_not_stored(runner: Any, convention: Convention) -> str | None:
    """Why a compiled graph cannot be rebuilt from our cache by a cache hit, or None."""
    from .cache.tiers import disk_cache
    from .compiled_graph import CompiledGraph

    if convention.tokens:  # no cache hit could call it as it was compiled (``Convention``)
        return _TAKES_TOKENS
    if not isinstance(runner, CompiledGraph):
        return "graph has CPU-fallback regions"
    if runner.fx_key is None:
        return "graph has no FX index key"
    if any(s.attr for s in runner.lowered.inputs):
        return "graph has constants"
    disk = disk_cache()
    if disk is None or disk.get(runner.fx_key, count=False) is None:
        return "graph's FX index entry is not on disk"
    return None


def _declare_no_donated_buffers() -> None:
    """Tell AOTAutograd that our backward reuses no saved tensor's buffer (it never does).

    AOTAutograd lists "donated" saved tensors in ``fw_metadata.bw_donated_idxs`` for the
    backward compiler to reuse (Inductor reads it from ``TracingContext.fw_metadata``, where we
    write). A lazily lowered backward clears the list when its first call retains the graph; an
    eagerly lowered one (``frame``) cannot, so with a non-empty list ``backward(retain_graph=
    True)`` raises (torch/_functorch/_aot_autograd/runtime_wrappers.py, ``_backward_impl``). The
    list is empty when the forward compiles, the backward and the cache entry are made after."""
    context = torch._guards.TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None)
    if meta is not None and meta.bw_donated_idxs:
        meta.bw_donated_idxs = []


def defer(
    gm: fx.GraphModule, kind: str, cfg: NeuronConfig, compile_now: Callable[[str | None], Any]
) -> NeuronOutputCode:
    """A backward graph: AOTAutograd calls our compiler right after the forward so the entry can
    be saved, but the compile itself waits for the first backward, as without the cache (so a
    forward-only run compiles nothing more, and metrics and errors come when they used to).
    The entry refers to the graph by its FX index key, computed now; the graph's own checks
    (``wrap``) are made conservatively on the unpassed graph."""
    from .compiler import fx_index_key
    from .partition import is_fully_supported

    pair = gm.meta.get(PAIR_KEY)
    fx_key = fx_index_key(gm, cfg)
    convention = Convention.of(gm, None)
    key = _frame_key()
    reason = None
    if key is None:
        reason = _UNKEYED
    elif convention.tokens:
        reason = _TAKES_TOKENS
    elif fx_key is None:
        reason = "graph has no FX index key"
    elif any(n.op == "get_attr" for n in gm.graph.nodes):
        reason = "graph has constants"
    elif not is_fully_supported(gm):
        reason = "graph has CPU-fallback regions"
    if pair is not None and reason is None:
        pair.fx_keys.append(fx_key)
    node_count = len(gm.graph.nodes)
    return NeuronOutputCode(
        None,
        kind,
        pair,
        reason,
        convention,
        fx_key=fx_key,
        node_count=node_count,
        pending=lambda: compile_now(fx_key),  # the key is hashed once (~15 ms on TinyGPT)
        frame_key=key,
    )


def _load(code: NeuronOutputCode, loaded_with: Sequence[Any]) -> Any:
    from .cache.binding import INDEX_FILE
    from .cache.fx_index import load_index
    from .cache.tiers import disk_cache
    from .compiler import compile_whole, finish_graph
    from .metrics import GraphRecord

    ctx: _Frame | None = getattr(_local, "frame", None)
    if ctx is None:
        raise AotCacheMiss("loaded outside neuron_compile's backend")
    t0 = time.perf_counter()
    if ctx.key is None or code.frame_key != ctx.key:
        # Another frame's entry under this frame's AOTAutograd key (planted, or copied): its
        # graphs would compute the other model's results. Refused, AOTAutograd traces.
        ctx.refused = f"{code.kind} graph: " + (
            _UNKEYED
            if ctx.key is None
            else f"the entry was saved for another frame (frame key "
            f"{str(code.frame_key)[:12]}, not this frame's {ctx.key[:12]})"
        )
        log.info("AOTAutograd cache entry refused at load (%s); tracing", ctx.refused)
        raise AotCacheMiss(ctx.refused)
    disk = disk_cache()
    if disk is None:
        raise AotCacheMiss("the neuron_compile disk cache is off")
    keys = code.pair.fx_keys if code.pair is not None and code.kind == "forward" else []
    for key in {code.fx_key, *keys}:  # the forward checks the backward's entry before loading
        if disk.get(key, count=False) is None:
            log.info("AOTAutograd cache entry refers to a graph not in our disk cache; tracing")
            raise AotCacheMiss(f"FX index entry {key} not in the disk cache")
    entry = disk.get(code.fx_key, count=False)
    try:
        graph_key, lowered = load_index(entry.read(INDEX_FILE))
    except (ValueError, KeyError, TypeError, OSError) as e:
        raise AotCacheMiss(f"unreadable FX index entry {code.fx_key}: {e}") from e
    stale = code.graph_key is not None and graph_key.digest() != code.graph_key
    if stale or any(s.attr for s in lowered.inputs):
        raise AotCacheMiss(f"FX index entry {code.fx_key} no longer matches")
    mismatch = code.convention.mismatch(lowered, code.kind, loaded_with)
    if mismatch is not None:
        ctx.refused = f"{code.kind} graph: {mismatch}"
        log.info("AOTAutograd cache entry refused at load (%s); tracing", ctx.refused)
        raise AotCacheMiss(ctx.refused)
    name = ctx.next_name(code.kind)
    record = GraphRecord(
        name=name,
        kind=code.kind,
        node_count=code.node_count,
        # The backward's capture is in the forward's record, as in compile_frame.
        capture_s=0.0 if code.kind == "backward" else t0 - ctx.start,
        recompile=ctx.recompile,
    )
    runner = compile_whole(
        None, name, code.kind, ctx.cfg, record, fx_key=code.fx_key, indexed=(graph_key, lowered)
    )
    if code.pair is not None:  # re-establish the saved-activation link of saved.py
        if code.kind == "forward":
            link = SavedLink(code.pair.num_fwd_outputs)
            runner.keep_saved_resident(link)
            if tuple(link.resident) != tuple(code.pair.resident):
                raise AotCacheMiss(f"graph {name}: saved-activation plan differs from the entry")
        elif code.kind == "backward":
            runner.read_saved_from(SavedLink(code.pair.num_fwd_outputs, code.pair.resident))
    # The epilogue of every compiled graph: 64-bit warning, backend time, GraphCompiled.
    return finish_graph(
        runner, record, ctx.cfg, t0, path="aot_cache", extra_s=ctx.charge_key_time()
    )
