"""Rank-aware tooling: reports of several ranks merged (one row per cache key, with its ranks) and
rendered in every format; and, on two real gloo ranks under torchrun, dumps in ``rank<k>/``
folders, records carrying their rank, and a warning every rank raises shown once (rank 0)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import jsonschema
import pytest
import torch.distributed as dist
import xmlschema

from neuron_compile.dump import dump_path, dump_root
from neuron_compile.report import Finding, GraphEntry, Location, Report, formats
from neuron_compile.report.model import format_ranks
from neuron_compile.report.ranks import merge_reports, process_rank, torchrun_command
from neuron_compile.report.schema import REPORT_SCHEMA

SCHEMAS = Path(__file__).parent / "schemas"
ROOT = Path(__file__).resolve().parents[2]


def _graph(name: str, key: str, rank: int, **kw) -> GraphEntry:
    return GraphEntry(name, "forward", node_count=5, cache={"key": key}, ranks=[rank], **kw)


def _rank_reports() -> dict[int, Report]:
    """Rank 0 and rank 1 share graph k1 (under different names) and a graph break; each has a
    graph of its own; rank 1 crashed after compiling."""
    brk = dict(category="graph-break", code="NC601", message="graph break: print")
    where = Location("/src/train.py", 3)
    r0 = Report("train.py", "compile", duration_s=2.0, cache={"disk_hits": 1, "note": "x"})
    r0.graphs = [_graph("M_0_forward_0", "k1", 0, numerics="matched"), _graph("M_0_b", "k2", 0)]
    r0.findings = [
        Finding(**brk, location=where, count=2, ranks=[0]),
        Finding("fallback", "NC101", "aten.foo runs eagerly", graph="M_0_forward_0", ranks=[0]),
    ]
    r1 = Report("train.py", "compile", duration_s=3.0, cache={"disk_hits": 2}, crash="boom")
    r1.graphs = [_graph("M_3_forward_0", "k1", 1, numerics="mismatch"), _graph("N_1", "k3", 1)]
    r1.findings = [
        Finding(**brk, location=where, count=1, ranks=[1]),
        Finding("fallback", "NC101", "aten.foo runs eagerly", graph="M_3_forward_0", ranks=[1]),
    ]
    return {0: r0, 1: r1}


def test_format_ranks_compresses_runs():
    assert format_ranks([3, 0, 1, 2, 6]) == "0-3,6"
    assert format_ranks([1]) == "1" and format_ranks([0, 2]) == "0,2"


def test_merge_keeps_one_row_per_cache_key_with_its_ranks():
    merged = merge_reports(_rank_reports(), 2)
    assert merged.world_size == 2 and merged.duration_s == 3.0
    rows = {g.cache["key"]: g for g in merged.graphs}
    assert [rows[k].ranks for k in ("k1", "k2", "k3")] == [[0, 1], [0], [1]]
    assert rows["k1"].name == "M_0_forward_0"  # the lowest rank's row
    assert rows["k1"].numerics == "mismatch"  # the worst rank's comparison
    brk, fallback = merged.findings
    assert (brk.ranks, brk.count) == ([0, 1], 2)  # the most any one rank saw, not the sum
    # rank 1's finding names its own graph name: it lands on the merged row's name
    assert (fallback.ranks, fallback.graph) == ([0, 1], "M_0_forward_0")
    assert merged.cache == {"disk_hits": 3}  # counters summed
    assert merged.crash == "rank 1: boom"
    assert merged.counts()["graph-break"] == 2


def test_merged_report_validates_and_shows_ranks_in_every_format():
    merged = merge_reports(_rank_reports(), 2)
    doc = json.loads(formats.render_json(merged))
    jsonschema.validate(doc, REPORT_SCHEMA, cls=jsonschema.Draft202012Validator)
    assert doc["world_size"] == 2 and [g["ranks"] for g in doc["graphs"]] == [[0, 1], [0], [1]]
    assert Report.from_dict(doc).to_dict() == doc

    junit = formats.render_junit(merged, ("graph-break",))
    xmlschema.XMLSchema(str(SCHEMAS / "JUnit.xsd")).validate(junit)
    suite = ET.fromstring(junit).find("testsuite")
    names = [c.get("name") for c in suite.findall("testcase")]
    assert "M_0_forward_0 [ranks 0-1]" in names and "N_1 [rank 1]" in names
    assert "graph-break /src/train.py:3 [ranks 0-1]" in names
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["world_size"] == "2"

    sarif = json.loads(formats.render_sarif(merged, ("graph-break",)))
    schema = json.loads((SCHEMAS / "sarif-schema-2.1.0.json").read_text())
    jsonschema.validate(sarif, schema, cls=jsonschema.Draft4Validator)
    results = sarif["runs"][0]["results"]
    assert [r["properties"]["ranks"] for r in results] == [[0, 1], [0, 1]]
    assert results[0]["message"]["text"].endswith("[ranks 0-1]")

    md = formats.render_markdown(merged, ("graph-break",))
    assert "2 ranks ·" in md and "| est. device | notes | ranks |" in md
    assert md.count("| 0-1 |") == 1 and md.count("| 1 |") >= 1
    term = formats.render_terminal(merged, ("graph-break",))
    assert "2 ranks" in term.splitlines()[0] and "[ranks 0-1]" in term


def test_one_rank_reports_read_as_before():
    one = _rank_reports()[0]
    text = formats.render_terminal(one) + formats.render_markdown(one) + formats.render_junit(one)
    assert "rank" not in text and "| ranks |" not in text


def test_reports_of_schema_1_1_load_with_rank_0():
    doc = merge_reports({0: _rank_reports()[0]}, 1).to_dict()
    for part in (*doc["graphs"], *doc["findings"]):
        del part["ranks"]
    del doc["world_size"]
    old = Report.from_dict({**doc, "schema_version": "1.1"})
    assert old.world_size == 1 and {tuple(g.ranks) for g in old.graphs} == {(0,)}
    assert {tuple(f.ranks) for f in old.findings} == {(0,)}


def test_process_rank_falls_back_to_torchrun_env(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert process_rank() == (3, 4)
    monkeypatch.delenv("RANK")
    assert process_rank() == (0, 1)


def test_dump_root_is_the_dump_dir_without_a_process_group(tmp_path):
    assert dump_root(SimpleNamespace(dump_dir=None)) is None
    assert dump_path(SimpleNamespace(dump_dir=""), "g") is None
    cfg = SimpleNamespace(dump_dir=str(tmp_path))
    assert dump_root(cfg) == tmp_path and dump_path(cfg, "g", "passes") == tmp_path / "g/passes"


RANK_SCRIPT = textwrap.dedent(
    """
    import json, logging, warnings
    import torch
    import torch.distributed as dist
    import neuron_compile
    from neuron_compile.warn_once import once_set, warn_once
    from tests.custom_ops import cpu_scan

    dist.init_process_group("gloo")
    logged = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: logged.append(record.getMessage())
    logging.getLogger("neuron_compile").addHandler(handler)
    logging.getLogger("neuron_compile").setLevel(logging.INFO)
    seen = once_set()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            warn_once(seen, "same", "neuron-compile: the same on every rank", UserWarning)
        torch.compile(torch.nn.Linear(4, 2), backend="neuron")(torch.randn(3, 4))
        with torch.no_grad():  # an op without a lowering: a FallbackWarning on every rank
            torch.compile(lambda x: cpu_scan(x + 1) * 3, backend="neuron")(torch.randn(4))
    print(json.dumps({
        "rank": dist.get_rank(),
        "warned": [[w.category.__name__, str(w.message)] for w in caught],
        "logged": [m for m in logged if m.startswith("rank ")],
        "records": [[r.name, r.rank, list(r.fallback_ops)] for r in neuron_compile.metrics()],
    }))
    dist.destroy_process_group()
    """
)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> tuple[dict[int, dict], Path]:
    """RANK_SCRIPT on two gloo ranks under torchrun, dumping: (each rank's JSON line, dump dir)."""
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("no gloo")
    tmp = tmp_path_factory.mktemp("two-ranks")
    script = tmp / "ranks.py"
    script.write_text(RANK_SCRIPT)
    dump = tmp / "dump"
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {
        **os.environ,
        "PYTHONPATH": path,
        "OMP_NUM_THREADS": "1",
        "NEURON_COMPILE_DUMP_DIR": str(dump),
        "NEURON_COMPILE_CACHE_DIR": str(tmp / "cache"),
    }
    proc = subprocess.Popen(
        torchrun_command(2, [str(script)]),
        cwd=tmp,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a hung launch is killed whole, by its process group
    )
    try:
        out, err = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("the ranks hung")
    assert proc.returncode == 0, err[-4000:]
    lines = {d["rank"]: d for d in map(json.loads, filter(None, out.splitlines()))}
    assert sorted(lines) == [0, 1]
    return lines, dump


def test_two_ranks_record_their_rank_dump_apart_and_warn_once(two_ranks):
    lines, dump = two_ranks
    # warn_once: shown once, on rank 0; rank 1 logs it at INFO with its rank
    assert ["UserWarning", "neuron-compile: the same on every rank"] in lines[0]["warned"]
    assert lines[0]["logged"] == []
    assert "neuron-compile: the same on every rank" not in {m for _, m in lines[1]["warned"]}
    assert lines[1]["logged"][0] == "rank 1: UserWarning: neuron-compile: the same on every rank"
    for rank in (0, 1):
        (name, record_rank, _), (fallback, fallback_rank, eager) = lines[rank]["records"]
        assert (record_rank, fallback_rank, eager) == (rank, rank, ["nctest.cpu_scan.default"])
        assert (dump / f"rank{rank}" / name / "module.stablehlo.mlir").is_file()
        assert (dump / f"rank{rank}" / name / "meta.json").is_file()


def test_two_ranks_compiler_warnings_and_pass_dumps_follow_the_rank(two_ranks):
    """Needs compiler.py to warn through ``warn_once.warn`` and dump its passes to
    ``dump.dump_path`` (the lead's diff)."""
    lines, dump = two_ranks
    ours = [c for c, m in lines[0]["warned"] if "neuron-compile" in m]
    assert ours == ["UserWarning", "FallbackWarning"]
    assert [w for w in lines[1]["warned"] if "neuron-compile" in w[1]] == []
    assert [m.split(": ")[1] for m in lines[1]["logged"]] == ["UserWarning", "FallbackWarning"]
    for rank in (0, 1):
        for name, _, _ in lines[rank]["records"]:
            assert (dump / f"rank{rank}" / name / "passes").is_dir()
    assert sorted(p.name for p in dump.iterdir()) == ["rank0", "rank1"]
