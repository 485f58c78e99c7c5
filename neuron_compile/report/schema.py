"""JSON schema of the report (``Report.to_dict()``), versioned by ``SCHEMA_VERSION``.

Consumers should check ``schema_version``: a new major number means an incompatible layout; a new
minor number only adds optional fields. ``neuron-compile check --print-schema`` prints it.
"""

from __future__ import annotations

from typing import Any

from .model import CATEGORIES, SCHEMA_VERSION

_NUM = {"type": "number", "minimum": 0}
# since 1.2: torch.distributed ranks of a graph or finding
_RANKS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "uniqueItems": True}
_LOCATION = {
    "type": ["object", "null"],
    "required": ["file", "line"],
    "additionalProperties": False,
    "properties": {
        "file": {"type": "string", "minLength": 1},
        "line": {"type": "integer", "minimum": 0},
        "function": {"type": ["string", "null"]},
    },
}
_NCC = {
    "type": "object",
    "required": ["code", "message", "group", "bucket", "action"],
    "additionalProperties": False,
    "properties": {
        "code": {"type": "string", "pattern": "^NCC_[A-Z]{4}[0-9]{3}$"},
        "message": {"type": "string"},
        "group": {"type": "string"},
        "bucket": {"type": "string"},
        "action": {"type": "string"},
    },
}
_FINDING = {
    "type": "object",
    "required": ["category", "code", "message", "count"],
    "additionalProperties": False,
    "properties": {
        "category": {"enum": list(CATEGORIES)},
        "code": {"type": "string", "pattern": "^NC[0-9]{3}$"},
        "message": {"type": "string"},
        "graph": {"type": ["string", "null"]},
        "location": _LOCATION,
        "count": {"type": "integer", "minimum": 1},
        "details": {"type": "object"},
        "ncc": {"type": "array", "items": _NCC},
        "bundle": {"type": ["string", "null"]},
        "ranks": _RANKS,
    },
}
_GRAPH = {
    "type": "object",
    "required": ["name", "kind", "status"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "kind": {"enum": ["forward", "backward", "inference", "unknown"]},
        "status": {"enum": ["ok", "failed"]},
        "node_count": {"type": "integer", "minimum": 0},
        "seconds": {"type": "object", "additionalProperties": _NUM},
        "cache": {
            "type": "object",
            "properties": {
                "source": {"type": "string"},
                "key": {"type": "string"},
                "miss": {"type": "array", "items": {"type": "string"}},
            },
        },
        "regions": {"type": "integer", "minimum": 0},
        "calls": {"type": "integer", "minimum": 0},
        "recompile": {"type": "boolean"},
        "fallback_ops": {"type": "object", "additionalProperties": {"type": "integer"}},
        "downcasts": {"type": "array", "items": {"type": "string"}},
        "artifacts": {"type": "object", "additionalProperties": {"type": "string"}},
        "location": _LOCATION,
        "numerics": {"enum": [None, "matched", "mismatch", "random"]},
        "est_device_s": {"type": ["number", "null"], "minimum": 0},
        "est_target": {"type": "string"},
        "ranks": _RANKS,
    },
}

REPORT_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": f"https://neuron-compile.dev/schemas/report-{SCHEMA_VERSION}.json",
    "title": "neuron-compile check report",
    "type": "object",
    "required": ["schema_version", "tool", "target", "mode", "graphs", "findings", "counts"],
    "additionalProperties": False,
    "properties": {
        "schema_version": {"type": "string", "pattern": r"^1\.[0-9]+$"},
        "tool": {
            "type": "object",
            "required": ["name", "version"],
            "properties": {"name": {"const": "neuron-compile"}, "version": {"type": "string"}},
        },
        "target": {"type": "string"},
        "mode": {"enum": ["compile", "run"]},
        "graphs": {"type": "array", "items": _GRAPH},
        "findings": {"type": "array", "items": _FINDING},
        "counts": {
            "type": "object",
            "required": list(CATEGORIES),
            "additionalProperties": {"type": "integer", "minimum": 0},
        },
        "versions": {"type": "object", "additionalProperties": {"type": "string"}},
        "created": {"type": "string"},
        "duration_s": _NUM,
        "crash": {"type": ["string", "null"]},
        "cache": {"type": "object"},
        # since 1.1: roofline device time of one call of every graph (None: estimate off)
        "est_device_s_total": {"type": ["number", "null"], "minimum": 0},
        "est_target": {"type": "string"},
        # since 1.2: ranks the report covers (neuron-compile check --nproc-per-node N)
        "world_size": {"type": "integer", "minimum": 1},
        # since 1.3: graphs compiled in this run, loaded from the compile cache, failed
        "graph_sources": {
            "type": "object",
            "required": ["compiled", "cached", "failed"],
            "additionalProperties": False,
            "properties": {
                k: {"type": "integer", "minimum": 0} for k in ("compiled", "cached", "failed")
            },
        },
    },
}
