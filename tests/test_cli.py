"""The neuron-compile CLI, run as a real process."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "neuron_compile", *args], capture_output=True, text=True, timeout=120
    )


def test_help_lists_subcommands():
    proc = _cli("--help")
    assert proc.returncode == 0 and "info" in proc.stdout and "ops" in proc.stdout


def test_info_json_reports_versions_and_names():
    proc = _cli("--json", "info")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["versions"]["torch"].startswith("2.1")
    assert info["backend_names"] == ["neuron", "neuron_compile"]
    assert info["executor"].startswith("XLA:CPU")


def test_ops_json_lists_registered_lowerings():
    proc = _cli("--json", "ops")
    info = json.loads(proc.stdout)
    assert "aten.addmm.default" in info["ops"] and info["count"] == len(info["ops"]) > 50


def test_unknown_subcommand_fails_with_usage():
    proc = _cli("frobnicate")
    assert proc.returncode == 2 and "usage" in proc.stderr


def test_json_flag_after_the_subcommand():
    proc = _cli("info", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["backend_names"] == ["neuron", "neuron_compile"]


def test_precompile_passes_arguments_after_double_dash_to_the_script(monkeypatch):
    # Its help says script arguments go "after our options and --"; `--args "..."` also works.
    from neuron_compile import cli
    from neuron_compile.trainium import precompile

    seen = {}

    def fake_main(args, as_json=False):
        seen.update(script=args.script, script_args=args.script_args, args_str=args.args_str)
        return 0

    monkeypatch.setattr(precompile, "main", fake_main)
    assert cli.main(["precompile", "train.py", "--target", "trn2", "--", "--samples", "48"]) == 0
    assert seen == {"script": "train.py", "script_args": ["--samples", "48"], "args_str": ""}


def test_info_reads_the_cache_without_creating_it(tmp_path):
    root = tmp_path / "not-yet"
    proc = subprocess.run(
        [sys.executable, "-m", "neuron_compile", "info"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NEURON_COMPILE_CACHE_DIR": str(root)},
    )
    assert proc.returncode == 0, proc.stderr
    assert "not created yet" in proc.stdout and not root.exists()


def test_a_reader_that_leaves_early_gets_no_traceback():
    """`neuron-compile ops --json | head -1`: the pipe closes under the writer. It stops quietly
    with 128 + SIGPIPE, as `ls | head` does, instead of a BrokenPipeError traceback."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "neuron_compile", "ops", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout.read(1) == b"{"
    proc.stdout.close()  # the reader leaves; the rest of the JSON (> a pipe buffer) cannot go out
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + 13, err.decode()
    assert b"Traceback" not in err and b"BrokenPipe" not in err


def test_neuron_compile_log_accepts_switches_and_numbers_and_never_breaks_the_import():
    """`NEURON_COMPILE_LOG=1` made `import neuron_compile` (so every compile and every CLI
    command) raise `ValueError: Unknown level: '1'`."""
    probe = "import logging, neuron_compile; print(logging.getLogger('neuron_compile').level)"
    for value, level in (("1", 20), ("true", 20), ("10", 10), ("debug", 10), ("Warning", 30)):
        proc = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
            env={**os.environ, "NEURON_COMPILE_LOG": value},
        )  # fmt: skip
        assert proc.returncode == 0 and proc.stdout.split() == [str(level)], (value, proc.stderr)
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
        env={**os.environ, "NEURON_COMPILE_LOG": "bogus"},
    )  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.split() == ["0"]
    assert "NEURON_COMPILE_LOG='bogus' is not a logging level" in proc.stderr


def test_json_before_check_is_a_usage_error_not_ignored():
    """`neuron-compile --json check x.py` printed the text summary: check's --json takes a path."""
    proc = _cli("--json", "check", "tests.report.samples:run_clean")
    assert proc.returncode == 2 and "check TARGET --json report.json" in proc.stderr
