"""Every ``NEURON_COMPILE_CACHE_*`` setting, parsed in one place.

A bad value never raises out of a compile and never silently means something else: it is ignored
with one warning per variable and value that names the variable, what was wrong and the valid form,
and the default applies. (``NEURON_COMPILE_CACHE_MAX_BYTES=inf`` used to crash every run with an
OverflowError, ``FAILURE_TTL=nan`` every cached failure, ``CACHE_DIR='~nobody/x'`` every run with a
RuntimeError; ``RETRY_FAILED=maybe`` silently meant false.) Pure stdlib, like the store.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from ..warn_once import first_time, once_set
from .signing import ENV_SIGNED_TIERS, ENV_SIGNING_KEY, TIER_SETS, Signer, make_signer

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 10 * 2**30
#: Below this a cache cannot hold one graph's artifact and executable: a typo, not a choice.
MIN_MAX_BYTES = 2**20
DEFAULT_FAILURE_TTL = 24 * 3600.0
ENV_DIR = "NEURON_COMPILE_CACHE_DIR"
ENV_REMOTE = "NEURON_COMPILE_REMOTE_CACHE"
ENV_MAX_BYTES = "NEURON_COMPILE_CACHE_MAX_BYTES"
ENV_FAILURE_TTL = "NEURON_COMPILE_CACHE_FAILURE_TTL"
ENV_RETRY_FAILED = "NEURON_COMPILE_CACHE_RETRY_FAILED"
ENV_CACHE_ONLY = "NEURON_COMPILE_CACHE_ONLY"
ENV_ALLOW_SHARED = "NEURON_COMPILE_CACHE_ALLOW_SHARED"
ENV_VARS = (
    ENV_DIR,
    ENV_REMOTE,
    ENV_MAX_BYTES,
    ENV_FAILURE_TTL,
    ENV_RETRY_FAILED,
    ENV_CACHE_ONLY,
    ENV_ALLOW_SHARED,
    ENV_SIGNING_KEY,
    ENV_SIGNED_TIERS,
)
_OFF = ("0", "off", "false", "no", "none")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", *_OFF)
_SIZE_SUFFIX = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}

T = TypeVar("T")


def default_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "neuron-compile"


def parse_size(text: str) -> int:
    """``"10737418240"``, ``"10G"``, ``"512m"`` -> bytes (binary suffixes); ValueError unless a
    finite size of at least ``MIN_MAX_BYTES``."""
    clean = text.strip().lower().removesuffix("ib").removesuffix("b")
    scale = _SIZE_SUFFIX.get(clean[-1:], 1)
    number = float(clean[:-1] if scale > 1 else clean)
    if not math.isfinite(number) or number * scale < MIN_MAX_BYTES:
        raise ValueError(f"not a size of at least {MIN_MAX_BYTES} bytes")
    return int(number * scale)


def parse_seconds(text: str) -> float:
    """A finite, non-negative number of seconds (ValueError otherwise)."""
    seconds = float(text)
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError("not a finite, non-negative number of seconds")
    return seconds


def parse_flag(text: str) -> bool:
    """``1/true/yes/on`` or ``0/false/no/off`` (and empty): anything else is a ValueError."""
    word = text.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ValueError("not a boolean")


def parse_tiers(text: str) -> str:
    """A ``NEURON_COMPILE_CACHE_SIGNED_TIERS`` value: ``shared`` or ``all``."""
    word = text.strip().lower()
    if word not in TIER_SETS:
        raise ValueError("not a tier set")
    return word


def expand_path(text: str) -> Path:
    """``text`` with ``~`` expanded; ValueError when the user it names does not exist."""
    try:
        return Path(text).expanduser()
    except RuntimeError as exc:  # "Could not determine home directory"
        raise ValueError(str(exc)) from None


_warned: set[tuple[str, str]] = once_set()


def _warn_once(name: str, value: str, why: str, valid: str, fallback: str) -> None:
    if not first_time(_warned, (name, value)):
        return
    log.warning(
        "[NC001] ignoring %s=%r: %s; valid: %s; using %s", name, value, why, valid, fallback
    )


def _read(
    env: Mapping[str, str], name: str, parse: Callable[[str], T], default: T, valid: str
) -> T:
    raw = env.get(name)
    if raw is None or (raw == "" and parse is not parse_flag):
        return default
    try:
        return parse(raw)
    except (ValueError, OverflowError) as exc:
        _warn_once(name, raw, str(exc) or "unreadable", valid, f"the default ({default})")
        return default


@dataclass(frozen=True)
class CacheSettings:
    """What ``DiskCache`` is built from (``DiskCache.from_env``)."""

    root: Path
    remote: Path | None
    max_bytes: int
    failure_ttl: float
    retry_failed: bool
    cache_only: bool
    allow_shared_writable: bool
    #: The team key (signing.py), or None when entries are neither signed nor checked.
    signer: Signer | None = None


def from_environ(env: Mapping[str, str] | None = None) -> CacheSettings | None:
    """The cache settings of ``env`` (default ``os.environ``); None when the cache is off."""
    env = os.environ if env is None else env
    raw_dir = env.get(ENV_DIR)
    root: Path | None = None
    if raw_dir is not None:
        word = raw_dir.strip().lower()
        if word in ("", *_OFF):
            if raw_dir and not word:  # whitespace: probably a quoting slip, not a decision
                _warn_once(ENV_DIR, raw_dir, "blank", "a directory, or off", "no cache")
            return None
        try:
            root = expand_path(raw_dir)
        except ValueError as exc:
            _warn_once(ENV_DIR, raw_dir, str(exc), "a directory", "the default directory")
    remote: Path | None = None
    if env.get(ENV_REMOTE, "").strip():
        try:
            remote = expand_path(env[ENV_REMOTE])
        except ValueError as exc:
            _warn_once(ENV_REMOTE, env[ENV_REMOTE], str(exc), "a directory", "no remote")
    flag = "1/true/yes/on or 0/false/no/off"
    return CacheSettings(
        root=root or default_root(),
        remote=remote,
        max_bytes=_read(env, ENV_MAX_BYTES, parse_size, DEFAULT_MAX_BYTES, "e.g. 10G or 512M"),
        failure_ttl=_read(
            env, ENV_FAILURE_TTL, parse_seconds, DEFAULT_FAILURE_TTL, "seconds, e.g. 3600"
        ),
        retry_failed=_read(env, ENV_RETRY_FAILED, parse_flag, False, flag),
        cache_only=_read(env, ENV_CACHE_ONLY, parse_flag, False, flag),
        allow_shared_writable=_read(env, ENV_ALLOW_SHARED, parse_flag, False, flag),
        signer=_signer(env),
    )


def _signer(env: Mapping[str, str]) -> Signer | None:
    path = env.get(ENV_SIGNING_KEY, "")
    if not path.strip():
        return None
    raw = env.get(ENV_SIGNED_TIERS, "").strip() or "shared"
    try:
        tiers = parse_tiers(raw)
    except ValueError as exc:  # a typo must not leave a tier unchecked: cover them all
        _warn_once(ENV_SIGNED_TIERS, raw, str(exc), "shared or all", "all")
        tiers = "all"
    return make_signer(path, tiers)
