"""Compile one AOTAutograd graph: passes -> lowering -> cache tiers (on a miss: verify,
serialize, compile) -> executor; a warm start finds the graph in the FX index and skips the first
two. ``CompiledGraph`` is the runtime side; saved activations stay on the device (saved.py).

Returns a boxed callable (AOTAutograd's calling convention: one list argument, cleared by the
callee so inputs can be freed early). Progress is published as compile events (events.py:
``GraphLowered``, ``RegionCompiled``, ``GraphCompiled``, ``GraphFailed``); metrics, dumps and
``neuron-compile check`` subscribe. ``finish_graph`` is the one epilogue of a runnable graph.
"""

from __future__ import annotations

import logging
import re
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch.fx as fx

from . import artifact as artifact_mod
from . import dump as _dump  # also subscribes: writes NEURON_COMPILE_DUMP_DIR on RegionCompiled
from . import events, narrowing
from .cache import executable_cache
from .cache.binding import ARTIFACT_FILE, EXECUTABLE_FILE, INDEX_FILE, MODULE_FILE
from .cache.fx_index import (
    dump_index,
    graph_signature,
    index_key,
    load_index,
    signature_mismatch,
)
from .cache.key import CacheKey, executable_key, graph_key
from .cache.manifest import entry_path, is_local_only
from .cache.store import DiskCache
from .cache.tiers import disk_cache
from .collectives import graph_replica_groups
from .compiled_graph import CompiledGraph
from .config import NeuronConfig
from .errors import (
    BUG_HINT,
    DtypePolicyError,
    ExecutorError,
    LoweringError,
    NeuronCompileError,
    UnsupportedOpError,
    VerifierError,
)
from .fallback import FallbackRunner, FallbackWarning, RegionCall
from .lowering import lower_graph
from .lowering.lower_graph import USER_OUTPUTS, LoweredGraph
from .metrics import GraphRecord
from .partition import is_fully_supported, partition, split_reasons, summarize
from .passes import pipeline_for, run_pipeline
from .runtime.distributed import over_ranks
from .runtime.xla_cpu import XlaCpuExecutable, runs_on_one_thread
from .saved import META_KEY, POOL_INDICES
from .targets import CompileJob, get_target
from .warn_once import NeuronCompileWarning, once_set, warn, warn_once

log = logging.getLogger(__name__)

_FRAME_ID = re.compile(r"_\d+_(forward|backward|inference)_")
_GRAPH_SUFFIX = re.compile(r"_\d+_(forward|backward|inference)_\d+.*$")
#: Models whose DowncastWarning was shown (once per model and run, not per graph).
_DOWNCAST_WARNED: set = once_set(per_run=True)


#: Suffix of the cache name of a trn graph's CPU stand-in (the references behind its kernels).
STAND_IN = ".cpu_stand_in"


def cache_name(name: str) -> str:
    """A graph's name in the cache: without the per-process frame counter of
    ``{model}_{id}_{kind}_{n}``, so a miss is compared with the same graph of earlier runs."""
    return _FRAME_ID.sub(r"_\1_", name)


class DowncastWarning(NeuronCompileWarning):
    """A model's float64 (int64) values run as float32 (int32): the 64-bit policy. Once per
    model; int64 indices, BatchNorm's step counter and saved activations narrow exactly and are
    not warned about (``narrowing``)."""


#: Longest warning text: a user reads it in full.
MAX_WARNING = 300


def _model_of(name: str) -> str:
    """The model a graph belongs to: ``TinyGPT_0_backward_1`` -> ``TinyGPT``."""
    return _GRAPH_SUFFIX.sub("", name)


def _warn_downcasts(name: str, downcasts: list[str], cfg: NeuronConfig) -> None:
    """One warning per model (or NC104 error per graph) naming the user's inputs that run
    narrowed; exact narrowings (``narrowing.EXEMPT``) are only logged."""
    if not downcasts:
        return
    log.info("graph %s: 64-bit inputs narrowed: %s", name, "; ".join(downcasts))
    shown = narrowing.warned(downcasts)
    if not shown:
        return
    if cfg.sixty_four_bit == "error":
        raise DtypePolicyError(
            f"graph {name} has 64-bit inputs or values: {narrowing.summarize(shown, 600)}",
            hint="convert inputs to float32/int32 and compute in float32 (no .double()), or use "
            "options={'sixty_four_bit': 'downcast'}",
        )
    model = _model_of(name)
    head = f"neuron-compile: {model} runs 64-bit values narrowed: "
    tail = ("; int64 outside +-2**31 would wrap" if any("int64" in d for d in shown) else "") + (
        ". options={'sixty_four_bit': 'error'} makes this an error"
    )
    listed = narrowing.summarize(shown, MAX_WARNING - len(head) - len(tail))
    warn_once(_DOWNCAST_WARNED, model, head + listed + tail, DowncastWarning)


def _verify(lowered: LoweredGraph) -> None:
    try:
        artifact_mod.verify(lowered.text)
    except artifact_mod.VerifyFailure as e:
        node = lowered.node_at_line(e.line) if e.line else None
        raise VerifierError(
            "the StableHLO verifier rejected the emitted module",
            node=node,
            reason=f"line {e.line}: {e.message}" if e.line else e.message,
            hint=BUG_HINT,
        ) from None


def compile_graph(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    name: str,
    kind: str,
    cfg: NeuronConfig,
    capture_s: float = 0.0,
    recompile: bool = False,
    fx_key: str | None = None,
) -> CompiledGraph | FallbackRunner:
    """Compile ``gm`` (an AOTAutograd forward/backward/inference graph) for the CPU executor.

    ``example_inputs`` are AOTAutograd's (fake) inputs; shapes and dtypes come from the graph's
    own metadata, so they are accepted for the compiler-callback signature only.

    Fully supported graphs become one executable. Otherwise, with ``fallback="cpu"``, supported
    regions are compiled and the rest runs eagerly (one ``FallbackWarning`` per graph); with
    ``fallback="error"`` the first unsupported node raises NC101.
    """
    t0 = time.perf_counter()
    record = GraphRecord(
        name=name,
        kind=kind,
        node_count=len(gm.graph.nodes),
        capture_s=capture_s,
        recompile=recompile,
    )
    try:
        # A warm start skips passes and lowering. ``fx_key``: the graph's FX index key when the
        # caller already computed it (aot_cache.defer), so it is not hashed twice.
        fx_key, indexed = _index_lookup(gm, cfg, name, fx_key)
        if indexed is None:
            dump_to = _dump.dump_path(cfg, name, "passes")
            # No recompile: lowering reads the graph; the rare paths that run or print gm do it.
            run_pipeline(gm, pipeline_for(cfg.target), dump_to=dump_to, recompile=False)
            record.passes_s = time.perf_counter() - t0
        if indexed is not None or is_fully_supported(gm):
            runner: CompiledGraph | FallbackRunner = compile_whole(
                gm, name, kind, cfg, record, fx_key=fx_key, indexed=indexed
            )
        else:
            runner = _compile_with_fallback(gm, name, kind, cfg, record)
        link = gm.meta.get(META_KEY)
        if link is not None:  # keep saved activations on the device between forward and backward
            if kind == "forward" and isinstance(runner, CompiledGraph):
                runner.keep_saved_resident(link)
            elif kind == "backward":
                runner.read_saved_from(link)
        return finish_graph(runner, record, cfg, t0, gm=gm)
    except BaseException as e:
        events.publish(events.GraphFailed(name, kind, gm, cfg, e))
        raise


def compile_whole(
    gm: fx.GraphModule | None,
    name: str,
    kind: str,
    cfg: NeuronConfig,
    record: GraphRecord,
    *,
    fx_key: str | None = None,
    indexed: tuple[CacheKey, LoweredGraph] | None = None,
) -> CompiledGraph:
    """A fully supported graph as one executable that counts its own calls. ``gm`` is None only
    with ``indexed``: an AOTAutograd cache hit rebuilding the graph from the FX index entry
    (aot_cache.py), through the same cache tiers as any warm start."""
    runner = _compile_region(gm, name, kind, cfg, record, fx_key=fx_key, indexed=indexed)
    runner.count_calls = True
    runner.fx_key = fx_key
    return runner


def finish_graph(
    runner: CompiledGraph | FallbackRunner,
    record: GraphRecord,
    cfg: NeuronConfig,
    started: float,
    *,
    gm: fx.GraphModule | None = None,
    path: str = "compile",
    extra_s: float = 0.0,
) -> CompiledGraph | FallbackRunner:
    """The epilogue of every graph made runnable, compiled (``compile_graph``) or loaded by an
    AOTAutograd cache hit (``path="aot_cache"``): the 64-bit warning (NC104 in error mode), the
    record's backend time since ``started`` (plus ``extra_s``), then ``GraphCompiled``
    (``metrics()`` keeps the record)."""
    _warn_downcasts(record.name, record.downcasts, cfg)
    record.backend_s = time.perf_counter() - started + extra_s
    event = events.GraphCompiled(record.name, record.kind, record, runner, cfg, gm, path)
    events.publish(event)
    log.debug(
        "%s %s: %d nodes, lowering %.1f ms, verify %.1f ms, executor %.1f ms%s",
        "compiled" if path == "compile" else f"loaded ({path})",
        record.name,
        record.node_count,
        1e3 * record.lowering_s,
        1e3 * record.verify_s,
        1e3 * record.executor_compile_s,
        f", {len(record.fallback_ops)} op kinds on CPU" if record.fallback_ops else "",
    )
    return runner


def _compile_with_fallback(
    gm: fx.GraphModule, name: str, kind: str, cfg: NeuronConfig, record: GraphRecord
) -> FallbackRunner:
    reasons = split_reasons(gm)
    if cfg.fallback == "error":
        first = next(n for n in gm.graph.nodes if n.name == reasons[0].node)
        raise UnsupportedOpError(
            f"cannot lower {first.target}",
            node=first,
            reason=reasons[0].reason,
            hint="use options={'fallback': 'cpu'} to run unsupported ops eagerly on the CPU, "
            "or rewrite the model to avoid the op",
            split_reasons=[r.as_dict() for r in reasons],
        )
    warn(
        f"neuron-compile: graph {name} runs {len(reasons)} op(s) eagerly on the CPU: "
        f"{summarize(reasons)}. Each fallback splits the graph and costs a device round trip; "
        "options={'fallback': 'error'} makes this an error.",
        FallbackWarning,
    )
    gm.recompile()  # the passes left gm.forward stale; the eager parts run it
    fused, regions = partition(gm)
    for region in regions:
        sub = fused.get_submodule(region)
        out = next(n for n in sub.graph.nodes if n.op == "output")
        compiled = _compile_region(sub, f"{name}_{region}", kind, cfg, record)
        delattr(fused, region)
        setattr(fused, region, RegionCall(compiled, not isinstance(out.args[0], (tuple, list))))
    record.fallback_ops = dict(Counter(r.op for r in reasons))
    record.regions = len(regions)
    return FallbackRunner(fused, reasons, record)


def _artifact(
    lowered: LoweredGraph,
    key: CacheKey,
    name: str,
    cfg: NeuronConfig,
    record: GraphRecord,
    disk: DiskCache | None,
) -> tuple[bytes, str | None]:
    """The verified, serialized artifact of ``lowered``: from the disk cache, or built (and
    stored, so the next process skips verify and serialize). With it, the module text of the
    cache entry it came from (None when built here): its hash is bound to the key (binding.py),
    and ``_executable`` checks the artifact against it before compiling from it."""
    components = key.components()
    graph = cache_name(name)

    def build() -> dict[str, bytes]:
        if disk is not None:  # a miss: say why before this graph's entry exists
            record.cache_miss = disk.explain_miss(graph, components) or [
                f"first compile of {graph}"
            ]
        t = time.perf_counter()
        if cfg.verify:
            _verify(lowered)
        try:
            art = artifact_mod.serialize(lowered.text, cfg.artifact)
        except (
            Exception
        ) as e:  # reachable with verify=False: the verifier would have named the line
            raise VerifierError(
                f"could not serialize graph {name}: {type(e).__name__}: {e}",
                hint=BUG_HINT + "; rerun with verify enabled to locate the op",
            ) from e
        if cfg.verify and cfg.artifact == "hlo":  # the proto must convert back and verify too
            try:
                artifact_mod.artifact_text(art, "hlo")
            except artifact_mod.VerifyFailure as e:
                raise VerifierError(
                    f"the HloModuleProto of graph {name} does not verify",
                    reason=e.message,
                    hint=BUG_HINT,
                ) from None
        record.verify_s += time.perf_counter() - t
        return {ARTIFACT_FILE: art, MODULE_FILE: lowered.text.encode()}

    if disk is None:
        record.cache_source = "off"
        return build()[ARTIFACT_FILE], None
    files, record.cache_source = disk.get_or_create(
        key.digest(), build, graph_name=graph, components=components
    )
    cached = record.cache_source in ("disk", "remote")
    return files[ARTIFACT_FILE], files[MODULE_FILE].decode() if cached else None


class UnboundArtifact(Exception):
    """A cached artifact is not the serialization of the module its entry is keyed by."""


def _executable(
    art: bytes,
    key: CacheKey,
    name: str,
    disk: DiskCache | None,
    form: str = "portable",
    module_text: str | None = None,
    replicas: int = 1,
    ranks: tuple[int, ...] = (),
    one_thread: bool = False,
) -> XlaCpuExecutable:
    """The XLA CPU executable of ``art``: this host's disk entry, or compiled (and stored); on
    the one-thread client when ``one_thread`` (the executable is the same either way).

    Executables are host-specific (CPU features are in their key), never exported or promoted,
    and not locked per key: an XLA CPU compile takes seconds, so two processes racing on one both
    compile and the second publish is dropped; the expensive, shared entry is the artifact.

    The key names ``art``'s sha256, so a stored executable only serves the exact bytes it was
    compiled from. ``module_text``: the text of the cache entry ``art`` came from; before
    compiling, ``art`` must be its serialization (raises ``UnboundArtifact``), so an entry whose
    artifact was swapped under a genuine module is never compiled, let alone stored.
    """
    exe_key = executable_key(key, "xla_cpu", art, replicas, ranks)
    digest = exe_key.digest()
    entry = disk.get(digest) if disk is not None else None
    if entry is not None and is_local_only(entry.manifest):
        try:
            return XlaCpuExecutable(
                serialized=entry.read(EXECUTABLE_FILE), ranks=ranks, one_thread=one_thread
            )
        except NeuronCompileError:  # the user's setting (e.g. a bad env var), not the entry
            raise
        except Exception as e:  # an executable this jaxlib cannot load: rebuild it
            log.warning("graph %s: cached executable unusable (%s); recompiling", name, e)
    if module_text is not None:  # the artifact is about to run: it must be the module's
        try:  # compared as XLA compiles them: an HloModuleProto embeds a per-process module id
            rebuilt = artifact_mod.serialize(module_text, form)
            as_run = artifact_mod.executable_input
            bound = as_run(rebuilt, form) == as_run(art, form)
        except Exception:  # a module that no longer serializes cannot be its source either
            bound = False
        if not bound:
            raise UnboundArtifact(f"the artifact of graph {name} is not built from its module")
    t = time.perf_counter()
    try:
        run_input = artifact_mod.executable_input(art, form)
        if replicas > 1 and ranks != tuple(range(replicas)):  # for the ranks' own runtime
            run_input = over_ranks(artifact_mod.artifact_text(art, form), ranks).encode()
        exe = XlaCpuExecutable(run_input, ranks=ranks, one_thread=one_thread)
    except NeuronCompileError:  # already says what to do (a bad NEURON_COMPILE_* value): no bug
        raise
    except Exception as e:
        raise ExecutorError(
            f"XLA CPU failed to compile graph {name}: {type(e).__name__}: {e}", hint=BUG_HINT
        ) from e
    seconds = time.perf_counter() - t
    if disk is not None:
        try:
            blob = exe.serialize()
        except Exception as e:  # pragma: no cover - depends on the jaxlib release
            log.debug("cannot serialize the XLA executable of %s: %s", name, e)
        else:
            disk.put(
                digest,
                {EXECUTABLE_FILE: blob},
                graph_name=cache_name(name) + ".executable",
                components=exe_key.components(),
                compile_seconds=seconds,
                meta={"local_only": True},
            )
    return exe


def _bound_executable(
    art: bytes,
    module_text: str | None,
    lowered: LoweredGraph,
    key: CacheKey,
    name: str,
    cfg: NeuronConfig,
    record: GraphRecord,
    disk: DiskCache | None,
) -> tuple[bytes, XlaCpuExecutable]:
    """``(artifact, executable)``; a cached artifact that is not its module's serialization is
    quarantined and rebuilt here (not re-read: the remote tier may hold the same forgery)."""
    replicas, ranks = lowered.num_replicas, lowered.reachable_ranks
    one = len(ranks) <= 1 and runs_on_one_thread(lowered.text)
    if one:
        log.debug("graph %s: small enough for one XLA CPU thread", name)
    try:
        return art, _executable(
            art, key, name, disk, cfg.artifact, module_text, replicas, ranks, one
        )
    except UnboundArtifact as e:
        assert disk is not None
        digest = key.digest()
        disk.quarantine(digest, str(e))
        art, _ = _artifact(lowered, key, name, cfg, record, None)
        record.cache_source = "compiled"
        disk.put(
            digest,
            {ARTIFACT_FILE: art, MODULE_FILE: lowered.text.encode()},
            graph_name=cache_name(name),
            components=key.components(),
        )
        return art, _executable(art, key, name, disk, cfg.artifact, None, replicas, ranks, one)


def _key_of(lowered: LoweredGraph, cfg: NeuronConfig) -> CacheKey:
    return graph_key(
        lowered.text,
        io_specs=[[vars(s) for s in lowered.inputs], [vars(o) for o in lowered.outputs]],
        artifact_form=cfg.artifact,
        replica_groups=[c.replica_groups for c in lowered.collectives],
    )


def fx_index_key(gm: fx.GraphModule, cfg: NeuronConfig) -> str | None:
    """The FX index key (cache/fx_index.py) of ``gm`` as AOTAutograd handed it over."""
    # Group names are per-process handles: the groups they stand for this time enter the key.
    extra = {
        "sixty_four_bit": cfg.sixty_four_bit,
        "replica_groups": graph_replica_groups(gm),
        "user_outputs": gm.meta.get(USER_OUTPUTS),  # which outputs may be views (OutputSpec)
        "pool_indices": gm.meta.get(POOL_INDICES),  # inputs known to be a max pool's indices
    }
    return index_key(gm, cfg.artifact, extra)


def _index_lookup(
    gm: fx.GraphModule, cfg: NeuronConfig, name: str, known_key: str | None = None
) -> tuple[str | None, tuple[CacheKey, LoweredGraph] | None]:
    """``(FX index key, (graph key, lowered specs) on a hit)`` for a graph as AOTAutograd
    handed it over (before passes). Not for targets that check every lowered graph
    (``Target.skips_lowering_when_cached``); dumps want the lowered graph too."""
    disk = disk_cache()
    if disk is None or cfg.dump_dir or not get_target(cfg.target).skips_lowering_when_cached:
        return None, None
    fx_key = known_key or fx_index_key(gm, cfg)
    entry = disk.get(fx_key, count=False) if fx_key is not None else None
    if entry is None:
        return fx_key, None
    try:
        key, lowered = load_index(entry.read(INDEX_FILE))
    except (ValueError, KeyError, TypeError, OSError) as e:
        log.warning("graph %s: unreadable FX index entry (%s); lowering", name, e)
        if entry.path == entry_path(disk.root, fx_key):  # local: moved aside, then rewritten
            disk.quarantine(fx_key, f"FX index entry: {e}")
        return fx_key, None
    if not all(hasattr(gm, s.attr) for s in lowered.inputs if s.attr):
        return fx_key, None  # constants a pass would have created: take the long way
    unfit = signature_mismatch(*graph_signature(gm), lowered)
    if unfit is not None:  # a damaged or misplaced entry: recompiled, never called
        log.warning("graph %s: FX index entry does not fit the graph (%s); lowering", name, unfit)
        return fx_key, None
    return fx_key, (key, lowered)


def _stand_in(
    gm: fx.GraphModule,
    lowered: LoweredGraph,
    name: str,
    kind: str,
    cfg: NeuronConfig,
    record: GraphRecord,
    disk: DiskCache | None,
) -> Any:
    """The CPU stand-in of a graph whose module calls its target's kernels: the same FX graph
    lowered for the cpu target (reference rules only), compiled for XLA's CPU client."""
    cpu_lowered = lower_graph(gm)
    events.publish(events.GraphLowered(record.name, name + STAND_IN, kind, gm, cpu_lowered))
    if (cpu_lowered.inputs, cpu_lowered.outputs) != (lowered.inputs, lowered.outputs):
        raise LoweringError(f"graph {name}: the CPU stand-in's calling plan differs", hint=BUG_HINT)
    cpu_key = _key_of(cpu_lowered, cfg)
    # Its own cache name and scratch record: the record's cache fields describe the target's
    # artifact, and a miss is explained against earlier stand-ins, not against it.
    scratch = GraphRecord(name=name, kind=kind, node_count=record.node_count)
    cpu_art, cpu_text = _artifact(cpu_lowered, cpu_key, name + STAND_IN, cfg, scratch, disk)
    record.verify_s += scratch.verify_s
    cpu_sources = (cpu_lowered, cpu_key, name + STAND_IN, cfg, scratch, disk)
    return _bound_executable(cpu_art, cpu_text, *cpu_sources)[1]


def _compile_region(
    gm: fx.GraphModule | None,
    name: str,
    kind: str,
    cfg: NeuronConfig,
    record: GraphRecord,
    *,
    fx_key: str | None = None,
    indexed: tuple[CacheKey, LoweredGraph] | None = None,
) -> CompiledGraph:
    """Lower one fully supported graph for its target (unless the FX index already knows it),
    let the target check it, then get its artifact and executable from the cache tiers
    (memory -> disk -> remote) or build them; record ``fx_key`` -> graph key in the index."""
    t1 = time.perf_counter()
    disk = disk_cache()
    target = get_target(cfg.target)
    if indexed is not None:
        key, lowered = indexed
    else:
        lowered = lower_graph(gm, target=target, lnc=cfg.lnc)
        key = _key_of(lowered, cfg)
    t2 = time.perf_counter()
    record.lowering_s += t2 - t1
    if indexed is None:
        events.publish(events.GraphLowered(record.name, name, kind, gm, lowered))
    record.downcasts += lowered.downcasts
    for collective in lowered.collectives:
        record.collectives[collective.op] = record.collectives.get(collective.op, 0) + 1
    record.cache_key = key.digest()
    if cfg.estimate != "off":  # roofline device time, summed over regions (None: unknown)
        est = get_target(cfg.estimate).estimate(lowered.text, cfg.lnc)
        # Unknown as soon as one region is (an earlier region set est_target, not the total).
        unknown = est is None or (record.est_target != "" and record.est_device_s is None)
        record.est_device_s = None if unknown else (record.est_device_s or 0.0) + est
        record.est_target = cfg.estimate
    job = CompileJob(gm, lowered, cfg, name, cache_name(name))
    target.check(job)  # reject what the target's compiler would, before any artifact exists

    def build() -> tuple[bytes, Any]:
        art, module_text = _artifact(lowered, key, name, cfg, record, disk)
        t = time.perf_counter()
        exe = target.compile(job)
        if exe is None and lowered.custom_calls:  # XLA CPU runs the target kernels' references
            exe = _stand_in(gm, lowered, name, kind, cfg, record, disk)
        elif exe is None:
            art, exe = _bound_executable(art, module_text, lowered, key, name, cfg, record, disk)
        record.executor_compile_s += time.perf_counter() - t
        return art, exe

    tag = target.executable_tag(cfg)
    mem_key = key if tag is None else key.extend(target=tag)
    (art, executable), record.executor_cache_hit = executable_cache.get_or_create(mem_key, build)
    if record.executor_cache_hit:
        record.cache_source = "memory"
    if fx_key is not None and indexed is None and disk is not None:
        payload = dump_index(key, lowered)
        if payload is not None:
            disk.put(
                fx_key,
                {INDEX_FILE: payload},
                graph_name=cache_name(name) + ".index",
                components={"graph_key": record.cache_key},
            )
    record.artifact_bytes += len(art)
    events.publish(events.RegionCompiled(record.name, name, kind, gm, lowered, art, cfg, record))
    constants = {s.attr: getattr(gm, s.attr) for s in lowered.inputs if s.attr}
    return CompiledGraph(name, lowered, executable, constants, record)
