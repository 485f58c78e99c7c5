"""Backend configuration: one frozen dataclass built from ``options`` and ``NEURON_COMPILE_*`` env vars.

Precedence: ``torch.compile(..., options={...})`` > environment > defaults. Unknown option keys are
errors (NC001) that name the closest valid key and list the others, because a silently ignored
typo costs users a multi-minute Trainium compile to discover; so are invalid values (with the
closest valid value when there is a fixed set), from options or from the environment. A set
``NEURON_COMPILE_*`` variable that the package does not read but that is close to one it does
(a typo) is warned about once.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import OptionsError
from .warn_once import NeuronCompileWarning, first_time, once_set, warn

ENV_PREFIX = "NEURON_COMPILE_"


class UnknownEnvVarWarning(NeuronCompileWarning):
    """A set ``NEURON_COMPILE_*`` variable the package does not read, close to one it does."""


def did_you_mean(value: object, choices: Iterable[object]) -> str:
    """``"; did you mean 'fallback'?"`` for the choice closest to ``value``, else ``""``."""
    close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _check_choice(key: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise OptionsError(
            f"invalid {key}={value!r}{did_you_mean(value, choices)}",
            hint=f"use one of {', '.join(choices)}",
            key=key,
        )


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
        _check_choice("sixty_four_bit", self.sixty_four_bit, _SIXTY_FOUR_BIT)
        _check_choice("fallback", self.fallback, _FALLBACK)
        _check_choice("artifact", self.artifact, _ARTIFACTS)
        from .targets import get_target, resolve_target, target_choices, target_names

        _check_choice("target", self.target, tuple(target_choices()))
        object.__setattr__(self, "target", resolve_target(self.target))
        target = get_target(self.target)
        if self.lnc is not None and (
            isinstance(self.lnc, bool) or self.lnc not in target.lnc_choices
        ):
            raise OptionsError(
                f"invalid lnc={self.lnc!r} for target {self.target}",
                hint=f"use one of {', '.join(map(str, target.lnc_choices))} (NCC_EARG001)",
                key="lnc",
            )
        object.__setattr__(self, "lnc", target.resolve_lnc(self.lnc))
        if self.estimate is None:
            object.__setattr__(self, "estimate", target.default_estimate())
            object.__setattr__(self, "_estimate_defaulted", True)  # not a field: no option key
        estimates = ("off", *(n for n in target_names() if n != "cpu"))  # cpu: no cost model
        _check_choice("estimate", self.estimate, estimates)
        if isinstance(self.optlevel, bool) or self.optlevel not in (1, 2, 3):
            raise OptionsError(
                f"invalid optlevel={self.optlevel!r}", hint="use 1, 2 or 3", key="optlevel"
            )
        if self.max_recompiles is not None and (
            isinstance(self.max_recompiles, bool)
            or not isinstance(self.max_recompiles, int)
            or self.max_recompiles < 0
        ):
            raise OptionsError(
                f"invalid max_recompiles={self.max_recompiles!r}",
                hint="use a non-negative integer, or leave it unset for no limit",
                key="max_recompiles",
            )
        name = self.model_name
        if name is not None and (
            not isinstance(name, str) or name in ("", ".", "..") or any(c in name for c in "/\\\0")
        ):
            # It names dump folders and failure bundles: "../x" wrote outside dump_dir.
            raise OptionsError(
                f"invalid model_name={name!r}",
                hint="use a plain name without path separators, e.g. 'gpt2_small'",
                key="model_name",
            )
        if self.buckets is not None and (
            not self.buckets
            or any(isinstance(b, bool) or not isinstance(b, int) or b <= 0 for b in self.buckets)
            or list(self.buckets) != sorted(set(self.buckets))
        ):
            raise OptionsError(
                f"invalid buckets={self.buckets!r}",
                hint="use strictly increasing positive integers, e.g. (128, 256, 512)",
                key="buckets",
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
_ENV_KEYS = frozenset(ENV_VARS.values())


def _parse_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise OptionsError(
        f"invalid boolean for {key}: {value!r}", hint="use 1/0 or true/false", key=key
    )


def _parse_int(key: str, value: str) -> int:
    try:
        return int(value.strip())
    except ValueError:
        raise OptionsError(
            f"invalid integer for {key}: {value!r}", hint="e.g. 8", key=key
        ) from None


def _parse_buckets(value: Any) -> tuple[int, ...]:
    """``"128,256,512"`` (env) or any sequence of ints (options)."""
    try:
        items = value.replace(",", " ").split() if isinstance(value, str) else list(value)
        return tuple(int(b) if isinstance(b, str) else b for b in items)
    except (TypeError, ValueError):
        raise OptionsError(
            f"invalid buckets: {value!r}",
            hint="e.g. NEURON_COMPILE_BUCKETS=128,256,512",
            key="buckets",
        ) from None


_warned_env_names = once_set()


def _warn_unknown_env_names(env: Mapping[str, str]) -> None:
    """Warn once per name about a set ``NEURON_COMPILE_*`` variable the package does not read
    but that is close to one it does (a typo); other unknown names (a test suite's own) pass."""
    names = [n for n in env if n.startswith(ENV_PREFIX) and n not in _ENV_KEYS]
    if not names:
        return
    known = known_env_vars()
    for name in names:
        close = closest_env_var(name)
        if name not in known and close and first_time(_warned_env_names, name):
            warn(
                f"[NC001] {name} is not a variable neuron-compile reads; did you mean "
                f"{close}? (`neuron-compile info` lists the ones set)",
                UnknownEnvVarWarning,
            )


#: ``NEURON_COMPILE_*`` variables that are neither option env vars (``ENV_VARS``) nor cache
#: settings (``cache.settings.ENV_VARS``); docs/options.md, "Other environment variables".
OTHER_ENV_VARS = (
    "NEURON_COMPILE_LOG",
    "NEURON_COMPILE_LINT_EACH_PASS",
    "NEURON_COMPILE_MALLOC_RETAIN_MB",
    "NEURON_COMPILE_DISABLE_DEVICE",
    "NEURON_COMPILE_NEURONX_CC",
    "NEURON_COMPILE_NEURONX_CC_TIMEOUT",
    "NEURON_COMPILE_XLA_COORDINATOR",
    "NEURON_COMPILE_PRECOMPILE_DIR",
    "NEURON_COMPILE_RANK_REPORT_DIR",
    "NEURON_COMPILE_DETECTED_TARGET",
)


def known_env_vars() -> list[str]:
    """Every ``NEURON_COMPILE_*`` variable the package reads."""
    from .cache import settings

    return sorted({*ENV_VARS.values(), *settings.ENV_VARS, *OTHER_ENV_VARS})


def closest_env_var(name: str) -> str | None:
    """The known variable ``name`` most likely misspells, or None. Compared without the shared
    prefix, which would make every name look close."""
    suffixes = [k.removeprefix(ENV_PREFIX) for k in known_env_vars()]
    close = difflib.get_close_matches(name.removeprefix(ENV_PREFIX), suffixes, 1, 0.75)
    return f"{ENV_PREFIX}{close[0]}" if close else None


def load_config(
    options: dict[str, Any] | None = None, env: dict[str, str] | None = None
) -> NeuronConfig:
    """Build the config from ``options`` (keys may carry a ``neuron.`` prefix) and the environment."""
    env = os.environ if env is None else env
    _warn_unknown_env_names(env)
    values: dict[str, Any] = {}
    from_env: dict[str, str] = {}  # option key -> the variable its value came from
    for key, var in ENV_VARS.items():
        if env.get(var) not in (None, ""):
            values[key] = env[var]
            from_env[key] = var
    for raw_key, value in (options or {}).items():
        key = raw_key.removeprefix("neuron.")
        if key not in OPTION_KEYS:
            raise OptionsError(
                f"unknown option {raw_key!r}{did_you_mean(key, OPTION_KEYS)}",
                hint=f"valid keys: {', '.join(OPTION_KEYS)} (see docs/options.md)",
            )
        values[key] = value
        from_env.pop(key, None)
    try:
        return _config_from(values)
    except OptionsError as err:
        var = from_env.get(getattr(err, "key", None) or "")
        if var is None:
            raise
        raise OptionsError(
            f"{var}={env[var]!r}: {err.what}", hint=err.hint, key=err.key, env_var=var
        ) from None


def _config_from(values: dict[str, Any]) -> NeuronConfig:
    for key in ("verify", "strict_recompile", "flash_attention", "aot_cache"):
        if key in values:
            values[key] = _parse_bool(key, values[key])
    for key in ("max_recompiles", "lnc", "optlevel"):
        if isinstance(values.get(key), str):
            values[key] = _parse_int(key, values[key].removeprefix("-O"))
    if values.get("buckets") is not None:
        values["buckets"] = _parse_buckets(values["buckets"])
    return NeuronConfig(**values)
