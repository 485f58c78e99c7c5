"""``neuron-compile`` command line: ``info``, ``ops``, ``buckets plan`` and ``cache ...``."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from .cache.maintenance import format_bytes
from .targets import target_names


def env_report(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """The ``NEURON_COMPILE_*`` variables set in ``environ`` (default: this process's), every
    known one with its value (None: unset), and, for a set name we do not read (a typo), the
    closest known name."""
    from .config import closest_env_var, known_env_vars

    environ = dict(os.environ if environ is None else environ)
    known = known_env_vars()
    set_vars = {k: v for k, v in sorted(environ.items()) if k.startswith("NEURON_COMPILE_")}
    unknown = {name: closest_env_var(name) for name in set_vars if name not in known}
    return {
        "set": set_vars,
        "unknown": unknown,
        "known": {name: environ.get(name) for name in known},
    }


def _info() -> dict[str, Any]:
    from .cache import store
    from .config import ENV_VARS
    from .registration import BACKEND_NAMES, other_registrations
    from .runtime.xla_cpu import platform_version
    from .versions import versions

    cache = store.DiskCache.from_env(create=False)  # info only reads: it creates no directory
    cache_info: dict[str, Any] = {"enabled": False}
    if cache is not None:
        entries, size = cache.usage()  # the walk `neuron-compile cache du` reports too
        cache_info = {**cache.stats(scan=False), "entries": entries, "total_bytes": size}
        cache_info["created"] = cache.root.is_dir()
    return {
        "versions": versions(),
        "executor": platform_version(),
        "backend_names": list(BACKEND_NAMES),
        "neuron_name_also_registered_by": other_registrations("neuron"),
        "env": env_report(),
        "env_vars": {**ENV_VARS, "log": "NEURON_COMPILE_LOG"},
        "cache_env_vars": list(store.ENV_VARS),
        "cache": cache_info,
    }


def _ops(target_name: str) -> dict[str, Any]:
    """Every op with a lowering for ``target_name``, and which of them the target lowers with a
    form of its own (``Target.lowering_keys``; listed as ``kernel``: trn's kernel calls, cpu's
    grouped-convolution taps) instead of the reference rule."""
    from .lowering import registered_ops
    from .targets import get_target

    target = get_target(target_name)
    kernels = sorted({op for key in target.lowering_keys for op in registered_ops(key)})
    ops = sorted({*registered_ops(), *kernels})
    forms = {op: "kernel" if op in kernels else "reference" for op in ops}
    return {"target": target.name, "count": len(ops), "ops": ops, "forms": forms}


def _print_info(info: dict[str, Any]) -> None:
    for name, version in info["versions"].items():
        print(f"{name:16} {version}")
    print(f"{'executor':16} {info['executor']}")
    print(f"{'backend names':16} {', '.join(info['backend_names'])}")
    cache = info["cache"]
    if cache.get("enabled"):
        print(
            f"{'cache':16} {cache['root']}: {cache['entries']} entries, "
            f"{format_bytes(cache['total_bytes'])} of {format_bytes(cache['max_bytes'])}"
            + (f"; remote {cache['remote']}" if cache.get("remote") else "")
        )
    elif cache.get("created") is False:
        print(f"{'cache':16} {cache['root']}: not created yet (the first compile creates it)")
    else:
        print(f"{'cache':16} off")
    env = info["env"]
    label = "env vars"
    for name, value in env["set"].items():
        unknown = name in env["unknown"]
        hint = env["unknown"].get(name)
        note = f"  (not read by neuron-compile{f'; did you mean {hint}?' if hint else ''})"
        print(f"{label:16} {name}={value}{note if unknown else ''}")
        label = ""
    if not env["set"]:
        print(
            f"{label:16} no NEURON_COMPILE_* variable set "
            f"(`neuron-compile info --json` lists all {len(env['known'])} known ones)"
        )
    clash = info["neuron_name_also_registered_by"]
    if clash:
        print(
            f"warning: 'neuron' is also registered by {', '.join(clash)}; use backend='neuron_compile'"
        )


def _read_lengths(path: str) -> list[int]:
    """Whitespace-separated positive ints (``#`` starts a comment); ``-`` reads stdin."""
    text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()
    out = []
    for line in text.splitlines():
        for word in line.split("#", 1)[0].split():
            out.append(int(word))
    return out


def _plot_waste(path: str, lengths: list[int], k_max: int, align: int, cost: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    from .bucket_planner import compare_plans

    ks = list(range(1, k_max + 1))
    series: dict[str, list[float]] = {}
    for k in ks:
        for name, plan in compare_plans(lengths, k, align=align, cost=cost).items():
            series.setdefault(name, []).append(100 * plan.cost_waste)
    fig, ax = plt.subplots(figsize=(6, 4))
    for (name, ys), marker in zip(series.items(), "os^", strict=True):
        ax.plot(ks, ys, marker=marker, label=name)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("buckets (K)")
    ax.set_ylabel("padding waste (% of padded cost)" if cost != "linear" else "padding waste (%)")
    ax.set_title(f"{len(lengths)} sequences, align {align}, cost {cost}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _buckets_plan(args: argparse.Namespace, as_json: bool) -> int:
    from .bucket_planner import compare_plans

    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print(
                "neuron-compile: --plot needs matplotlib, which is not installed; "
                "run: pip install 'neuron-compile[plot]'",
                file=sys.stderr,
            )
            return 2
    try:
        lengths = _read_lengths(args.lengths)
        plans = compare_plans(lengths, args.max_buckets, align=args.align, cost=args.cost)
    except (OSError, ValueError) as exc:
        print(f"neuron-compile: {exc}", file=sys.stderr)
        return 2
    planner = plans["planner"]
    if as_json:
        json.dump({name: p.as_dict() for name, p in plans.items()}, sys.stdout, indent=2)
        print()
    else:
        print(
            f"{len(lengths)} sequences, {len(set(lengths))} distinct lengths, longest "
            f"{max(lengths)}; at most {args.max_buckets} buckets, align {args.align}, "
            f"cost {args.cost}"
        )
        print(f"{'bucket':>8} {'count':>8} {'max len':>8} {'padded tokens':>14} {'waste %':>8}")
        for b in planner.buckets:
            print(
                f"{b.size:>8} {b.count:>8} {b.max_len:>8} {b.padded_tokens:>14,} "
                f"{100 * b.waste:>8.2f}"
            )
        print(
            f"{'total':>8} {len(lengths):>8} {'':>8} {planner.padded_tokens:>14,} "
            f"{100 * planner.waste:>8.2f}"
        )
        print(f"\ncompared at K={args.max_buckets}:")
        for name, plan in plans.items():
            extra = f", cost waste {100 * plan.cost_waste:.2f} %" if args.cost != "linear" else ""
            print(
                f"  {name:<18} waste {100 * plan.waste:6.2f} %  padded tokens "
                f"{plan.padded_tokens:>12,}  buckets used {plan.used:>3}  "
                f"boundaries {plan.boundaries}{extra}"
            )
    if args.plot:
        _plot_waste(args.plot, lengths, args.max_buckets, args.align, args.cost)
        if not as_json:
            print(f"\nwrote {args.plot}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``neuron-compile`` argument parser, every subcommand included."""
    parser = argparse.ArgumentParser(
        prog="neuron-compile",
        description="torch.compile backend for AWS Trainium: lowers PyTorch graphs to StableHLO, "
        "checks them on CPU with XLA, compiles them with neuronx-cc.",
    )
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
    sub = parser.add_subparsers(dest="command", required=True)
    info_text = (
        "versions, executor, backend registration, the cache (entries, size), and the "
        "NEURON_COMPILE_* env vars that are set (--json: every known one, with its value)"
    )
    info = sub.add_parser("info", help=info_text, description=info_text)
    ops = sub.add_parser("ops", help="list the ops with a lowering, and each one's form")
    ops.add_argument(
        "--target",
        default="cpu",
        choices=target_names(),
        help="list this target's lowering forms: its kernels, else the reference rules",
    )
    for p in (info, ops):  # `neuron-compile info --json` and `neuron-compile --json info` both work
        p.add_argument("--json", dest="json_out", action="store_true", help="print JSON")
    buckets = sub.add_parser("buckets", help="shape buckets for variable-length inputs")
    bsub = buckets.add_subparsers(dest="buckets_command", required=True)
    plan = bsub.add_parser(
        "plan",
        help="optimal bucket boundaries for observed lengths",
        description="Exact DP over the observed lengths; compares with powers of two and "
        "fixed-step buckets at the same number of buckets.",
        epilog="LENGTHS: one positive integer per observed sequence (a length seen 100 times "
        "is written 100 times), separated by spaces or newlines; '#' starts a comment. "
        'Example: python -c "print(*map(len, dataset))" | neuron-compile buckets plan -',
    )
    plan.add_argument(
        "lengths", metavar="LENGTHS", help="file of observed sequence lengths ('-': stdin)"
    )
    plan.add_argument(
        "--max-buckets", type=int, default=8, metavar="K", help="at most K buckets (default 8)"
    )
    plan.add_argument("--align", type=int, default=1, help="boundaries are multiples of this")
    plan.add_argument(
        "--cost",
        choices=("linear", "attention"),
        default="linear",
        help="waste measured in padded tokens (linear), or with the quadratic attention term",
    )
    plan.add_argument("--plot", metavar="PNG", help="draw waste vs K (needs matplotlib)")
    plan.add_argument("--json", dest="json_out", action="store_true", help="print JSON")
    from .cache.cli import add_cache_parser

    add_cache_parser(sub)  # `neuron-compile cache ...`: ls, du, verify, prune, export, import, ...
    from .trainium.precompile import add_parser as add_precompile_parser

    add_precompile_parser(sub)  # `neuron-compile precompile SCRIPT --target trn2 ...`
    from .report.check import add_check_parser

    add_check_parser(sub)  # `neuron-compile check TARGET`: CI compile report
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # The reader left (`neuron-compile cache ls | head`): stop quietly, as `ls | head` does.
        # stdout now points at /dev/null so the interpreter's final flush cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    target_args: list[str] = []
    if "--" in argv:  # `check TARGET [options] -- ARGS...`: ARGS go to the target untouched
        split = argv.index("--")
        argv, target_args = argv[:split], argv[split + 1 :]
    args = parser.parse_args(argv)
    if target_args:
        if args.command == "check":
            args.target_args = target_args
        elif args.command == "precompile":  # `precompile SCRIPT [options] -- SCRIPT ARGS...`
            args.script_args = [*args.script_args, *target_args]
        else:
            parser.error("arguments after -- are only accepted by `check` and `precompile`")
    if args.command == "check":
        if args.json:  # `neuron-compile --json check ...`: check's reports are files
            parser.error("check writes JSON to a file: use `check TARGET --json report.json`")
        return args.check_run(args)
    if args.command == "precompile":
        return args.run(args, args.json)

    if args.command == "cache":
        return args.cache_run(args, args.json)

    if args.command == "buckets":
        if args.max_buckets < 1 or args.align < 1:
            parser.error("--max-buckets and --align must be >= 1")
        return _buckets_plan(args, args.json or args.json_out)
    result = _info() if args.command == "info" else _ops(args.target)
    if args.json or args.json_out:
        json.dump(result, sys.stdout, indent=2)
        print()
    elif args.command == "info":
        _print_info(result)
    else:
        for op, form in result["forms"].items():
            print(f"{op}  ({result['target']} kernel)" if form == "kernel" else op)
        kernels = sum(form == "kernel" for form in result["forms"].values())
        print(f"{result['count']} ops lowered for {result['target']} ({kernels} by kernel forms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
