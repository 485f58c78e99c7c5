"""CI compile reports: ``neuron-compile check``, the pytest plugin, failure bundles, minimizer.

One report model (``model.Report``, JSON schema ``schema.REPORT_SCHEMA`` at ``SCHEMA_VERSION``)
rendered as JSON, JUnit XML, Markdown, SARIF 2.1.0 and a terminal summary (``formats``); gated
by ``gate``; collected by ``collect.Collector`` while user code runs under the backend.
"""

from __future__ import annotations

from .collect import Collector, collect
from .formats import FORMATS, RENDERERS, write_all
from .gate import EXIT_CRASH, EXIT_FINDINGS, EXIT_OK, EXIT_USAGE, exit_code, parse_fail_on
from .model import CATEGORIES, SCHEMA_VERSION, Finding, GraphEntry, Location, Report

__all__ = [
    "CATEGORIES",
    "EXIT_CRASH",
    "EXIT_FINDINGS",
    "EXIT_OK",
    "EXIT_USAGE",
    "FORMATS",
    "RENDERERS",
    "SCHEMA_VERSION",
    "Collector",
    "Finding",
    "GraphEntry",
    "Location",
    "Report",
    "collect",
    "exit_code",
    "parse_fail_on",
    "write_all",
]
