"""Compilation targets as data: ``cpu`` (XLA CPU, the default without a device), ``trn2``, ``trn3``.

Every number a pass, the legality checks, the neuronx-cc driver or a cost model needs about a
target lives here, with its source (``/work/shared/reference/trainium-nki.md`` §1 and §3.5, AWS
Neuron SDK docs). Nothing here imports torch, jaxlib or the Neuron SDK.

Target selection (``resolve_target``): ``options={"target": ...}`` > ``NEURON_COMPILE_TARGET`` >
auto-detect (a Neuron device *and* the Neuron runtime present -> that device's family) > ``cpu``.
"""

from __future__ import annotations

import ctypes.util
import functools
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

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


@dataclass(frozen=True)
class TileLimits:
    """NKI / hardware tile limits (``nki.language.tile_size``; trainium-nki.md §2.2)."""

    partition_max: int = 128  # pmax: partition dim of any SBUF/PSUM tile
    psum_free_max_fp32: int = 512  # psum_bank_fmax: 2 KiB per partition per bank
    psum_banks: int = 8
    gemm_stationary_free_max: int = 128
    gemm_moving_free_max: int = 512
    sbuf_bytes_per_partition: int = 0  # usable bytes per partition (NKIPy HardwareConstants.h)


@dataclass(frozen=True)
class Target:
    """One compilation target. Per-core numbers are per *physical* NeuronCore; use the
    ``*_per_logical_core`` helpers for an LNC=2 logical core (two physical cores)."""

    name: str
    #: ``neuronx-cc --target`` value; None for targets neuronx-cc does not compile (cpu).
    neuronx_cc_target: str | None
    #: Logical NeuronCore configs the target supports, and the default (``--lnc``).
    lnc_choices: tuple[int, ...] = (1,)
    default_lnc: int = 1
    #: HBM per physical NeuronCore (chip HBM / 8 cores; trainium-nki.md §5 item 9).
    hbm_per_core_bytes: int = 0
    #: Allowed element types (torch dtype names).
    dtypes: frozenset[str] = frozenset()
    #: 64-bit integer types are native with ``--native-int64=enabled`` (NC-v3 and later).
    native_int64_capable: bool = False
    custom_calls: frozenset[str] = frozenset()
    tiles: TileLimits = field(default_factory=TileLimits)
    #: Dense peak FLOP/s per physical core by compute dtype (trainium-nki.md §1.4).
    peak_flops: dict[str, float] = field(default_factory=dict)
    #: HBM bandwidth share per physical core, bytes/s (min of HBM share and DMA cap).
    hbm_bandwidth: float = 0.0
    #: Graph-size proxy for neuronx-cc's instruction limit (NCC_EBVF030/EVRF007/EXTP004): an
    #: upper bound on the estimated instruction count of one graph. The real limit is not
    #: published; this bound is deliberately generous so it only stops pathological graphs.
    max_instructions: int = 0
    #: Physical cores per chip.
    cores_per_chip: int = 8

    @property
    def is_neuron(self) -> bool:
        return self.neuronx_cc_target is not None

    def hbm_per_logical_core(self, lnc: int) -> int:
        return self.hbm_per_core_bytes * lnc

    def peak_flops_per_logical_core(self, dtype: str, lnc: int) -> float:
        return self.peak_flops.get(dtype, self.peak_flops.get("float32", 0.0)) * lnc


_TRN_TILES_V3 = TileLimits(sbuf_bytes_per_partition=212_984)
_TRN_TILES_V4 = TileLimits(sbuf_bytes_per_partition=245_752)

TARGETS: dict[str, Target] = {
    "cpu": Target(
        name="cpu",
        neuronx_cc_target=None,
        dtypes=frozenset(_BASE_DTYPES) | {"float64", "int64", "complex64"},
    ),
    # Trn2 (NeuronCore-v3): 96 GiB HBM / 8 cores; 79 TF BF16, 158 TF FP8, 20 TF FP32 per core;
    # HBM share 2.9 TB/s / 8 = 0.36 TB/s. F8E4M3FN is not supported (NCC_EVRF051).
    "trn2": Target(
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
    ),
    # Trn3 (NeuronCore-v4): 144 GiB HBM / 8 cores; 79 TF BF16, 315 TF MXFP8, 20 TF FP32 per
    # core; HBM share min(4.9 TB/s / 8, DMA cap 0.528 TB/s). Adds native OCP F8E4M3FN.
    "trn3": Target(
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
    ),
}

TARGET_NAMES: tuple[str, ...] = tuple(TARGETS)
#: ``auto``: detect a device (else ``cpu``); accepted by ``options`` and the env var.
TARGET_CHOICES: tuple[str, ...] = ("auto", *TARGET_NAMES)

#: EC2 instance-family prefix -> target (the runtime reports the family; torchneuron.md §2.4).
_FAMILY_TO_TARGET = {"trn2": "trn2", "trn3": "trn3"}


def get_target(name: str) -> Target:
    """The ``Target`` named ``name`` (``cpu``, ``trn2``, ``trn3``); KeyError otherwise."""
    return TARGETS[name]


def is_neuron_target(name: str) -> bool:
    """True for the targets neuronx-cc compiles for (False for ``cpu`` and unknown names)."""
    target = TARGETS.get(name)
    return target is not None and target.is_neuron


def _has_device() -> bool:
    return os.path.exists("/dev/neuron0")


@functools.lru_cache(maxsize=1)
def runtime_library() -> str | None:
    """Path or soname of the Neuron runtime (``libnrt``), or None when it is not installed."""
    for candidate in ("/opt/aws/neuron/lib/libnrt.so.1", "/opt/aws/neuron/lib/libnrt.so"):
        if os.path.exists(candidate):
            return candidate
    return ctypes.util.find_library("nrt")


def _instance_family() -> str | None:
    """``trn2`` / ``trn3`` / ... from the DMI product name (``trn2.48xlarge`` -> ``trn2``)."""
    try:
        product = Path("/sys/devices/virtual/dmi/id/product_name").read_text().strip()
    except OSError:
        return None
    family = product.split(".", 1)[0].rstrip("nu")  # trn2n / trn2u -> trn2
    return family or None


def detect_target() -> str:
    """The target of the local Neuron device when a device and the runtime are present, else
    ``cpu``. A device of a family without a target here (trn1, inf2) also yields ``cpu``."""
    override = os.environ.get("NEURON_COMPILE_DETECTED_TARGET")  # tests of detection only
    if override:
        return override
    if not (_has_device() and runtime_library()):
        return "cpu"
    family = _instance_family()
    target = _FAMILY_TO_TARGET.get(family or "")
    if target is None:
        log.warning(
            "Neuron device found but instance family %r has no neuron-compile target; using cpu",
            family,
        )
        return "cpu"
    return target


def resolve_target(name: str | None) -> str:
    """``auto``/None -> ``detect_target()``; otherwise ``name`` (validated by the config)."""
    return detect_target() if name in (None, "", "auto") else name


def resolve_lnc(target: Target, lnc: int | None) -> int:
    """The logical-core config for ``target``: ``lnc`` if given, else the Neuron SDK's
    ``NEURON_LOGICAL_NC_CONFIG`` (what the runtime will use), else the target default."""
    if lnc is not None:
        return lnc
    env = os.environ.get("NEURON_LOGICAL_NC_CONFIG", "").strip()
    if env.isdigit() and int(env) in target.lnc_choices:
        return int(env)
    return target.default_lnc
