"""Cache settings (neuron_compile/cache/settings.py): a bad value is ignored with one NC001 warning
naming the variable and the valid form, never a traceback, and never silently means another
thing. The crashes came from real runs: every compile and ``cache ls`` exited with a traceback."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from neuron_compile.cache import settings
from neuron_compile.cache.settings import DEFAULT_FAILURE_TTL, DEFAULT_MAX_BYTES, from_environ

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _fresh_warnings():
    settings._warned.clear()


def _env(tmp_path: Path, **values: str) -> dict[str, str]:
    return {"NEURON_COMPILE_CACHE_DIR": str(tmp_path), **values}


def test_good_values_parse():
    s = from_environ(
        {
            "NEURON_COMPILE_CACHE_DIR": "~/nc",
            "NEURON_COMPILE_CACHE_MAX_BYTES": "2G",
            "NEURON_COMPILE_CACHE_FAILURE_TTL": "60",
            "NEURON_COMPILE_CACHE_RETRY_FAILED": "yes",
            "NEURON_COMPILE_CACHE_ONLY": "off",
            "NEURON_COMPILE_CACHE_ALLOW_SHARED": "",
        }
    )
    assert s.root == Path("~/nc").expanduser() and s.max_bytes == 2 * 2**30
    assert (s.failure_ttl, s.retry_failed, s.cache_only, s.allow_shared_writable) == (
        60.0,
        True,
        False,
        False,
    )


@pytest.mark.parametrize(
    ("name", "value", "field", "default"),
    [
        ("NEURON_COMPILE_CACHE_MAX_BYTES", "inf", "max_bytes", DEFAULT_MAX_BYTES),
        ("NEURON_COMPILE_CACHE_MAX_BYTES", "1e999", "max_bytes", DEFAULT_MAX_BYTES),
        ("NEURON_COMPILE_CACHE_MAX_BYTES", "-1", "max_bytes", DEFAULT_MAX_BYTES),
        ("NEURON_COMPILE_CACHE_MAX_BYTES", "0", "max_bytes", DEFAULT_MAX_BYTES),
        ("NEURON_COMPILE_CACHE_MAX_BYTES", "1", "max_bytes", DEFAULT_MAX_BYTES),
        ("NEURON_COMPILE_CACHE_MAX_BYTES", "ten gigs", "max_bytes", DEFAULT_MAX_BYTES),
        ("NEURON_COMPILE_CACHE_FAILURE_TTL", "nan", "failure_ttl", DEFAULT_FAILURE_TTL),
        ("NEURON_COMPILE_CACHE_FAILURE_TTL", "inf", "failure_ttl", DEFAULT_FAILURE_TTL),
        ("NEURON_COMPILE_CACHE_FAILURE_TTL", "-5", "failure_ttl", DEFAULT_FAILURE_TTL),
        ("NEURON_COMPILE_CACHE_RETRY_FAILED", "maybe", "retry_failed", False),
        ("NEURON_COMPILE_CACHE_ONLY", "2", "cache_only", False),
        ("NEURON_COMPILE_CACHE_ALLOW_SHARED", "sure", "allow_shared_writable", False),
    ],
)
def test_a_bad_value_warns_once_naming_the_variable(tmp_path, caplog, name, value, field, default):
    with caplog.at_level(logging.WARNING, logger="neuron_compile.cache.settings"):
        first = from_environ(_env(tmp_path, **{name: value}))
        from_environ(_env(tmp_path, **{name: value}))
    assert getattr(first, field) == default
    [record] = caplog.records  # once, not per cache built
    assert "NC001" in record.message and name in record.message and "valid:" in record.message


def test_a_directory_of_an_unknown_user_warns_and_uses_the_default(caplog, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="neuron_compile.cache.settings"):
        s = from_environ({"NEURON_COMPILE_CACHE_DIR": "~nobody_here_at_all/nc"})
    assert s.root == tmp_path / "neuron-compile"
    assert "NEURON_COMPILE_CACHE_DIR" in caplog.text


def test_off_words_and_a_blank_directory(caplog):
    for off in ("off", "0", "", "none"):
        assert from_environ({"NEURON_COMPILE_CACHE_DIR": off}) is None
    assert not caplog.records
    with caplog.at_level(logging.WARNING, logger="neuron_compile.cache.settings"):
        assert from_environ({"NEURON_COMPILE_CACHE_DIR": " "}) is None
    assert "blank" in caplog.text  # not silent: probably a quoting slip


@pytest.mark.parametrize(
    "env",
    [
        {"NEURON_COMPILE_CACHE_MAX_BYTES": "inf"},
        {"NEURON_COMPILE_CACHE_MAX_BYTES": "1e999"},
        {"NEURON_COMPILE_CACHE_DIR": "~nobody_here_at_all/nc"},
    ],
)
def test_cache_ls_runs_with_a_bad_setting(tmp_path, env):
    """``neuron-compile cache ls`` in a real process: a warning, exit 0, no traceback."""
    full = {**os.environ, "NEURON_COMPILE_CACHE_DIR": str(tmp_path / "c"), "HOME": str(tmp_path)}
    full.update(env)
    out = subprocess.run(
        [sys.executable, "-m", "neuron_compile", "cache", "ls", "--json"],
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr and "NC001" in out.stderr


def test_a_cached_failure_with_a_bad_ttl_raises_nc402_not_a_traceback(tmp_path, monkeypatch):
    from neuron_compile.cache.store import DiskCache
    from neuron_compile.errors import CachedCompileFailure

    monkeypatch.setenv("NEURON_COMPILE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("NEURON_COMPILE_CACHE_FAILURE_TTL", "nan")
    cache = DiskCache.from_env()
    key = "a" * 64

    def fail() -> dict[str, bytes]:
        raise RuntimeError("neuronx-cc said no")

    with pytest.raises(RuntimeError):
        cache.get_or_create(key, fail, graph_name="g", components={"x": "1"})
    with pytest.raises(CachedCompileFailure):
        cache.get_or_create(key, fail, graph_name="g", components={"x": "1"})
