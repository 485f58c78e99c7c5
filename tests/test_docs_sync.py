"""The docs name every setting, code and command the code has (and nothing it does not).

Options, env vars, error codes and CLI commands are read from the code (config, a scan of
``neuron_compile/``, errors.py, the ``neuron-compile`` argument parser), never from a list kept
here, so a new one fails these tests until it is documented.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from unittest import mock

from neuron_compile import config
from neuron_compile.cache import settings
from neuron_compile.cache.cli import add_cache_parser
from tests.docs_gen import ERRORS_DOC, error_codes, errors_markdown
from tests.helpers import REPO_ROOT

README = REPO_ROOT / "README.md"
DOCS = [README, *sorted((REPO_ROOT / "docs").glob("*.md"))]
PACKAGE = REPO_ROOT / "neuron_compile"

README_MAX_LINES = 200


def _text() -> str:
    return "\n".join(p.read_text() for p in DOCS)


def _sources(*roots: Path) -> list[Path]:
    return [p for root in roots for p in sorted(root.rglob("*.py"))]


# ---- cache settings and commands ------------------------------------------------------------------
def test_every_cache_setting_is_documented():
    text = _text()
    assert [v for v in settings.ENV_VARS if v not in text] == []


def test_documented_cache_settings_exist():
    named = set(re.findall(r"NEURON_COMPILE_(?:REMOTE_)?CACHE_[A-Z_]+[A-Z]", _text()))
    assert sorted(named - set(settings.ENV_VARS)) == []


def test_every_cache_command_is_documented():
    sub = argparse.ArgumentParser().add_subparsers()
    commands = add_cache_parser(sub)._subparsers._group_actions[0].choices  # noqa: SLF001
    lines = [line for line in _text().splitlines() if "neuron-compile cache" in line]
    words = {w for line in lines for w in re.findall(r"[a-z]+", line)}
    assert [c for c in commands if c not in words] == []


# ---- links and size ------------------------------------------------------------------------------
def test_links_between_docs_resolve():
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)#:]+\.md)", doc.read_text()):
            assert (doc.parent / target).resolve().exists(), f"{doc.name} links to {target}"


def _anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    slug = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return slug.replace(" ", "-")


def test_anchors_of_links_between_docs_exist():
    for doc in DOCS:
        for target, anchor in re.findall(r"\]\(([^)#:\s]*\.md)?#([^)\s]+)\)", doc.read_text()):
            page = (doc.parent / target) if target else doc
            if not page.exists():
                continue  # test_links_between_docs_resolve reports it
            headings = re.findall(r"^#+ (.+)$", page.read_text(), flags=re.M)
            assert anchor in {_anchor(h) for h in headings}, (
                f"{doc.name} links to {target}#{anchor}"
            )


def test_readme_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


def test_readme_keeps_the_commands_ci_runs():
    text = README.read_text()
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    assert 'pip install torch==2.13.0 -e ".[test]" && pytest' in text
    assert 'pip install torch==2.13.0 -e ".[test]"' in ci


# ---- options ---------------------------------------------------------------------------------------
_OPTION_ROW = re.compile(r"^\| `([a-z_0-9]+)` \| `(NEURON_COMPILE_[A-Z0-9_]+)`", re.M)


def test_every_option_is_documented_with_its_env_var():
    rows = dict(_OPTION_ROW.findall((REPO_ROOT / "docs" / "options.md").read_text()))
    assert {k: rows.get(k) for k in config.OPTION_KEYS} == {
        k: config.ENV_VARS[k] for k in config.OPTION_KEYS
    }


def test_documented_options_exist():
    text = _text()
    named = {key for key, _ in _OPTION_ROW.findall(text)}
    named |= set(re.findall(r"options=\{[\"'](?:neuron\.)?([a-z_0-9]+)[\"']", text))
    named |= set(re.findall(r"\boption `([a-z_0-9]+)`", text))
    assert sorted(named - set(config.OPTION_KEYS)) == []
    # an options-table row names the option's own env var
    pairs = {(k, v) for k, v in _OPTION_ROW.findall(text)}
    assert sorted((k, v) for k, v in pairs if config.ENV_VARS.get(k) != v) == []


# ---- env vars ---------------------------------------------------------------------------------------
_ENV = re.compile(r"NEURON_COMPILE_[A-Z0-9_]*[A-Z0-9]")


def _env_vars(text: str) -> set[str]:
    """``NEURON_COMPILE_*`` names in ``text``; a prefix (``NEURON_COMPILE_CACHE_*``, or a name on a
    line that declares prefixes) is not a variable."""
    names = set()
    for line in text.splitlines():
        if "PREFIX" in line:
            line = re.sub(r"ENV_PREFIX\s*\+\s*\"([A-Z0-9_]+)\"", r"NEURON_COMPILE_\1", line)
            if "PREFIXES" in line or "ENV_PREFIX =" in line:
                continue
        for m in _ENV.finditer(line):
            if not line.startswith("_*", m.end()):
                names.add(m.group())
    return names


def _code_env_vars() -> set[str]:
    return {n for p in _sources(PACKAGE) for n in _env_vars(p.read_text())}


def test_env_vars_are_found_in_the_code():
    found = _code_env_vars()
    assert set(config.ENV_VARS.values()) <= found
    assert set(settings.ENV_VARS) <= found
    assert "NEURON_COMPILE_CACHE" not in found  # a prefix, not a variable


def test_every_env_var_is_documented():
    documented = _env_vars(_text())
    assert sorted(_code_env_vars() - documented) == []


def test_documented_env_vars_exist():
    # Test-only variables (NEURON_COMPILE_FUZZ_EXAMPLES) are read under tests/.
    roots = (PACKAGE, REPO_ROOT / "tests", REPO_ROOT / "benchmarks", REPO_ROOT / "examples")
    known = {n for p in _sources(*roots) for n in _env_vars(p.read_text())}
    assert sorted(_env_vars(_text()) - known) == []


# ---- error codes ------------------------------------------------------------------------------------
_CODE = re.compile(r"\bNC\d{3}\b")


def test_errors_page_is_generated_from_the_code():
    assert ERRORS_DOC.read_text() == errors_markdown(), "run: python -m tests.docs_gen"


def test_codes_used_in_the_code_are_defined_in_errors_py():
    used = {c for p in _sources(PACKAGE) for c in _CODE.findall(p.read_text())}
    assert sorted(used - set(error_codes())) == []


def test_every_error_code_is_documented():
    used = {c for p in _sources(PACKAGE) for c in _CODE.findall(p.read_text())}
    documented = set(_CODE.findall(_text()))
    assert sorted((set(error_codes()) | used) - documented) == []


def test_documented_error_codes_exist():
    used = {c for p in _sources(PACKAGE) for c in _CODE.findall(p.read_text())}
    assert sorted(set(_CODE.findall(_text())) - set(error_codes()) - used) == []


def _catalogue_rows() -> dict[str, list[str]]:
    """docs/trainium.md's error catalogue: NCC code -> its cells."""
    page = (REPO_ROOT / "docs" / "trainium.md").read_text()
    table = page.split("### Error catalogue", 1)[1].split("\n\n|", 1)[1].split("\n\n", 1)[0]
    rows = [
        [c.strip().strip("`") for c in line.strip("|").split("|")] for line in table.splitlines()
    ]
    return {cells[0]: cells for cells in rows[2:]}


def test_trainium_error_catalogue_matches_the_rules():
    """Every NCC code a legality rule declares has its row (our code, rule, whether a rewrite
    exists, the R6 item), and every row belongs to a rule."""
    from neuron_compile.trainium.legality import RULES
    from neuron_compile.trainium.legality_base import info

    rows = _catalogue_rows()
    reference = (REPO_ROOT / "docs" / "trainium-reference.md").read_text()
    r6 = reference.split("## R6.", 1)[1].split("\n## ", 1)[0]
    items = dict(re.findall(r"^(\d+)\. (.*?)(?=^\d+\. |^Used by|\Z)", r6, re.M | re.S))
    declared = {}
    for rule in RULES:
        entry = info(rule)
        for code in entry.codes:
            assert code not in declared, f"{code} is declared by two rules"
            declared[code] = entry
    assert sorted(rows) == sorted(declared)
    for code, entry in declared.items():
        _, _, ours, name, rewrite, source = rows[code]
        assert (ours, name, source) == (entry.error.code, entry.rule, entry.source), code
        assert (rewrite != "—") == bool(entry.rewrite), f"{code}: rewrite column vs the rule"
        item = items.get(entry.source.removeprefix("R6."), "")
        assert code.removeprefix("NCC_") in item, f"{code}: not in {entry.source} of R6"


# ---- CLI commands -----------------------------------------------------------------------------------
class _Parsed(Exception):
    pass


def _cli_parser() -> argparse.ArgumentParser:
    """The parser ``neuron-compile`` builds, caught at its ``parse_args``."""
    from neuron_compile import cli

    caught: list[argparse.ArgumentParser] = []

    def parse_args(self, *args, **kwargs):
        caught.append(self)
        raise _Parsed

    with mock.patch.object(argparse.ArgumentParser, "parse_args", parse_args):
        try:
            cli.main(["info"])
        except _Parsed:
            pass
    assert caught and caught[0].prog == "neuron-compile"
    return caught[0]


def _commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    """Every command path: ("info",), ("buckets",), ("buckets", "plan"), ..."""
    for action in parser._actions:  # noqa: SLF001
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for name, sub in action.choices.items():
                yield (*prefix, name)
                yield from _commands(sub, (*prefix, name))


def _command_mentions(text: str) -> list[tuple[str, ...]]:
    """``neuron-compile WORD [WORD]`` in code: fenced blocks and inline code spans."""
    fenced = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.M | re.S)
    rest = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.M | re.S)
    code = fenced + re.findall(r"`([^`\n]+)`", rest)
    mentions = []
    for chunk in code:
        for m in re.finditer(r"\bneuron-compile ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?", chunk):
            mentions.append(tuple(w for w in m.groups() if w))
    return mentions


def test_every_cli_command_is_documented():
    commands = set(_commands(_cli_parser()))
    assert {("info",), ("ops",), ("cache", "ls"), ("check",)} <= commands
    mentioned = set(_command_mentions(_text()))
    firsts = {m[0] for m in mentioned}
    missing = [c for c in sorted(commands) if c[0] not in firsts]
    # a subcommand: on a line that names its parent command
    for c in sorted(commands):
        if len(c) > 1:
            lines = [
                ln for ln in _text().splitlines() if f"neuron-compile {' '.join(c[:-1])}" in ln
            ]
            if c[-1] not in {w for ln in lines for w in re.findall(r"[a-z]+", ln)}:
                missing.append(c)
    assert missing == []


def test_documented_cli_commands_exist():
    commands = set(_commands(_cli_parser()))
    with_subcommands = {c[0] for c in commands if len(c) > 1}
    wrong = set()
    for m in _command_mentions(_text()):
        if (m[0],) not in commands:
            wrong.add(m)
        elif m[0] in with_subcommands and len(m) > 1 and m not in commands:
            wrong.add(m)
    assert sorted(wrong) == []


# ---- references from the code into docs/ --------------------------------------------------------------
def _code_files() -> list[Path]:
    roots = (PACKAGE, REPO_ROOT / "tests", REPO_ROOT / "examples", REPO_ROOT / "benchmarks")
    return _sources(*roots)


def test_docs_pages_named_in_the_code_exist():
    named = {m for p in _code_files() for m in re.findall(r"docs/([\w-]+\.md)", p.read_text())}
    assert sorted(n for n in named if not (REPO_ROOT / "docs" / n).exists()) == []


def test_trainium_reference_sections_cited_in_the_code_exist():
    page = (REPO_ROOT / "docs" / "trainium-reference.md").read_text()
    sections = set(re.findall(r"^## (R\d+)\. ", page, flags=re.M))
    cited = {
        (p.relative_to(REPO_ROOT).as_posix(), s)
        for p in _code_files()
        for s in re.findall(r"§\s?(R\d+)\b", p.read_text())
    }
    assert sorted((f, s) for f, s in cited if s not in sections) == []
