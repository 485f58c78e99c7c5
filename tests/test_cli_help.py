"""Every ``neuron-compile`` ``--help`` text matches the parser behind it.

The command tree is read from the parser (``cli.build_parser``), never from a list kept here, so
a new subcommand is checked as soon as it exists: its ``--help`` exits 0, and every ``--flag``
its help names is a flag that command accepts (its own, or one of a parent command it sits
under, such as the global ``--json``). ``info`` prints what its help promises: the
``NEURON_COMPILE_*`` variables that are set, in text and in ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

import pytest

from neuron_compile import cli, config

# ``--flag``, not ``--`` alone (``check TARGET -- ARGS``) nor a word inside another one.
_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def _tree(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = (), parents: tuple = ()
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser, tuple]]:
    """``(command path, its parser, its parents' parsers)`` for every command, root first."""
    found = [(path, parser, parents)]
    for action in parser._actions:  # noqa: SLF001
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for name, sub in action.choices.items():
                found += _tree(sub, (*path, name), (*parents, parser))
    return found


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}  # noqa: SLF001


COMMANDS = _tree(cli.build_parser())


def test_the_tree_holds_every_command_and_nested_ones():
    paths = {path for path, _p, _parents in COMMANDS}
    expected = {("info",), ("ops",), ("check",), ("precompile",), ("buckets", "plan")}
    expected |= {("cache", c) for c in ("ls", "du", "verify", "explain", "keygen")}
    assert expected <= paths


@pytest.mark.parametrize(
    "path", [path for path, _p, _parents in COMMANDS], ids=lambda p: " ".join(p) or "top"
)
def test_help_exits_0_and_names_only_flags_that_exist(path, capsys):
    parser, parents = next((p, ps) for q, p, ps in COMMANDS if q == path)
    with pytest.raises(SystemExit) as exited:
        cli.main([*path, "--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: neuron-compile"), text[:200]
    accepted = _flags(parser).union(*(_flags(p) for p in parents))
    named = set(_FLAG.findall(text))
    assert named, f"{path}: no flag in its help (not even --help?)"
    assert sorted(named - accepted) == [], f"`neuron-compile {' '.join(path)} --help`"


def test_the_flag_check_catches_a_flag_the_parser_lacks(capsys):
    # The check above must be able to fail: a help text naming a flag that does not exist.
    parser = argparse.ArgumentParser(prog="neuron-compile demo")
    parser.add_argument("--real", help="like --imaginary, but real")
    text = parser.format_help()
    assert sorted(set(_FLAG.findall(text)) - _flags(parser)) == ["--imaginary"]


def test_help_runs_as_a_process_for_a_nested_command():
    proc = subprocess.run(
        [sys.executable, "-m", "neuron_compile", "cache", "ls", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "metrics()" in proc.stdout and "TinyGPT_forward_0" in proc.stdout


def _info(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NEURON_COMPILE_")}
    return subprocess.run(
        [sys.executable, "-m", "neuron_compile", "info", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**clean, **env},
    )


def test_info_prints_the_env_vars_its_help_promises(tmp_path):
    help_text = _info("--help", env={}).stdout
    assert "NEURON_COMPILE_* env vars that are set" in " ".join(help_text.split())
    env = {
        "NEURON_COMPILE_CACHE_DIR": str(tmp_path / "c"),
        "NEURON_COMPILE_FALLBACK": "error",
        "NEURON_COMPILE_FALBACK": "cpu",  # a typo: not read, and said so
    }
    proc = _info(env=env)
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if "NEURON_COMPILE_" in ln]
    assert any(f"NEURON_COMPILE_CACHE_DIR={tmp_path / 'c'}" in ln for ln in lines)
    assert any("NEURON_COMPILE_FALLBACK=error" in ln for ln in lines)
    typo = next(ln for ln in lines if "NEURON_COMPILE_FALBACK=cpu" in ln)
    assert "not read" in typo and "did you mean NEURON_COMPILE_FALLBACK?" in typo

    data = json.loads(_info("--json", env=env).stdout)["env"]
    assert data["set"] == dict(sorted(env.items()))
    assert data["unknown"] == {"NEURON_COMPILE_FALBACK": "NEURON_COMPILE_FALLBACK"}
    assert data["known"]["NEURON_COMPILE_FALLBACK"] == "error"
    assert data["known"]["NEURON_COMPILE_64BIT"] is None
    assert "NEURON_COMPILE_FALBACK" not in data["known"]


def test_info_says_when_no_env_var_is_set(tmp_path):
    proc = _info(env={"XDG_CACHE_HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert "no NEURON_COMPILE_* variable set" in proc.stdout


def test_known_env_vars_are_every_one_the_package_reads():
    # The same scan the docs sync test uses: a variable read in the code and missing from
    # `info --json` would be invisible to the user.
    from tests.test_docs_sync import _code_env_vars

    assert sorted(_code_env_vars() - set(config.known_env_vars())) == []
    assert sorted(set(config.known_env_vars()) - _code_env_vars()) == []


# ---- flags the docs show on a neuron-compile command line ---------------------------------------
def _doc_command_lines() -> list[tuple[str, str]]:
    """``(doc name, command text)`` for each ``neuron-compile ...`` in a code block or span: the
    text up to a ``#`` comment and before `` -- `` (what follows goes to the user's script)."""
    from tests.test_docs_sync import DOCS

    found = []
    for doc in DOCS:
        text = doc.read_text()
        fenced = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.M | re.S)
        rest = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.M | re.S)
        chunks = [ln for block in fenced for ln in block.splitlines()]
        chunks += re.findall(r"`([^`\n]+)`", rest)
        for chunk in chunks:
            m = re.search(r"\bneuron-compile ([a-z].*)", chunk)
            if m:
                found.append((doc.name, m.group(1).split(" #")[0].split(" -- ")[0]))
    return found


def test_flags_in_documented_command_lines_exist():
    by_path = {path: (parser, parents) for path, parser, parents in COMMANDS}
    wrong = []
    lines = _doc_command_lines()
    assert len(lines) > 20  # the docs show many command lines: the scan must find them
    for doc, line in lines:
        words = re.findall(r"[a-z][a-z-]*", line)
        path = (words[0],)
        if path not in by_path:
            continue  # an unknown command: test_docs_sync reports it
        subs = [(words[0], w) for w in words[1:] if (words[0], w) in by_path]
        # `cache ls | du | verify [--quarantine]`: a flag of any subcommand the line names
        paths = subs or [path]
        accepted = set().union(
            *(_flags(by_path[p][0]).union(*map(_flags, by_path[p][1])) for p in paths)
        )
        wrong += [(doc, line, f) for f in _FLAG.findall(line) if f not in accepted]
    assert wrong == []
