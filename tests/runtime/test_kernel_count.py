"""``benchmarks/bench_kernel_floor.py`` counts the kernels XLA CPU compiles from its LLVM IR dumps:
a module of ``K`` independent elementwise chains is ``K`` kernels, and modules compiled before a
measurement (the process's warm-up) are left out."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import bench_kernel_floor as floor  # noqa: E402

_COMPILE = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {bench!r})
    import bench_kernel_floor as floor
    from neuron_compile.runtime import xla_cpu
    backend, _, devices, xc = xla_cpu._client()
    for k in (3, 7):
        backend.compile_and_load(
            floor._trivial_module(k), devices, xla_cpu.compile_options(xc.CompileOptions())
        )
    """
)


def test_kernels_are_counted_per_compiled_module(tmp_path: Path) -> None:
    env = dict(os.environ, XLA_FLAGS=f"--xla_dump_to={tmp_path} --xla_dump_hlo_pass_re=^$")
    script = _COMPILE.format(bench=str(REPO / "benchmarks"))
    subprocess.run([sys.executable, "-c", script], env=env, check=True, cwd=REPO)
    modules = list(floor._modules(str(tmp_path)))
    assert len(modules) == 2
    assert floor.count_kernels(str(tmp_path), skip=[]) == [3, 7]
    assert floor.count_kernels(str(tmp_path), skip=modules[:1]) == [7]


def test_floor_ratio_adds_the_floor_compile_time_to_aot_eager() -> None:
    row = {"graphs": 2, "kernels": [10, 30], "aot_eager_s": 0.5}
    ratio = floor.floor_ratio(row, {"per_compile_s": 0.01, "per_kernel_s": 0.004})
    assert abs(ratio - (1 + (0.02 + 0.16) / 0.5)) < 1e-12
