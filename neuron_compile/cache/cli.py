"""``neuron-compile cache ...``: inspect and maintain the on-disk compilation cache.

Subcommands: ls, du, verify, prune, clear, export, import, explain, promote, keygen. Each takes ``--json``
and ``--dir`` (default: ``$NEURON_COMPILE_CACHE_DIR`` or ``~/.cache/neuron-compile``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from . import settings
from .maintenance import format_bytes
from .manifest import KEY_RE
from .signing import ENV_SIGNING_KEY, write_new_key
from .store import DiskCache, describe_diff

_DAY = 86400.0
#: Commands that only read the cache: they open it with ``create=False`` and make no directory.
READ_ONLY = frozenset({"ls", "du", "verify", "explain", "export"})


def _days(text: str) -> float:
    """``--older-than``: a number of days >= 0 (a negative age matched every entry)."""
    try:
        days = float(text)
    except ValueError:
        days = math.nan
    if not days >= 0:
        raise argparse.ArgumentTypeError(f"expected a number of days >= 0, got {text!r}")
    return days


def _component(text: str) -> tuple[str, str]:
    """``--keep NAME=VALUE``."""
    name, sep, value = text.partition("=")
    if not (sep and name and value):
        raise argparse.ArgumentTypeError(
            f"expected NAME=VALUE (e.g. neuronx-cc=2.28.7), got {text!r}"
        )
    return name, value


def add_cache_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``cache`` on an ``add_subparsers()`` object; dispatch with ``run(args)``."""
    cache = sub.add_parser(
        "cache",
        help="inspect and maintain the on-disk compilation cache",
        description="Inspect and maintain the on-disk compilation cache.",
    )
    csub = cache.add_subparsers(dest="cache_command", required=True)
    cmds = {
        "ls": "list entries: key, artifact size, compile seconds, graph's cache name "
        "(its metrics() name without the frame counter: TinyGPT_0_forward_0 -> TinyGPT_forward_0)",
        "du": "disk usage of the local tier: entries, bytes, the size cap",
        "verify": "check every entry's checksums, key binding and signature; print how many "
        "entries and bytes were checked and how many are bad (exit 1 if any)",
        "prune": "remove entries by age of last access or by old component versions",
        "clear": "remove every entry and failure record",
        "export": "write a portable bundle of entries",
        "import": "validate and install a bundle",
        "explain": "show an entry's key components and how it differs from its nearest sibling",
        "promote": "copy local entries to the remote tier",
        "keygen": "create a team signing key file (docs/cache-security.md)",
    }
    parsers = {
        name: csub.add_parser(name, help=text, description=text) for name, text in cmds.items()
    }
    for name, p in parsers.items():
        if name != "keygen":
            p.add_argument("--dir", type=Path, help="cache root (default: from the environment)")
            p.add_argument(
                "--remote", type=Path, help="remote tier (default: $NEURON_COMPILE_REMOTE_CACHE)"
            )
        p.add_argument("--json", dest="json_out", action="store_true", help="print JSON")
        p.set_defaults(cache_run=run)
    parsers["verify"].add_argument(
        "--quarantine", action="store_true", help="move bad entries aside"
    )
    prune = parsers["prune"]
    prune.add_argument("--older-than", type=_days, metavar="DAYS", help="not accessed for DAYS")
    prune.add_argument(
        "--keep",
        action="append",
        default=[],
        type=_component,
        metavar="NAME=VALUE",
        help="drop entries whose component NAME is not VALUE (e.g. neuronx-cc=2.28.7)",
    )
    parsers["clear"].add_argument("--failures", action="store_true", help="only failure records")
    parsers["export"].add_argument("keys", nargs="*", help="keys (or unique prefixes)")
    parsers["export"].add_argument(
        "--graph",
        action="append",
        default=[],
        metavar="GLOB",
        help="also every entry whose graph name matches (e.g. 'TinyGPT_*': one model's graphs)",
    )
    parsers["export"].add_argument("-o", "--output", type=Path, required=True, help="bundle path")
    parsers["import"].add_argument("bundle", type=Path)
    parsers["explain"].add_argument("key", help="key (or unique prefix)")
    parsers["promote"].add_argument("keys", nargs="*", help="keys (default: all)")
    parsers["keygen"].add_argument("path", type=Path, help="new key file (never overwritten)")
    return cache


def _open(args: argparse.Namespace) -> DiskCache:
    env = settings.from_environ()  # settings only: constructing a DiskCache would create its root
    if args.dir is None and env is None:
        raise SystemExit("neuron-compile: the cache is disabled (NEURON_COMPILE_CACHE_DIR=off)")
    root = args.dir if args.dir is not None else env.root  # type: ignore[union-attr]
    remote = args.remote if args.remote is not None else (env.remote if env else None)
    cmd = args.cache_command
    path = settings.expand_path(str(root))
    if path.exists() and not path.is_dir():  # `ls` said "0 entries", `clear` gave a wrong hint
        raise SystemExit(
            f"neuron-compile: [NC404] cache directory {root} is not a directory "
            "(check --dir or NEURON_COMPILE_CACHE_DIR)"
        )
    if cmd == "verify" and not path.is_dir():
        raise SystemExit(
            f"neuron-compile: [NC404] cache directory {root} does not exist or is not a directory; "
            "nothing was verified (check --dir or NEURON_COMPILE_CACHE_DIR)"
        )
    kwargs: dict[str, Any] = {}
    if env is not None:
        kwargs = {
            "max_bytes": env.max_bytes,
            "allow_shared_writable": env.allow_shared_writable,
            "failure_ttl": env.failure_ttl,
            "signer": env.signer,
        }
    read_only = cmd in READ_ONLY and not getattr(args, "quarantine", False)
    return DiskCache(root, remote=remote, create=not read_only, **kwargs)


def _resolve(cache: DiskCache, prefix: str) -> str:
    keys = [e.key for e in cache.entries() if e.key.startswith(prefix)]
    keys += [p.stem for p in cache._failure_files() if p.stem.startswith(prefix)]
    keys = sorted(set(keys))
    if len(keys) != 1:
        raise SystemExit(f"neuron-compile: {prefix!r} matches {len(keys)} cache keys")
    return keys[0]


def _explain(cache: DiskCache, key: str) -> dict[str, Any]:
    entries = cache.entries()
    mine = next((e for e in entries if e.key == key), None)
    failure = cache.failure(key)
    if mine is None and failure is None:
        return {"key": key, "status": "unknown", "explain": []}
    graph = mine.graph_name if mine else failure["graph_name"]  # type: ignore[index]
    comps = mine.components if mine else failure["components"]  # type: ignore[index]
    best: tuple[int, str, list[str]] | None = None
    for other in entries:
        if other.key != key and other.graph_name == graph:
            lines = describe_diff(other.components, comps)
            if best is None or len(lines) < best[0]:
                best = (len(lines), other.key, lines)
    return {
        "key": key,
        "status": "entry" if mine else "failure",
        "graph_name": graph,
        "components": comps,
        "failure": failure,
        "nearest": best[1] if best else None,
        "explain": best[2] if best else [],
    }


def run(args: argparse.Namespace, as_json: bool = False) -> int:
    """Execute a parsed ``cache`` subcommand; returns the exit code."""
    as_json = as_json or args.json_out
    cmd = args.cache_command
    code = 0
    result: Any
    try:
        if cmd == "keygen":  # needs no cache: a new file of 256 random bits, mode 600
            result = {"key_file": str(args.path), "key_id": write_new_key(args.path)}
            result["setup"] = f"{ENV_SIGNING_KEY}={args.path} on every writer and reader"
        else:
            result = _run_on_cache(_open(args), cmd, args)
            code = 1 if cmd == "verify" and not result["ok"] else 0
    except (OSError, ValueError) as exc:  # CacheBundleError is a ValueError
        print(f"neuron-compile: {exc}", file=sys.stderr)
        return 2
    if as_json:
        json.dump(result, sys.stdout, indent=2, default=str)
        print()
    else:
        _print(cmd, result)
    return code


def _run_on_cache(cache: DiskCache, cmd: str, args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any]
    if cmd == "ls":
        result = {"root": str(cache.root), "entries": [e.summary() for e in cache.entries()]}
    elif cmd == "du":
        entries, size = cache.usage()  # the walk `neuron-compile info` reports too
        result = {"root": str(cache.root), "entries": entries, "bytes": size}
        result["max_bytes"] = cache.max_bytes
    elif cmd == "verify":
        entries, size = cache.usage()  # before: --quarantine moves bad entries away
        problems = cache.verify(quarantine=args.quarantine)
        result = {"root": str(cache.root), "ok": not problems, "entries": entries, "bytes": size}
        result.update(bad=len(problems), problems=problems)
    elif cmd == "prune":
        keep = dict(args.keep)
        older = args.older_than * _DAY if args.older_than is not None else None
        result = {"removed": cache.prune(older_than=older, keep_component=keep or None)}
    elif cmd == "clear":
        result = {"removed": cache.clear(failures_only=args.failures)}
    elif cmd == "export":
        keys = [_resolve(cache, k) for k in args.keys]
        keys += [
            e.key
            for e in cache.entries()
            if e.key not in keys and any(fnmatch(e.graph_name, g) for g in args.graph)
        ]
        if not keys:
            raise SystemExit("neuron-compile: nothing to export (give keys or --graph)")
        entries = cache.exportable(keys)  # read and verified once, listed as written
        bundle = cache.export_entries(entries, args.output)
        result = {"bundle": str(bundle), "keys": [e.key for e in entries]}
    elif cmd == "import":
        result = {"imported": cache.import_bundle(args.bundle)}
    elif cmd == "explain":
        result = _explain(cache, _resolve(cache, args.key))
    else:
        keys = [_resolve(cache, k) for k in args.keys] or None
        remote = str(cache.remote) if cache.remote is not None else None
        result = {"promoted": cache.promote(keys), "remote": remote}
    return result


def _print(cmd: str, result: dict[str, Any]) -> None:
    if cmd == "ls":
        _print_ls(result)
    elif cmd == "du":
        print(
            f"{format_bytes(result['bytes'])} ({result['bytes']:,} bytes) in {result['entries']} "
            f"entries in {result['root']}; max {format_bytes(result['max_bytes'])}"
        )
    elif cmd == "verify":
        for p in result["problems"]:
            print(f"{p['key'][:16] if KEY_RE.match(p['key']) else p['key']}  {p['problem']}")
        checked = (
            f"checked {result['entries']} entries ({format_bytes(result['bytes'])}) "
            f"in {result['root']}"
        )
        print(f"{checked}: all good" if result["ok"] else f"{checked}: {result['bad']} bad")
    elif cmd == "explain":
        print(f"key {result['key']}: {result['status']}")
        for name, value in sorted((result.get("components") or {}).items()):
            print(f"  {name} = {value}")
        if result.get("nearest"):
            print(f"differs from nearest entry {result['nearest'][:16]} in:")
            print("\n".join(f"  {line}" for line in result["explain"]) or "  nothing")
    elif cmd == "clear":
        print(f"removed {result['removed']} entries")
    elif cmd == "export":
        print(f"exported {len(result['keys'])} entries to {result['bundle']}")
    else:  # prune, import, promote: the keys they acted on
        verb = next(k for k in ("removed", "imported", "promoted") if k in result)
        keys = result[verb]
        where = f" to {result['remote']}" if result.get("remote") else ""
        print(f"{verb} {len(keys)} entries{where}")
        for key in keys:
            print(f"  {key[:16]}")


#: Printed under ``cache ls``: its names are not the names ``neuron_compile.metrics()`` shows.
LS_NAMES_NOTE = (
    "cache names are metrics() names without the per-process frame counter\n"
    "(TinyGPT_0_forward_0 -> TinyGPT_forward_0), so later runs find them. No suffix: the\n"
    "StableHLO artifact; .index FX index, .executable XLA CPU executable, .neff Trainium NEFF,\n"
    ".cpu_stand_in a trn graph's CPU stand-in"
)


def _print_ls(result: dict[str, Any]) -> None:
    entries = result["entries"]
    if entries:
        print(f"{'key':16}  {'artifacts':>10}  {'compile':>8}  graph (cache name)")
    for e in sorted(entries, key=lambda e: (e["graph_name"], e["key"])):
        print(
            f"{e['key'][:16]}  {format_bytes(e['size']):>10}  {e['compile_seconds']:7.1f}s  "
            f"{e['graph_name']}"
        )
    print(f"{len(entries)} entries in {result['root']} (disk usage: neuron-compile cache du)")
    if entries:
        print(LS_NAMES_NOTE)


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry (``neuron-compile cache`` normally goes through ``neuron_compile.cli``)."""
    parser = argparse.ArgumentParser(prog="neuron-compile")
    add_cache_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["cache", *(argv if argv is not None else sys.argv[1:])])
    return run(args)
