"""``neuron-compile cache ...``: every subcommand with --json reflects the store state."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from neuron_compile.cache.store import DiskCache
from neuron_compile.cli import main

from .procs import key_of, payload

OLD = {"neuronx-cc": "2.28.1", "flags": "[]"}
NEW = {"neuronx-cc": "2.28.7", "flags": "[]"}


def _cli(capsys, *argv: str) -> tuple[int, object]:
    code = main(["cache", *argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


@pytest.fixture
def store(tmp_path):
    c = DiskCache(tmp_path / "c")
    a, b = key_of("cli-a"), key_of("cli-b")
    c.put(a, payload(a), graph_name="g", components=OLD, compile_seconds=3.0)
    c.put(b, payload(b), graph_name="g", components=NEW, compile_seconds=4.0)
    return c, a, b


def test_ls_du_verify_explain(capsys, store):
    c, a, b = store
    d = str(c.root)
    code, ls = _cli(capsys, "ls", "--dir", d)
    assert code == 0 and sorted(e["key"] for e in ls["entries"]) == sorted([a, b])
    assert {e["compile_seconds"] for e in ls["entries"]} == {3.0, 4.0}
    _, du = _cli(capsys, "du", "--dir", d)
    assert du["entries"] == 2 and du["bytes"] == c.du()
    code, ok = _cli(capsys, "verify", "--dir", d)
    assert code == 0 and ok == {
        "root": d,
        "ok": True,
        "entries": 2,
        "bytes": c.du(),
        "bad": 0,
        "problems": [],
    }
    _, explain = _cli(capsys, "explain", b[:12], "--dir", d)
    assert explain["nearest"] == a and explain["explain"] == ["neuronx-cc: 2.28.1 → 2.28.7"]
    (c.get(a).path / "part0.bin").write_bytes(b"flipped")
    code, bad = _cli(capsys, "verify", "--dir", d)
    assert code == 1 and [p["key"] for p in bad["problems"]] == [a]


def test_prune_clear_export_import_promote(capsys, store, tmp_path):
    c, a, b = store
    d = str(c.root)
    _, exported = _cli(capsys, "export", a, b, "-o", str(tmp_path / "b.tar"), "--dir", d)
    assert exported["keys"] == [a, b]
    _, pruned = _cli(capsys, "prune", "--keep", "neuronx-cc=2.28.7", "--dir", d)
    assert pruned == {"removed": [a]}
    _, pruned = _cli(capsys, "prune", "--older-than", "1", "--dir", d)
    assert pruned == {"removed": []}
    _, cleared = _cli(capsys, "clear", "--dir", d)
    assert cleared == {"removed": 1} and c.entries() == []
    _, imported = _cli(capsys, "import", str(tmp_path / "b.tar"), "--dir", d)
    assert sorted(imported["imported"]) == sorted([a, b]) and len(c.entries()) == 2
    remote = tmp_path / "remote"
    remote.mkdir(mode=0o700)
    _, promoted = _cli(capsys, "promote", "--dir", d, "--remote", str(remote))
    assert promoted["promoted"] == 2
    assert len(DiskCache(remote).entries()) == 2


def test_bad_bundle_is_an_error_exit(capsys, tmp_path):
    (tmp_path / "junk.tar").write_bytes(b"not a tar")
    assert main(["cache", "import", str(tmp_path / "junk.tar"), "--dir", str(tmp_path)]) == 2
    assert "NC403" in capsys.readouterr().err


def test_python_dash_m_cache_ls_json(store):
    c, a, b = store
    out = subprocess.run(
        [sys.executable, "-m", "neuron_compile", "cache", "ls", "--json", "--dir", str(c.root)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert sorted(e["key"] for e in json.loads(out.stdout)["entries"]) == sorted([a, b])


def test_cache_help(capsys):
    with pytest.raises(SystemExit) as info:
        main(["cache", "--help"])
    assert info.value.code == 0 and "promote" in capsys.readouterr().out


def test_export_by_graph_name_takes_exactly_that_models_entries(capsys, tmp_path):
    c = DiskCache(tmp_path / "c")
    keys = {
        name: key_of(name) for name in ("TinyGPT_forward_0", "TinyGPT_backward_0", "MLP_forward_0")
    }
    for name, k in keys.items():
        c.put(k, payload(k), graph_name=name, components=NEW)
    out = tmp_path / "gpt.tar"
    code, res = _cli(capsys, "export", "--dir", str(c.root), "--graph", "TinyGPT_*", "-o", str(out))
    assert code == 0
    assert sorted(res["keys"]) == sorted([keys["TinyGPT_forward_0"], keys["TinyGPT_backward_0"]])
    assert sorted(DiskCache(tmp_path / "d").import_bundle(out)) == sorted(res["keys"])


def test_export_lists_the_keys_the_bundle_holds_and_promote_without_remote(capsys, store, tmp_path):
    # A host-specific executable named for export stays out of the bundle, and out of the
    # printed list; promote without a remote reports null, not the string "None".
    c, a, b = store
    exe = key_of("cli-exe")
    c.put(exe, payload(exe), graph_name="g.executable", components={}, meta={"local_only": True})
    out = tmp_path / "b.tar"
    code, exported = _cli(capsys, "export", a, exe, "-o", str(out), "--dir", str(c.root))
    assert code == 0 and exported["keys"] == [a]
    assert DiskCache(tmp_path / "dest").import_bundle(out) == [a]
    code, promoted = _cli(capsys, "promote", "--dir", str(c.root))
    assert promoted["remote"] is None and promoted["promoted"] == 0


@pytest.mark.parametrize(
    "argv", [["--older-than", "-5"], ["--older-than", "nan"], ["--keep", "foo"]]
)
def test_prune_rejects_arguments_that_would_match_everything(capsys, store, argv):
    """`prune --older-than -5` removed every entry and exited 0; `--keep foo` printed a Python
    error about dictionary update sequences. Both are usage errors (exit 2), nothing removed."""
    c, a, b = store
    with pytest.raises(SystemExit) as exit_:
        main(["cache", "prune", *argv, "--dir", str(c.root), "--json"])
    assert exit_.value.code == 2 and "expected" in capsys.readouterr().err
    assert {e.key for e in c.entries()} == {a, b}


def test_maintenance_commands_print_text_without_json(capsys, store, tmp_path):
    """Without --json, prune, clear, export and import printed raw JSON dicts."""
    c, a, b = store
    d = str(c.root)
    assert main(["cache", "export", a, "-o", str(tmp_path / "b.tar"), "--dir", d]) == 0
    assert capsys.readouterr().out == f"exported 1 entries to {tmp_path / 'b.tar'}\n"
    assert main(["cache", "prune", "--keep", "neuronx-cc=2.28.7", "--dir", d]) == 0
    assert capsys.readouterr().out == f"removed 1 entries\n  {a[:16]}\n"
    assert main(["cache", "import", str(tmp_path / "b.tar"), "--dir", d]) == 0
    assert capsys.readouterr().out == f"imported 1 entries\n  {a[:16]}\n"
    assert main(["cache", "clear", "--dir", d]) == 0
    out = capsys.readouterr().out
    assert out == "removed 2 entries\n" and "{" not in out


@pytest.mark.parametrize("cmd", ["ls", "du", "clear", "prune"])
def test_a_cache_dir_that_is_a_file_is_nc404_for_every_command(capsys, tmp_path, cmd):
    """`cache ls --dir FILE` reported 0 entries and exit 0; `clear` hinted at ALLOW_SHARED."""
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("data")
    with pytest.raises(SystemExit, match=r"NC404.*is not a directory"):
        main(["cache", cmd, "--dir", str(not_a_dir)])
    assert not_a_dir.read_text() == "data"
