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
_ARTIFACTS = ("portable", "bytecode")


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
    #: Form of the artifact handed to the executor (and to neuronx-cc): ``portable`` = versioned
    #: StableHLO/VHLO bytecode; ``bytecode`` = plain MLIR bytecode of the verified module.
    artifact: str = "portable"
    #: Extra user metadata, not interpreted (kept in dumps). Not an option key.
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

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
                hint=f"valid keys: {', '.join(OPTION_KEYS)} (see README 'Options')",
            )
        values[key] = value
    if "verify" in values:
        values["verify"] = _parse_bool("verify", values["verify"])
    return NeuronConfig(**values)
