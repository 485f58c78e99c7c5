"""The trn2 and trn3 targets: their numbers, and what the core asks of a target.

Every number a pass, the legality checks, the neuronx-cc driver or the cost model needs about a
Trainium generation lives here, with its source (``docs/trainium-reference.md`` §R1, AWS Neuron
SDK docs). Loading this module registers the trn lowering forms and pattern passes.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch.fx as fx

from ..config import NeuronConfig
from ..passes.base import GraphPass
from ..targets import CompileJob, Target
from . import TRN_KEY
from . import lowering as _lowering  # importing it registers the trn lowering forms

GiB = 2**30

#: neuronx-cc's built-in custom-call targets (SDK ``compiler/error-codes/EHCA005.rst``); any other
#: target is rejected with NCC_EHCA005 / NCC_EVRF015.
NEURON_CUSTOM_CALLS: frozenset[str] = frozenset(
    {
        "AwsNeuronErf",
        "AwsNeuronGelu",
        "AwsNeuronGeluApprxTanh",
        "AwsNeuronGeluBackward",
        "AwsNeuronSilu",
        "AwsNeuronSiluBackward",
        "AwsNeuronRmsNorm",
        "AwsNeuronSoftmax",
        "AwsNeuronSoftmaxBackward",
        "AwsNeuronCollectiveMatmul",
        "AwsNeuronIntMatmult",
        "AwsNeuronArgMax",
        "AwsNeuronArgMin",
        "AwsNeuronTopK",
        "AwsNeuronDropoutMaskV1",
        "AwsNeuronCustomNativeKernel",
        "AwsNeuronCustomOp",
        "AwsNeuronDevicePrint",
        "ResizeNearest",
        "ResizeBilinear",
        "ResizeNearestGrad",
        "AwsNeuronLNCShardingConstraint",
        "AwsNeuronTransferWithStaticRing",
        "AwsNeuronModuleMarkerStart-Forward",
        "AwsNeuronModuleMarkerEnd-Forward",
        "AwsNeuronModuleMarkerStart-Backward",
        "AwsNeuronModuleMarkerEnd-Backward",
        "NeuronBoundaryMarker-Start",
        "NeuronBoundaryMarker-End",
    }
)

#: Element types neuronx-cc compiles on NeuronCore v3/v4 (torch dtype names). 64-bit types are
#: narrowed by our lowering (the 64-bit policy), so they never reach the compiler by default.
_BASE_DTYPES = (
    "float32",
    "bfloat16",
    "float16",
    "float8_e5m2",
    "int8",
    "uint8",
    "int16",
    "uint16",
    "int32",
    "uint32",
    "bool",
)


# ---- collectives: what the targets accept, and how fast their links are -------------------------

#: The StableHLO collectives documented for trn2/trn3: TorchNeuron compiles
#: ``_c10d_functional`` all_reduce / all_gather_into_tensor / reduce_scatter_tensor /
#: all_to_all_single into the NEFF as these ops (``../shared/reference/torchneuron.md`` §9 [SRC]);
#: the Neuron collectives runtime benchmarks the same four (nccom-test ``allr``/``allg``/
#: ``redsct``/``alltoall``, https://awsdocs-neuron.readthedocs-hosted.com/en/latest/tools/
#: neuron-sys-tools/nccom-test.html); ``nki.collectives`` exposes them on Trn2/Trn3
#: (https://awsdocs-neuron.readthedocs-hosted.com/en/v2.30.0/nki/api/nki.collectives.html).
DOCUMENTED_COLLECTIVES = frozenset({"all_reduce", "all_gather", "reduce_scatter", "all_to_all"})

#: Collectives only a secondary source restricts: ``torchneuron.md`` §9 marks "no
#: send/recv/collective_permute" and "broadcast not functional" as [3P] (third-party write-ups,
#: unverified), and ``nki.collectives`` documents a ``collective_permute`` on Trn2/Trn3, which
#: contradicts the first. Unverified, so legality warns (never raises) on them.
UNVERIFIED_COLLECTIVES: dict[str, str] = {
    "collective_permute": "no send/recv/collective_permute",
    "send": "no send/recv/collective_permute",
    "recv": "no send/recv/collective_permute",
    "collective_broadcast": "broadcast not functional",
}

#: Element types (MLIR names) the collectives move: nccom-test's data types "uint8, int8, uint16,
#: int16, fp16, bf16, int32, uint32, fp32"
#: (https://awsdocs-neuron.readthedocs-hosted.com/en/v1.12.0/tools/neuron-sys-tools/nccom-test.html,
#: a Trn1/Inf2-era page; that trn2/trn3 keep exactly this list is unverified). No 64-bit type is
#: listed: f64/i64/ui64 collectives are errors (integer all-reduce/reduce-scatter still follow
#: ``--implicit-integer-downcast``, NCC_EVRF061/063).
COLLECTIVE_DTYPES = frozenset({"ui8", "i8", "ui16", "i16", "f16", "bf16", "i32", "ui32", "f32"})
#: Types no source lists for collectives but the target computes with: a warning, not an error.
#: fp8 (FSDP float8 all-gathers) and pred (bool) are unverified.
UNVERIFIED_COLLECTIVE_DTYPES = frozenset({"f8E5M2", "i1"})

#: [3P] "replica groups 4/8/16/32-aligned" (``torchneuron.md`` §9, unverified). We read it as a
#: group size that is a power of two of at least 4 (4, 8, 16, 32, and the 64 ranks of a
#: trn2.48xlarge at LNC=2); anything else warns.
ALIGNED_GROUP_MIN = 4


@dataclass(frozen=True)
class CollectiveSupport:
    """Which collectives (StableHLO op names without ``stablehlo.``) and element types a target's
    collectives take; ``unverified*`` entries warn instead of raising; ``source`` says where each
    fact comes from and which are unverified."""

    ops: frozenset[str] = frozenset()
    dtypes: frozenset[str] = frozenset()
    unverified_ops: dict[str, str] = field(default_factory=dict)
    unverified_dtypes: frozenset[str] = frozenset()
    aligned_group_min: int = ALIGNED_GROUP_MIN
    source: str = ""


@dataclass(frozen=True)
class LinkBandwidth:
    """Bytes/s one chip sends over its collective links: ``intra_node`` between the chips of one
    instance (NeuronLink), ``inter_node`` between instances (EFA, the instance's bandwidth shared
    by its chips). ``chips_per_node``: groups up to this size stay on NeuronLink."""

    intra_node: float = 0.0
    inter_node: float = 0.0
    chips_per_node: int = 1
    source: str = ""


_COLLECTIVES_SOURCE = (
    "ops: torchneuron.md §9 [SRC] + nccom-test + nki.collectives; dtypes: nccom-test's list "
    "(Trn1-era page; unverified for trn2/trn3); collective_permute/send/recv/collective_broadcast "
    "and the 4/8/16/32 alignment: torchneuron.md §9 [3P], unverified; fp8/pred: unverified"
)


@dataclass(frozen=True)
class TileLimits:
    """NKI / hardware tile limits (``nki.language.tile_size``; docs/trainium-reference.md §R3)."""

    partition_max: int = 128  # pmax: partition dim of any SBUF/PSUM tile
    psum_free_max_fp32: int = 512  # psum_bank_fmax: 2 KiB per partition per bank
    psum_banks: int = 8
    gemm_stationary_free_max: int = 128
    gemm_moving_free_max: int = 512
    sbuf_bytes_per_partition: int = 0  # usable bytes per partition (NKIPy HardwareConstants.h)


@dataclass(frozen=True)
class TrainiumTarget(Target):
    """A Trainium generation. Per-core numbers are per *physical* NeuronCore; use the
    ``*_per_logical_core`` helpers for an LNC=2 logical core (two physical cores)."""

    #: The trn kernel forms win over the reference rules (``lowering.py``).
    lowering_keys: tuple[str, ...] = (TRN_KEY,)
    #: Legality checks read the lowered graph, so every compile lowers.
    skips_lowering_when_cached: bool = False
    # The graphs neuronx-cc receives keep AOTAutograd's partition until the change is measured
    # on a device (a transposed weight there is a DMA pattern, not a copy thunk).
    saves_parameters_for_views: bool = False
    #: ``neuronx-cc --target`` value.
    neuronx_cc_target: str = ""
    #: The logical NeuronCore config used when neither ``lnc`` nor the runtime's setting says.
    default_lnc: int = 2
    #: HBM per physical NeuronCore (chip HBM / 8 cores; docs/trainium-reference.md §R1).
    hbm_per_core_bytes: int = 0
    #: Allowed element types (torch dtype names).
    dtypes: frozenset[str] = frozenset()
    #: 64-bit integer types are native with ``--native-int64=enabled`` (NC-v3 and later).
    native_int64_capable: bool = False
    custom_calls: frozenset[str] = frozenset()
    tiles: TileLimits = field(default_factory=TileLimits)
    #: Dense peak FLOP/s per physical core by compute dtype (docs/trainium-reference.md §R2).
    peak_flops: dict[str, float] = field(default_factory=dict)
    #: HBM bandwidth share per physical core, bytes/s (min of HBM share and DMA cap).
    hbm_bandwidth: float = 0.0
    #: Graph-size proxy for neuronx-cc's instruction limit (NCC_EBVF030/EVRF007/EXTP004): an
    #: upper bound on the estimated instruction count of one graph. The real limit is not
    #: published; this bound is deliberately generous so it only stops pathological graphs.
    max_instructions: int = 0
    #: Physical cores per chip.
    cores_per_chip: int = 8
    #: Collectives and element types the target accepts (legality_collectives.py).
    collectives: CollectiveSupport = field(default_factory=CollectiveSupport)
    #: Collective link bandwidth per chip (cost_model.py's collective term).
    links: LinkBandwidth = field(default_factory=LinkBandwidth)

    # ---- the Target hooks --------------------------------------------------------------------
    def resolve_lnc(self, lnc: int | None) -> int:
        """``lnc`` if given, else the Neuron SDK's ``NEURON_LOGICAL_NC_CONFIG`` (what the
        runtime will use), else the target default."""
        if lnc is not None:
            return lnc
        env = os.environ.get("NEURON_LOGICAL_NC_CONFIG", "").strip()
        if env.isdigit() and int(env) in self.lnc_choices:
            return int(env)
        return self.default_lnc

    def default_estimate(self) -> str:
        return self.name

    def kept_ops(self) -> tuple[Any, ...]:
        return _lowering.KEPT_OPS

    def pipeline(self, core: tuple[GraphPass, ...]) -> tuple[GraphPass, ...]:
        # Right after fold_permutes, i.e. before CSE: CSE could merge a pattern's interior with
        # an unrelated equal node and give it an outside user, which blocks the rewrite.
        from ..passes import fold_permutes
        from .passes import rewrite_neuron_calls

        at = core.index(fold_permutes) + 1
        return core[:at] + (rewrite_neuron_calls,) + core[at:]

    @contextlib.contextmanager
    def frame_routing(self, cfg: NeuronConfig) -> Iterator[None]:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        from .kernels.flash_attention import RoutingSdpa

        # SDPA calls not routed to the flash kernels take the math path (bmm + softmax), whose
        # softmax the trn pattern pass turns into neuronx-cc's kernel; eager's CPU flash op would
        # reach neuronx-cc as one opaque reference decomposition.
        with sdpa_kernel(SDPBackend.MATH):
            with RoutingSdpa() if cfg.flash_attention else contextlib.nullcontext():
                yield

    def prepare_frame(self, gm: fx.GraphModule, cfg: NeuronConfig) -> None:
        if cfg.flash_attention:
            from .kernels.flash_attention import route_sdpa

            route_sdpa(gm)

    def check(self, job: CompileJob) -> None:
        from .legality import check_legality

        flags = os.environ.get("NEURON_CC_FLAGS", "")
        lnc = job.cfg.lnc
        check_legality(job.gm, job.lowered, self, lnc=lnc, flags=flags, graph_name=job.graph_name)

    def compile(self, job: CompileJob) -> Any | None:
        """The NEFF (cached, compiled, collected for precompile, or skipped without
        neuronx-cc), run on the device when there is one; else None: the CPU runs the graph."""
        from ..cache.tiers import disk_cache
        from . import neff, runtime

        lowered = job.lowered
        device = runtime.available()
        neff_bytes = neff.neff_for_graph(  # from the key-bound text, not the cached artifact
            lowered.text,
            [[vars(s) for s in lowered.inputs], [vars(o) for o in lowered.outputs]],
            cfg=job.cfg,
            graph_name=job.graph_name,
            cache_name=job.cache_name,
            disk=disk_cache(),
            device=device,
        )
        if neff_bytes is None or not device:
            return None
        return runtime.NeuronExecutable(neff_bytes, lowered, lnc=int(job.cfg.lnc or 1))

    def executable_tag(self, cfg: NeuronConfig) -> str:
        return f"{self.name}-lnc{cfg.lnc}"

    def diagnostics(self, text: str) -> list[Any]:
        from .triage import parse_ncc

        return parse_ncc(text)

    def estimate(self, module_text: str, lnc: int | None) -> float | None:
        from .cost_model import estimate_for_record

        return estimate_for_record(module_text, self.name, lnc)

    def hbm_per_logical_core(self, lnc: int) -> int:
        return self.hbm_per_core_bytes * lnc

    def peak_flops_per_logical_core(self, dtype: str, lnc: int) -> float:
        return self.peak_flops.get(dtype, self.peak_flops.get("float32", 0.0)) * lnc


_TRN_TILES_V3 = TileLimits(sbuf_bytes_per_partition=212_984)
_TRN_TILES_V4 = TileLimits(sbuf_bytes_per_partition=245_752)

# Trn2 (NeuronCore-v3): 96 GiB HBM / 8 cores; 79 TF BF16, 158 TF FP8, 20 TF FP32 per core;
# HBM share 2.9 TB/s / 8 = 0.36 TB/s. F8E4M3FN is not supported (NCC_EVRF051).
TRN2 = TrainiumTarget(
    name="trn2",
    neuronx_cc_target="trn2",
    lnc_choices=(1, 2),
    default_lnc=2,
    hbm_per_core_bytes=12 * GiB,
    dtypes=frozenset(_BASE_DTYPES),
    native_int64_capable=True,
    custom_calls=NEURON_CUSTOM_CALLS,
    tiles=_TRN_TILES_V3,
    peak_flops={"bfloat16": 79e12, "float16": 79e12, "float8": 158e12, "float32": 20e12},
    hbm_bandwidth=0.36e12,
    max_instructions=5_000_000,
    collectives=CollectiveSupport(
        ops=DOCUMENTED_COLLECTIVES,
        dtypes=COLLECTIVE_DTYPES,
        unverified_ops=UNVERIFIED_COLLECTIVES,
        unverified_dtypes=UNVERIFIED_COLLECTIVE_DTYPES,
        source=_COLLECTIVES_SOURCE,
    ),
    # trn2.48xlarge: 16 chips in a 4x4 torus, NeuronLink-v3 1,024 GB/s per chip intra-instance
    # (the chip page says 1.28 TB/s chip-to-chip), EFAv3 3,200 Gbps per instance = 25 GB/s per
    # chip. https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-hardware/
    # trn2-arch.html (instance table; values as trainium-nki.md §1.3 quotes it).
    links=LinkBandwidth(
        intra_node=1024e9,
        inter_node=3200e9 / 8 / 16,
        chips_per_node=16,
        source="trn2-arch.html instance table: NeuronLink-v3 1,024 GB/s per chip, EFAv3 "
        "3,200 Gbps per 16-chip instance",
    ),
)
# Trn3 (NeuronCore-v4): 144 GiB HBM / 8 cores; 79 TF BF16, 315 TF MXFP8, 20 TF FP32 per
# core; HBM share min(4.9 TB/s / 8, DMA cap 0.528 TB/s). Adds native OCP F8E4M3FN.
TRN3 = TrainiumTarget(
    name="trn3",
    neuronx_cc_target="trn3",
    lnc_choices=(1, 2),
    default_lnc=2,
    hbm_per_core_bytes=18 * GiB,
    dtypes=frozenset(_BASE_DTYPES) | {"float8_e4m3fn"},
    native_int64_capable=True,
    custom_calls=NEURON_CUSTOM_CALLS,
    tiles=_TRN_TILES_V4,
    peak_flops={
        "bfloat16": 79e12,
        "float16": 79e12,
        "float8": 315e12,
        "float32": 20e12,
    },
    hbm_bandwidth=0.53e12,
    max_instructions=5_000_000,
    collectives=CollectiveSupport(
        ops=DOCUMENTED_COLLECTIVES,
        dtypes=COLLECTIVE_DTYPES,
        unverified_ops=UNVERIFIED_COLLECTIVES,
        unverified_dtypes=UNVERIFIED_COLLECTIVE_DTYPES | {"f8E4M3FN"},  # native on trn3 only
        source=_COLLECTIVES_SOURCE,
    ),
    # Trn3 Gen1 UltraServer: 16 chips per server; NeuronLink-v4 2.56 TB/s per device (chip page,
    # https://awsdocs-neuron.readthedocs-hosted.com/en/latest/about-neuron/arch/neuron-hardware/
    # trainium3.html); EFA 12,800 Gbps per 64-chip UltraServer = 25 GB/s per chip (trn3-arch.html,
    # as trainium-nki.md §1.3 quotes it). Unverified: the trn3 instance table gives 2,048 GiB/s
    # per device and the fabric section 256 GB/s per chip intra-server; which one a ring sees is
    # not documented.
    links=LinkBandwidth(
        intra_node=2.56e12,
        inter_node=12800e9 / 8 / 64,
        chips_per_node=16,
        source="trainium3 chip page: NeuronLink-v4 2.56 TB/s per device; trn3-arch: EFA 12,800 "
        "Gbps per 64-chip Gen1 UltraServer (unverified: 2,048 GiB/s / 256 GB/s per chip elsewhere)",
    ),
)
