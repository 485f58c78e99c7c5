"""Targets as data, and target selection: options > NEURON_COMPILE_TARGET > auto-detect > cpu."""

from __future__ import annotations

import pytest

from neuron_compile import targets
from neuron_compile.config import ENV_VARS, load_config
from neuron_compile.errors import OptionsError
from neuron_compile.trainium import probe


def test_targets_are_data_with_the_documented_numbers():
    trn2, trn3 = targets.get_target("trn2"), targets.get_target("trn3")
    assert (trn2.neuronx_cc_target, trn3.neuronx_cc_target) == ("trn2", "trn3")
    assert trn2.lnc_choices == trn3.lnc_choices == (1, 2) and trn2.default_lnc == 2
    assert trn2.hbm_per_logical_core(2) == 24 * 2**30 and trn3.hbm_per_core_bytes == 18 * 2**30
    assert "float8_e4m3fn" in trn3.dtypes and "float8_e4m3fn" not in trn2.dtypes
    assert "AwsNeuronCustomNativeKernel" in trn2.custom_calls
    assert trn2.tiles.partition_max == 128 and trn3.tiles.sbuf_bytes_per_partition == 245_752
    assert trn3.peak_flops["float8"] == 2 * trn2.peak_flops["float8"] - 1e12
    assert trn2.peak_flops_per_logical_core("bfloat16", 2) == 158e12
    assert 0 < trn2.hbm_bandwidth < trn3.hbm_bandwidth
    assert targets.get_target("cpu") is targets.CPU and targets.CPU.lowering_keys == ("cpu",)
    assert trn2.lowering_keys == ("trn",) and not trn2.skips_lowering_when_cached


def test_default_is_cpu_without_a_device(monkeypatch):
    monkeypatch.delenv("NEURON_COMPILE_DETECTED_TARGET", raising=False)
    monkeypatch.setattr(probe, "has_device", lambda: False)
    cfg = load_config({}, env={})
    assert cfg.target == "cpu" and cfg.lnc is None


def test_auto_detects_the_device_family_when_the_runtime_is_present(monkeypatch):
    monkeypatch.delenv("NEURON_COMPILE_DETECTED_TARGET", raising=False)
    monkeypatch.setattr(probe, "has_device", lambda: True)
    monkeypatch.setattr(probe, "runtime_library", lambda: "/opt/aws/neuron/lib/libnrt.so.1")
    monkeypatch.setattr(probe, "instance_family", lambda: "trn3")
    assert load_config({}, env={}).target == "trn3"
    monkeypatch.setattr(probe, "runtime_library", lambda: None)  # device, no runtime
    assert load_config({}, env={}).target == "cpu"


def test_option_beats_env_and_lnc_defaults(monkeypatch):
    monkeypatch.delenv("NEURON_LOGICAL_NC_CONFIG", raising=False)
    env = {ENV_VARS["target"]: "trn3", ENV_VARS["lnc"]: "1", ENV_VARS["optlevel"]: "-O1"}
    cfg = load_config({}, env=env)
    assert (cfg.target, cfg.lnc, cfg.optlevel) == ("trn3", 1, 1)
    cfg = load_config({"target": "trn2"}, env={})
    assert (cfg.target, cfg.lnc, cfg.optlevel) == ("trn2", 2, 2)
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "1")  # the runtime's LNC wins over default
    assert load_config({"target": "trn2"}, env={}).lnc == 1


@pytest.mark.parametrize(
    "options", [{"target": "trn1"}, {"target": "trn2", "lnc": 4}, {"optlevel": 7}]
)
def test_invalid_target_settings_are_nc001(options):
    with pytest.raises(OptionsError, match="NC001"):
        load_config(options, env={})
