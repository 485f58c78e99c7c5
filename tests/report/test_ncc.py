"""neuronx-cc NCC_ codes: parsed from log lines and triaged by the SDK's error-code table."""

from __future__ import annotations

import pytest

from neuron_compile.trainium.triage import parse_ncc, triage

LOG = """\
2026-11-30 08:00:01 INFO compiling module.mlir
ERROR 1234 [neuronx-cc]: NCC_EVRF064: HLO verifier failed: operand shapes differ
ERROR 1234 [neuronx-cc]: [NCC_EOOM001] Tensors exceed the HBM capacity of the target
ERROR 1234 [neuronx-cc]: NCC_EVRF064: HLO verifier failed (repeated)
internal: NCC_IXTP002 something internal
"""


def test_parse_keeps_first_of_each_code_in_order():
    found = parse_ncc(LOG)
    assert [d.code for d in found] == ["NCC_EVRF064", "NCC_EOOM001", "NCC_IXTP002"]
    assert found[0].message == "HLO verifier failed: operand shapes differ"
    assert (found[0].group, found[0].bucket) == ("EVRF ops and dtypes", "lowering bug")
    assert found[1].bucket == "capacity" and "split the graph" in found[1].action
    assert found[2].bucket == "internal"
    assert parse_ncc("no codes here; NCC_ alone; XNCC_EVRF001x") == []


@pytest.mark.parametrize(
    "code, group, bucket",
    [
        ("NCC_EMOD025", "model/frontend", "user-fixable shape/dtype"),
        ("NCC_EUOC002", "model/frontend", "unsupported op/pattern"),
        ("NCC_EHCA005", "model/frontend", "lowering bug"),
        ("NCC_EARG001", "configuration", "configuration"),
        ("NCC_ESPP047", "dtypes/constants", "user-fixable shape/dtype"),
        ("NCC_EVRF001", "EVRF ops and dtypes", "unsupported op/pattern"),
        ("NCC_EVRF035", "EVRF integer datapath", "user-fixable shape/dtype"),
        ("NCC_EVRF059", "EVRF NKI", "NKI toolchain/cache"),
        ("NCC_EVRF044", "EVRF ScaledMatmul", "lowering bug"),
        ("NCC_EVRF007", "EVRF ops and dtypes", "capacity"),
        ("NCC_EXTP004", "memory/size", "capacity"),
        ("NCC_EZZZ999", "unknown", "unknown"),
    ],
)
def test_triage_table(code, group, bucket):
    assert triage(code) == (group, bucket)
