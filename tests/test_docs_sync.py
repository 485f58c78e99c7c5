"""The docs name every setting and command the code has (and nothing it does not)."""

from __future__ import annotations

import re

from neuron_compile.cache import settings
from neuron_compile.cache.cli import add_cache_parser
from tests.helpers import REPO_ROOT

DOCS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]


def _text() -> str:
    return "\n".join(p.read_text() for p in DOCS)


def test_every_cache_setting_is_documented():
    text = _text()
    assert [v for v in settings.ENV_VARS if v not in text] == []


def test_documented_cache_settings_exist():
    named = set(re.findall(r"NEURON_COMPILE_(?:REMOTE_)?CACHE_[A-Z_]+[A-Z]", _text()))
    assert sorted(named - set(settings.ENV_VARS)) == []


def test_every_cache_command_is_documented():
    import argparse

    sub = argparse.ArgumentParser().add_subparsers()
    commands = add_cache_parser(sub)._subparsers._group_actions[0].choices  # noqa: SLF001
    lines = [line for line in _text().splitlines() if "neuron-compile cache" in line]
    words = {w for line in lines for w in re.findall(r"[a-z]+", line)}
    assert [c for c in commands if c not in words] == []


def test_links_between_docs_resolve():
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)#:]+\.md)", doc.read_text()):
            assert (doc.parent / target).resolve().exists(), f"{doc.name} links to {target}"
