"""Trainium smoke test: versions, then TinyGPT compiled for the detected target vs the CPU.

Run: ``python examples/trainium_smoke.py [--steps 5] [--target trn2]``.

1. Prints the versions that decide a NEFF (torch, jaxlib, StableHLO, neuronx-cc, Neuron runtime)
   and the target: ``--target``, else ``NEURON_COMPILE_TARGET``, else the detected device (trn2 /
   trn3 when a Neuron device and the runtime are present), else ``cpu``.
2. Trains a copy of TinyGPT for a few AdamW steps compiled for that target, and another copy
   compiled for ``cpu`` (XLA CPU), and compares the losses step by step.

On a Trainium host the target run executes NEFFs on the NeuronCore (matmuls may round
differently than XLA CPU: compared at 2e-2 relative). Elsewhere with a trn target it is
compile-only: NEFFs go to the cache when neuronx-cc is installed (else graphs stop after their
verified artifacts) and the CPU executor runs the graphs, so the losses agree to float32.
"""

from __future__ import annotations

import argparse
import copy
import os

import torch
from train_gpt import GPTConfig, TinyGPT, make_batches, train

import neuron_compile
from neuron_compile.dump import versions
from neuron_compile.targets import resolve_target
from neuron_compile.trainium import neuronx_cc
from neuron_compile.trainium import runtime as neuron_rt


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--target", choices=("auto", "cpu", "trn2", "trn3"))
    args = parser.parse_args(argv)
    target = resolve_target(args.target or os.environ.get("NEURON_COMPILE_TARGET", "auto"))
    exe = neuronx_cc.find_neuronx_cc()
    info = {
        **versions(),
        "neuronx-cc": f"{neuronx_cc.compiler_version(exe)} ({exe})" if exe else "not found",
        "neuron runtime": neuron_rt.runtime_version(),
        "device": "yes" if neuron_rt.available() else "no",
        "target": target,
    }
    for name, value in info.items():
        print(f"{name:16} {value}")

    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=1)
    model = TinyGPT(cfg)
    batches = make_batches(cfg, args.steps)
    neuron_compile.reset_metrics()
    os.environ["NEURON_COMPILE_TARGET"] = target
    on_target = train(copy.deepcopy(model), batches, backend="neuron")
    torch._dynamo.reset()
    os.environ["NEURON_COMPILE_TARGET"] = "cpu"
    on_cpu = train(copy.deepcopy(model), batches, backend="neuron")
    print(f"\n{'step':>5} {target:>10} {'cpu':>10}")
    for i, (a, b) in enumerate(zip(on_target, on_cpu, strict=True)):
        print(f"{i:>5} {a:>10.5f} {b:>10.5f}")
    tol = 2e-2 if neuron_rt.available() and target != "cpu" else 1e-5
    torch.testing.assert_close(torch.tensor(on_target), torch.tensor(on_cpu), rtol=tol, atol=tol)
    print(f"\nOK: {target} and cpu losses agree (rtol {tol:g})")
    return {"target": target, "losses": on_target, "cpu": on_cpu}


if __name__ == "__main__":
    main()
