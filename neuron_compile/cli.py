"""``neuron-compile`` command line: ``info`` and ``ops`` (more subcommands arrive with their issues)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any


def _info() -> dict[str, Any]:
    from .config import ENV_VARS
    from .dump import versions
    from .registration import BACKEND_NAMES, other_registrations
    from .runtime.xla_cpu import platform_version

    return {
        "versions": versions(),
        "executor": platform_version(),
        "backend_names": list(BACKEND_NAMES),
        "neuron_name_also_registered_by": other_registrations("neuron"),
        "env_vars": {**ENV_VARS, "log": "NEURON_COMPILE_LOG"},
    }


def _ops() -> dict[str, Any]:
    from .lowering import registered_ops

    ops = registered_ops("stablehlo")
    return {"target": "stablehlo", "count": len(ops), "ops": ops}


def _print_info(info: dict[str, Any]) -> None:
    for name, version in info["versions"].items():
        print(f"{name:16} {version}")
    print(f"{'executor':16} {info['executor']}")
    print(f"{'backend names':16} {', '.join(info['backend_names'])}")
    clash = info["neuron_name_also_registered_by"]
    if clash:
        print(
            f"warning: 'neuron' is also registered by {', '.join(clash)}; use backend='neuron_compile'"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="neuron-compile",
        description="torch.compile backend for AWS Trainium: lowers PyTorch graphs to StableHLO, "
        "checks them on CPU with XLA, compiles them with neuronx-cc.",
    )
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="versions, executor, backend registration and env vars")
    sub.add_parser("ops", help="list the ATen ops with a StableHLO lowering")
    args = parser.parse_args(argv)

    result = _info() if args.command == "info" else _ops()
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
    elif args.command == "info":
        _print_info(result)
    else:
        print("\n".join(result["ops"]))
        print(f"{result['count']} ops lowered to {result['target']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
