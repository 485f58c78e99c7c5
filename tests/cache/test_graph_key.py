"""Key components of a compiled graph: each one changes the key; nothing host-, rank- or
directory-specific enters it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from neuron_compile.cache import key as key_mod
from neuron_compile.cache.key import canonical_flags, executable_key, graph_key

TEXT = "module @m {\n  func.func public @main(%a: tensor<4xf32>) -> tensor<4xf32> {\n    return %a : tensor<4xf32>\n  }\n}\n"
IO = [[{"shape": [4], "dtype": "float32"}], [{"kind": "input", "index": 0}]]


def _key(**over):
    args = dict(io_specs=IO, artifact_form="portable", flags="")
    args.update(over)
    return graph_key(over.pop("text", TEXT), **{k: v for k, v in args.items() if k != "text"})


def test_same_inputs_same_key():
    assert _key().digest() == _key().digest()
    assert len(_key().digest()) == 64


@pytest.mark.parametrize(
    "component, change",
    [
        ("module", {"text": TEXT.replace("4xf32", "8xf32")}),
        ("io", {"io_specs": [[{"shape": [4], "dtype": "bfloat16"}], IO[1]]}),
        ("artifact_form", {"artifact_form": "bytecode"}),
        ("target", {"target": "trn2"}),
        ("lnc", {"lnc": "2"}),
        ("flags", {"flags": "--auto-cast=none"}),
        ("replica_groups", {"replica_groups": [[0, 1]]}),
    ],
)
def test_each_argument_component_changes_the_key(component, change):
    base, other = _key(), _key(**change)
    assert base.digest() != other.digest()
    assert base.explain(other) == [component]


@pytest.mark.parametrize("component", ["torch", "jaxlib", "stablehlo", "neuronx-cc", "nki"])
def test_each_toolchain_version_changes_the_key(monkeypatch, component):
    base = _key()
    versions = {**key_mod.toolchain_versions(), component: "9.9.9"}
    monkeypatch.setattr(key_mod, "toolchain_versions", lambda: versions)
    other = _key()
    assert base.explain(other) == [component]
    assert base.digest() != other.digest()


def test_package_source_and_schema_change_the_key(monkeypatch):
    base = _key()
    monkeypatch.setattr(key_mod, "package_source_hash", lambda: "0" * 16)
    assert base.explain(_key()) == ["package"]
    monkeypatch.setattr(key_mod, "SCHEMA_VERSION", key_mod.SCHEMA_VERSION + 1)
    assert base.explain(_key()) == ["package", "schema"]


def test_flags_default_to_neuron_cc_flags_env(monkeypatch):
    monkeypatch.setenv("NEURON_CC_FLAGS", "--model-type transformer -O2")
    from_env = graph_key(TEXT, io_specs=IO, artifact_form="portable")
    assert from_env.components()["flags"] == "--model-type=transformer -O2"
    monkeypatch.delenv("NEURON_CC_FLAGS")
    assert from_env.explain(graph_key(TEXT, io_specs=IO, artifact_form="portable")) == ["flags"]


def test_canonical_flags_ignore_spelling_and_order_but_not_repeats():
    assert canonical_flags("--b  --a 1") == canonical_flags("--a=1 --b") == "--a=1 --b"
    assert canonical_flags(["-O2", "--x=1"]) == canonical_flags("--x 1 -O2")
    assert canonical_flags("--i a --i b") != canonical_flags("--i b --i a")


def test_executable_key_adds_executor_host_and_artifact_only():
    exe = executable_key(_key(), "xla_cpu", b"artifact bytes")
    assert _key().explain(exe) == ["artifact", "executor", "host"]
    assert exe.digest() != executable_key(_key(), "xla_cpu", b"other bytes").digest()


def test_a_key_is_derived_from_its_components_in_any_order():
    from neuron_compile.cache.key import CacheKey, key_of_components

    key = _key()
    assert key_of_components(key.components()) == key.digest()
    assert CacheKey(tuple(reversed(key.parts))).digest() == key.digest()


_PRINT_KEY = f"""
import json
from neuron_compile.cache.key import graph_key
print(json.dumps(graph_key({TEXT!r}, io_specs={IO!r}, artifact_form="portable").digest()))
"""


def test_two_processes_two_dirs_two_ranks_give_identical_keys(tmp_path):
    """What makes entries shareable: rank, device index, working directory are not in the key."""
    digests = []
    for rank in (0, 1):
        cwd = tmp_path / f"rank{rank}"
        cwd.mkdir()
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "NEURON_RT_VISIBLE_CORES": str(rank),
            "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        }
        env.pop("NEURON_CC_FLAGS", None)
        out = subprocess.run(
            [sys.executable, "-c", _PRINT_KEY], cwd=cwd, env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        digests.append(json.loads(out.stdout.strip().splitlines()[-1]))
    key_mod.package_source_hash.cache_clear()  # the sources as the subprocesses read them
    assert digests[0] == digests[1] == _key().digest()  # and equal to this process's key
