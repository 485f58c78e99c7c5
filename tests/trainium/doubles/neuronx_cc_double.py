"""TEST DOUBLE of AWS's ``neuronx-cc`` (the real compiler exists only on Trainium hosts).

It is *not* a compiler. It checks our side of the contract and nothing else:

1. the argument list against the documented CLI (``neuronx-cc compile <file> --framework XLA
   --target <t> [--lnc n] [-O<k>] [--model-type m] [--auto-cast c] ... --output <neff>``; SDK
   ``compiler/neuronx-cc/api-reference-guide``): unknown flags or bad values exit 2 like argparse;
   ``--lnc 2`` on trn1/inf2 fails with ``NCC_EARG001`` as the real compiler does;
2. the input artifact, parsed with jaxlib: ``*.pb`` must be an ``HloModuleProto``, anything else
   StableHLO MLIR (bytecode or text) that verifies; otherwise ``NCC_EVRF064`` and exit 1;
3. then, by ``NEURONX_CC_DOUBLE_MODE``:
   - ``ok`` (default): write a NEFF *placeholder* to ``--output`` (magic ``NEFF-DOUBLE``, a JSON
     header with target, lnc and the input's sha256), print progress lines, exit 0;
   - ``fail``: print a documented-format error line ``[ERROR] [NCC_XXXX000] message`` (code from
     ``NEURONX_CC_DOUBLE_CODE``, default ``NCC_EVRF001``) to stderr and to
     ``log-neuron-cc.txt`` in the cwd, exit 1;
   - ``sleep``: sleep ``NEURONX_CC_DOUBLE_SLEEP`` seconds (default 60) before compiling (timeout
     tests).

``--version`` prints ``NeuronX Compiler version $NEURONX_CC_DOUBLE_VERSION`` (default
``2.28.7631.0+double``). Every invocation appends its argv as one JSON line to
``$NEURONX_CC_DOUBLE_LOG`` when set, so tests can count compiles and compare command lines.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import time
from pathlib import Path

TARGETS = ("trn1", "trn1n", "inf2", "trn2", "trn3")
MESSAGES = {
    "NCC_EVRF001": "Operator is not supported by the Neuron compiler",
    "NCC_EVRF004": "Complex data types are not supported",
    "NCC_EMOD025": "All tensor dimensions must be statically sized",
    "NCC_EOOM001": "The tensors in the model exceed the available device memory (HBM)",
    "NCC_EHCA005": "Unrecognized custom-call target",
    "NCC_EVRF064": "HLO verifier failed",
    "NCC_EARG001": "Logical NeuronCore config is not supported for the target",
    "NCC_ITEN406": "Too many partition dimensions",
}


def _log(argv: list[str]) -> None:
    path = os.environ.get("NEURONX_CC_DOUBLE_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"argv": argv, "cwd": os.getcwd(), "pid": os.getpid()}) + "\n")


def _error(code: str, detail: str = "") -> int:
    line = f"[ERROR] [{code}] {MESSAGES.get(code, 'error')}{': ' + detail if detail else ''}"
    print(line, file=sys.stderr)
    Path("log-neuron-cc.txt").write_text(line + "\n")
    return 1


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="neuronx-cc compile")
    p.add_argument("model_files", nargs=1)
    p.add_argument("--framework", required=True, choices=("XLA",))
    p.add_argument("--target", required=True, choices=TARGETS)
    p.add_argument("--lnc", "--logical-nc-config", "-lnc", dest="lnc", type=int, choices=(1, 2))
    p.add_argument("-O", "--optlevel", dest="optlevel", type=int, choices=(1, 2, 3))
    p.add_argument("--model-type", choices=("generic", "transformer", "unet-inference"))
    p.add_argument("--auto-cast", choices=("none", "matmult", "all"))
    p.add_argument("--auto-cast-type", choices=("bf16", "fp16", "tf32", "fp8_e4m3"))
    p.add_argument("--native-int64", choices=("default", "enabled", "disabled"))
    p.add_argument("--implicit-integer-downcast")
    p.add_argument("--distribution-strategy", choices=("llm-training",))
    p.add_argument("--verbose", choices=("debug", "info", "warning", "error", "critical"))
    p.add_argument("--logfile")
    p.add_argument("--output", required=True)
    for flag in (
        "--enable-mixed-precision-accumulation",
        "--disable-mixed-precision-accumulation",
        "--enable-saturate-infinity",
        "--enable-fast-context-switch",
        "--enable-fast-loading-neuron-binaries",
    ):
        p.add_argument(flag, action="store_true")
    return p


def _check_input(path: Path) -> tuple[str | None, list[str]]:
    """``(None, its StableHLO ops)`` if ``path`` is a valid module for its suffix, else
    ``(why not, [])``."""
    from jaxlib import _jax
    from jaxlib.mlir import ir
    from jaxlib.mlir._mlir_libs import _jax_mlir_ext
    from jaxlib.mlir.dialects import stablehlo

    data = path.read_bytes()
    try:
        if path.suffix == ".pb":
            data = bytes(_jax.mlir.hlo_to_stablehlo(data))
        reg = ir.DialectRegistry()
        _jax_mlir_ext.register_dialects(reg)
        with ir.Context() as ctx, ir.Location.unknown():
            ctx.append_dialect_registry(reg)
            ctx.load_all_available_dialects()
            stablehlo.register_dialect(ctx)
            module = ir.Module.parse(data)
            if not module.operation.verify():
                return "module does not verify", []
            text = str(module)
            if "stablehlo." not in text and "func.func" not in text:
                return "not a StableHLO module", []
    except Exception as e:  # jaxlib raises several types for garbage input
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", []
    return None, sorted(set(re.findall(r"stablehlo\.[a-z_]+", text)))


def main(argv: list[str]) -> int:
    _log(argv)
    if argv[:1] == ["--version"]:
        version = os.environ.get("NEURONX_CC_DOUBLE_VERSION", "2.28.7631.0+double")
        print(f"NeuronX Compiler version {version}")
        return 0
    if argv[:1] != ["compile"]:
        print(
            "neuronx-cc: error: the double supports only `compile` and --version", file=sys.stderr
        )
        return 2
    # argparse spells -O2 as "-O 2"; the real CLI accepts the attached form.
    args = _parser().parse_args(
        [
            a if not (a.startswith("-O") and a[2:].isdigit()) else f"--optlevel={a[2:]}"
            for a in argv[1:]
        ]
    )
    if args.lnc == 2 and args.target in ("trn1", "trn1n", "inf2"):
        return _error("NCC_EARG001", f"--lnc 2 with --target {args.target}")
    src = Path(args.model_files[0])
    if not src.exists():
        print(f"neuronx-cc: error: input file {src} not found", file=sys.stderr)
        return 2
    if not Path(args.output).parent.is_dir():
        print(f"neuronx-cc: error: output directory of {args.output} missing", file=sys.stderr)
        return 2
    bad, ops = _check_input(src)
    if bad is not None:
        return _error("NCC_EVRF064", bad)
    mode = os.environ.get("NEURONX_CC_DOUBLE_MODE", "ok")
    if mode == "sleep":
        time.sleep(float(os.environ.get("NEURONX_CC_DOUBLE_SLEEP", "60")))
    if mode == "fail":
        return _error(os.environ.get("NEURONX_CC_DOUBLE_CODE", "NCC_EVRF001"), src.name)
    print(f"Compiler status PASS (double): {src.name} for {args.target} lnc={args.lnc}")
    header = {
        "double": True,
        "target": args.target,
        "lnc": args.lnc,
        "optlevel": args.optlevel,
        "input_sha256": hashlib.sha256(src.read_bytes()).hexdigest(),
        "input_ops": ops,  # what was compiled, readable by tests
    }
    Path(args.output).write_bytes(b"NEFF-DOUBLE\0" + json.dumps(header).encode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
