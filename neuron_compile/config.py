"""Backend configuration: one frozen dataclass built from ``options`` and ``NEURON_COMPILE_*`` env vars.

Precedence: ``torch.compile(..., options={...})`` > environment > defaults. Unknown option keys are
errors (NC001) that list the valid keys, because a silently ignored typo costs users a multi-minute
Trainium compile to discover.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from .errors import OptionsError

ENV_PREFIX = "NEURON_COMPILE_"

_SIXTY_FOUR_BIT = ("downcast", "error")
_FALLBACK = ("cpu", "error")
_ARTIFACTS = ("portable", "bytecode", "hlo")


@dataclass(frozen=True)
class NeuronConfig:
    """Options accepted by the backend (``options={...}``); each has an env var in ``ENV_VARS``."""

    #: Name used in graph names ``{model_name}_{id}_{kind}_{n}``; default: the traced module's class.
    model_name: str | None = None
    #: Directory for debug artifacts (FX graph, StableHLO text, portable artifact, JSON specs).
    dump_dir: str | None = None
    #: ``downcast``: float64 runs as float32 and int64 as int32 (warning per graph for float64).
    #: ``error``: any 64-bit graph input is an NC104 error.
    sixty_four_bit: str = "downcast"
    #: ``cpu``: ops without a lowering run eagerly on the CPU between compiled regions (one
    #: FallbackWarning per graph); ``error``: the first unsupported op is an NC101 error.
    fallback: str = "cpu"
    #: Verify every emitted module with jaxlib's StableHLO verifier (turn off only to measure it).
    verify: bool = True
    #: Form of the artifact handed to the executor: ``portable`` = versioned StableHLO/VHLO
    #: bytecode; ``bytecode`` = plain MLIR bytecode of the verified module; ``hlo`` = XLA
    #: ``HloModuleProto`` (converted by jaxlib). neuronx-cc receives ``module.hlo.pb`` under
    #: ``hlo`` and plain StableHLO bytecode (``module.mlir``, TorchNeuron's form) otherwise.
    artifact: str = "portable"
    #: Compilation target: ``cpu`` (XLA CPU only), ``trn2``, ``trn3`` (legality checks, neuronx-cc
    #: NEFFs, Neuron runtime when a device exists), or ``auto`` (default): the local Neuron
    #: device's family when a device and the Neuron runtime are present, else ``cpu``. Resolved
    #: when the config is built, so ``cfg.target`` is never ``auto``.
    target: str = "auto"
    #: Logical NeuronCore config (``--lnc``) for trn targets: 1 or 2. None: the Neuron SDK's
    #: ``NEURON_LOGICAL_NC_CONFIG``, else the target default (2 on trn2/trn3).
    lnc: int | None = None
    #: neuronx-cc optimization level (``-O1``/``-O2``/``-O3``).
    optlevel: int = 2
    #: Most recompiles allowed per compiled frame (new static shapes after the first compile);
    #: one more raises NC202 with the changed input and dim. ``None``: unlimited.
    max_recompiles: int | None = None
    #: Fail (NC202) on any recompile once ``neuron_compile.mark_warmup_done()`` has been called,
    #: like ``torch.compiler.set_stance("fail_on_recompile")``.
    strict_recompile: bool = False
    #: Sequence-length buckets the model is meant to be padded to (ascending ints). Only used to
    #: name, in recompile warnings and errors, the bucket that would have absorbed a new size.
    buckets: tuple[int, ...] | None = None
    #: Roofline device-time estimate per graph (``GraphRecord.est_device_s``, from
    #: ``cost_model.estimate_module``): ``off``, ``trn2`` or ``trn3``. Default: the compile target
    #: when it is trn2/trn3, else ``off`` (``neuron-compile check`` turns that default on with
    #: trn2; an explicit ``off`` stays off).
    estimate: str | None = None
    #: trn targets: route ``F.scaled_dot_product_attention`` calls whose shapes qualify (sequence
    #: lengths multiples of 128, head dim <= 128, no mask, no dropout, float32/bfloat16) to the
    #: flash-attention kernel op (``ops/flash_attention.py``) instead of its math decomposition.
    flash_attention: bool = True
    #: Let a warm start skip Dynamo's AOTAutograd tracing: PyTorch's AOTAutogradCache (under
    #: ``TORCHINDUCTOR_CACHE_DIR``) stores the traced graphs' metadata with small references to
    #: our disk-cache entries (aot_cache.py). CPU target with the disk cache on only.
    aot_cache: bool = True
    #: Extra user metadata, not interpreted (kept in dumps). Not an option key.
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def estimate_defaulted(self) -> bool:
        """True when neither options nor the environment set ``estimate`` (it took its default)."""
        return self.__dict__.get("_estimate_defaulted", False)

    def __post_init__(self) -> None:
        if self.sixty_four_bit not in _SIXTY_FOUR_BIT:
            raise OptionsError(
                f"invalid sixty_four_bit={self.sixty_four_bit!r}",
                hint=f"use one of {', '.join(_SIXTY_FOUR_BIT)}",
            )
        if self.fallback not in _FALLBACK:
            raise OptionsError(
                f"invalid fallback={self.fallback!r}", hint=f"use one of {', '.join(_FALLBACK)}"
            )
        if self.artifact not in _ARTIFACTS:
            raise OptionsError(
                f"invalid artifact={self.artifact!r}", hint=f"use one of {', '.join(_ARTIFACTS)}"
            )
        from .targets import get_target, resolve_target, target_choices, target_names

        if self.target not in target_choices():
            raise OptionsError(
                f"invalid target={self.target!r}",
                hint=f"use one of {', '.join(target_choices())}",
            )
        object.__setattr__(self, "target", resolve_target(self.target))
        target = get_target(self.target)
        if self.lnc is not None and (
            isinstance(self.lnc, bool) or self.lnc not in target.lnc_choices
        ):
            raise OptionsError(
                f"invalid lnc={self.lnc!r} for target {self.target}",
                hint=f"use one of {', '.join(map(str, target.lnc_choices))} (NCC_EARG001)",
            )
        object.__setattr__(self, "lnc", target.resolve_lnc(self.lnc))
        if self.estimate is None:
            object.__setattr__(self, "estimate", target.default_estimate())
            object.__setattr__(self, "_estimate_defaulted", True)  # not a field: no option key
        estimates = ("off", *(n for n in target_names() if n != "cpu"))  # cpu: no cost model
        if self.estimate not in estimates:
            raise OptionsError(
                f"invalid estimate={self.estimate!r}", hint=f"use one of {', '.join(estimates)}"
            )
        if isinstance(self.optlevel, bool) or self.optlevel not in (1, 2, 3):
            raise OptionsError(f"invalid optlevel={self.optlevel!r}", hint="use 1, 2 or 3")
        if self.max_recompiles is not None and (
            isinstance(self.max_recompiles, bool)
            or not isinstance(self.max_recompiles, int)
            or self.max_recompiles < 0
        ):
            raise OptionsError(
                f"invalid max_recompiles={self.max_recompiles!r}",
                hint="use a non-negative integer, or leave it unset for no limit",
            )
        if self.buckets is not None and (
            not self.buckets
            or any(isinstance(b, bool) or not isinstance(b, int) or b <= 0 for b in self.buckets)
            or list(self.buckets) != sorted(set(self.buckets))
        ):
            raise OptionsError(
                f"invalid buckets={self.buckets!r}",
                hint="use strictly increasing positive integers, e.g. (128, 256, 512)",
            )


OPTION_KEYS: tuple[str, ...] = tuple(
    f.name for f in dataclasses.fields(NeuronConfig) if f.name != "extra"
)

#: option key -> environment variable
ENV_VARS: dict[str, str] = {
    "model_name": ENV_PREFIX + "MODEL_NAME",
    "dump_dir": ENV_PREFIX + "DUMP_DIR",
    "sixty_four_bit": ENV_PREFIX + "64BIT",
    "fallback": ENV_PREFIX + "FALLBACK",
    "verify": ENV_PREFIX + "VERIFY",
    "artifact": ENV_PREFIX + "ARTIFACT",
    "max_recompiles": ENV_PREFIX + "MAX_RECOMPILES",
    "strict_recompile": ENV_PREFIX + "STRICT_RECOMPILE",
    "buckets": ENV_PREFIX + "BUCKETS",
    "target": ENV_PREFIX + "TARGET",
    "lnc": ENV_PREFIX + "LNC",
    "optlevel": ENV_PREFIX + "OPTLEVEL",
    "estimate": ENV_PREFIX + "ESTIMATE",
    "flash_attention": ENV_PREFIX + "FLASH_ATTENTION",
    "aot_cache": ENV_PREFIX + "AOT_CACHE",
}


def _parse_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise OptionsError(f"invalid boolean for {key}: {value!r}", hint="use 1/0 or true/false")


def _parse_int(key: str, value: str) -> int:
    try:
        return int(value.strip())
    except ValueError:
        raise OptionsError(f"invalid integer for {key}: {value!r}", hint="e.g. 8") from None


def _parse_buckets(value: Any) -> tuple[int, ...]:
    """``"128,256,512"`` (env) or any sequence of ints (options)."""
    try:
        items = value.replace(",", " ").split() if isinstance(value, str) else list(value)
        return tuple(int(b) if isinstance(b, str) else b for b in items)
    except (TypeError, ValueError):
        raise OptionsError(
            f"invalid buckets: {value!r}", hint="e.g. NEURON_COMPILE_BUCKETS=128,256,512"
        ) from None


def load_config(
    options: dict[str, Any] | None = None, env: dict[str, str] | None = None
) -> NeuronConfig:
    """Build the config from ``options`` (keys may carry a ``neuron.`` prefix) and the environment."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    for key, var in ENV_VARS.items():
        if env.get(var) not in (None, ""):
            values[key] = env[var]
    for raw_key, value in (options or {}).items():
        key = raw_key.removeprefix("neuron.")
        if key not in OPTION_KEYS:
            raise OptionsError(
                f"unknown option {raw_key!r}",
                hint=f"valid keys: {', '.join(OPTION_KEYS)} (see docs/options.md)",
            )
        values[key] = value
    for key in ("verify", "strict_recompile", "flash_attention", "aot_cache"):
        if key in values:
            values[key] = _parse_bool(key, values[key])
    for key in ("max_recompiles", "lnc", "optlevel"):
        if isinstance(values.get(key), str):
            values[key] = _parse_int(key, values[key].removeprefix("-O"))
    if values.get("buckets") is not None:
        values["buckets"] = _parse_buckets(values["buckets"])
    return NeuronConfig(**values)
