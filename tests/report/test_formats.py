"""Every format is rendered from one report and validated against its schema."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import xmlschema

from neuron_compile.report import Report, formats
from neuron_compile.report.schema import REPORT_SCHEMA
from tests.report.samples import line_of

SCHEMAS = Path(__file__).parent / "schemas"
FAIL_ON = ("compile-error", "graph-break")


def test_json_validates_against_our_schema_and_round_trips(sample_run):
    report, _, _ = sample_run
    doc = json.loads(formats.render_json(report))
    jsonschema.Draft202012Validator.check_schema(REPORT_SCHEMA)
    jsonschema.validate(doc, REPORT_SCHEMA, cls=jsonschema.Draft202012Validator)
    assert doc["schema_version"] == "1.3" and doc["counts"]["graph-break"] == 2
    assert doc["world_size"] == 1 and {tuple(g["ranks"]) for g in doc["graphs"]} == {(0,)}
    assert doc["est_device_s_total"] > 0 and doc["est_target"] == "trn2"
    again = Report.from_dict(doc)
    assert again.to_dict() == report.to_dict()


def test_junit_validates_against_the_junit_xsd(sample_run, tmp_path):
    report, _, _ = sample_run
    text = formats.render_junit(report, FAIL_ON)
    xmlschema.XMLSchema(str(SCHEMAS / "JUnit.xsd")).validate(text)
    suite = ET.fromstring(text).find("testsuite")
    cases = suite.findall("testcase")
    # one test case per graph, plus one per finding that belongs to no graph (graph breaks)
    assert len(cases) == len(report.graphs) + 2
    failures = {c.get("name"): c.find("failure") for c in cases if c.find("failure") is not None}
    assert int(suite.get("failures")) == len(failures) == 3
    verifier = next(f for n, f in failures.items() if n.startswith("invalid_module"))
    assert verifier.get("type") == "NC103"
    assert f"tests/report/samples.py:{line_of('verifier')}" in verifier.get("message")
    assert f"graph-break tests/report/samples.py:{line_of('print')}" in failures


def test_sarif_validates_against_sarif_2_1_0_and_points_at_user_lines(sample_run):
    report, _, _ = sample_run
    doc = json.loads(formats.render_sarif(report, FAIL_ON))
    schema = json.loads((SCHEMAS / "sarif-schema-2.1.0.json").read_text())
    jsonschema.validate(doc, schema, cls=jsonschema.Draft4Validator)
    results = doc["runs"][0]["results"]
    assert len(results) == len(report.findings)
    by_rule = {}
    for r in results:
        by_rule.setdefault(r["ruleId"], []).append(r)
    (fallback,) = by_rule["NC101"]
    loc = fallback["locations"][0]["physicalLocation"]
    assert loc["artifactLocation"] == {"uri": "tests/report/samples.py", "uriBaseId": "%SRCROOT%"}
    assert loc["region"] == {"startLine": line_of("fallback")}
    assert fallback["level"] == "warning"  # not in FAIL_ON
    assert {r["level"] for r in by_rule["NC601"]} == {"error"}
    rule_ids = [r["id"] for r in doc["runs"][0]["tool"]["driver"]["rules"]]
    assert all(rule_ids[r["ruleIndex"]] == r["ruleId"] for r in results)


def test_markdown_and_terminal_summaries(sample_run):
    report, _, _ = sample_run
    md = formats.render_markdown(report, FAIL_ON)
    assert md.startswith(
        "## :x: neuron-compile check `tests/report/samples.py`: 3 gated finding(s)"
    )
    assert "| graph-break | 2 | yes |" in md and "| fallback | 1 | no |" in md
    assert f"| :x: | NC103 | `tests/report/samples.py:{line_of('verifier')}` |" in md
    assert md.count("\n|") > 15 and "<details><summary>Graphs</summary>" in md
    term = formats.render_terminal(report, FAIL_ON)
    assert "graph-break=2*" in term and "fallback=1 " in term
    assert f"x NC103 compile-error tests/report/samples.py:{line_of('verifier')}" in term
    assert "Estimated device time (trn2 roofline" in md and "est. device" in md
    assert "estimated device time (trn2 roofline, one call each)" in term


def test_write_all_writes_every_file_format(sample_run, tmp_path):
    report, _, _ = sample_run
    paths = formats.write_all(report, tmp_path, FAIL_ON)
    assert sorted(p.name for p in paths.values()) == [
        "report.json",
        "report.junit.xml",
        "report.md",
        "report.sarif",
    ]
