"""NeuronConfig: options > env > defaults; unknown keys are coded errors."""

from __future__ import annotations

import pytest

from neuron_compile.config import ENV_VARS, OPTION_KEYS, load_config
from neuron_compile.errors import OptionsError


def test_defaults():
    cfg = load_config({}, env={})
    assert cfg.sixty_four_bit == "downcast" and cfg.verify is True and cfg.dump_dir is None


def test_every_option_has_a_prefixed_env_var():
    assert set(ENV_VARS) == set(OPTION_KEYS)
    assert all(v.startswith("NEURON_COMPILE_") for v in ENV_VARS.values())


def test_env_then_options_precedence():
    env = {
        "NEURON_COMPILE_64BIT": "error",
        "NEURON_COMPILE_VERIFY": "0",
        "NEURON_COMPILE_DUMP_DIR": "/d",
    }
    cfg = load_config({}, env=env)
    assert (cfg.sixty_four_bit, cfg.verify, cfg.dump_dir) == ("error", False, "/d")
    cfg = load_config({"sixty_four_bit": "downcast"}, env=env)
    assert cfg.sixty_four_bit == "downcast"


def test_bad_env_boolean_is_coded():
    with pytest.raises(OptionsError, match="NC001"):
        load_config({}, env={"NEURON_COMPILE_VERIFY": "maybe"})


def test_estimate_defaulted_only_when_neither_options_nor_env_set_it():
    assert load_config({}, env={}).estimate_defaulted
    assert not load_config({"estimate": "off"}, env={}).estimate_defaulted
    assert not load_config({}, env={"NEURON_COMPILE_ESTIMATE": "off"}).estimate_defaulted
    assert "estimate_defaulted" not in OPTION_KEYS and "_estimate_defaulted" not in OPTION_KEYS


@pytest.mark.parametrize("name", ["../../escaped", "a/b", "a\\b", ".."])
def test_a_model_name_that_is_a_path_is_refused(monkeypatch, tmp_path, name):
    """NEURON_COMPILE_MODEL_NAME="../../escaped" made dumps land outside the dump directory."""
    monkeypatch.setenv("NEURON_COMPILE_MODEL_NAME", name)
    with pytest.raises(OptionsError, match="NC001.*model_name"):
        load_config(None)
    monkeypatch.setenv("NEURON_COMPILE_MODEL_NAME", "gpt2_small.v2")
    assert load_config(None).model_name == "gpt2_small.v2"
