"""A TEST DOUBLE of the ``nki`` package (the real one exists only on Trainium hosts).

Not AWS's NKI: it implements just the beta-3 surface ``neuron_compile.nki._kernel_config`` uses
(``nki.jit``, ``nki.compiler.ncc_driver.CompileOptions``,
``nki.framework.compiled.compile_kernel_to_nir(...).build_config()``), records every call, and
answers with a fixed base64 JSON ``backend_config`` so tests can assert it is passed through
verbatim. Install it with :func:`install` (``sys.modules`` entries, undone by ``monkeypatch``).
"""

from __future__ import annotations

import base64
import json
import sys
from dataclasses import dataclass
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import pytest

VERSION = "0.7.0+double"
BACKEND_CONFIG = base64.b64encode(
    json.dumps({"func_name": "double_kernel", "kernel_format": "bir", "double": True}).encode()
).decode()


@dataclass
class CompileOptions:
    target: str | None
    lnc: int
    artifacts_dir: str
    output_path: str


class NkiDouble:
    """The installed double: ``calls`` holds ``(kernel, inputs, compile_opts)`` per compile."""

    def __init__(self, version: str) -> None:
        self.calls: list[tuple[Any, dict[str, Any], CompileOptions]] = []
        self.version = version

    def compile_kernel_to_nir(
        self,
        kernel: Any,
        *,
        inputs: dict[str, Any],
        compile_opts: CompileOptions,
        enable_cache: bool,
    ) -> Any:
        self.calls.append((kernel, inputs, compile_opts))
        # Like the real thing, output specs come from tracing the kernel: here its reference
        # semantics are "same shape/dtype as the first tensor input".
        first = next(v for v in inputs.values() if isinstance(v, np.ndarray))
        config = SimpleNamespace(
            backend_config_b64=BACKEND_CONFIG,
            output_specs=[SimpleNamespace(shape=first.shape, dtype=first.dtype)],
            has_collectives=False,
            operand_output_aliases={},
        )
        return SimpleNamespace(build_config=lambda: config, is_tuple_return=False)


def install(monkeypatch: pytest.MonkeyPatch, version: str = VERSION) -> NkiDouble:
    double = NkiDouble(version)
    nki = ModuleType("nki")
    nki.__version__ = version
    nki.jit = lambda fn: fn
    compiler, driver = ModuleType("nki.compiler"), ModuleType("nki.compiler.ncc_driver")
    framework, compiled = ModuleType("nki.framework"), ModuleType("nki.framework.compiled")
    driver.CompileOptions = CompileOptions
    compiled.compile_kernel_to_nir = double.compile_kernel_to_nir
    nki.compiler, compiler.ncc_driver = compiler, driver
    nki.framework, framework.compiled = framework, compiled
    for mod in (nki, compiler, driver, framework, compiled):
        monkeypatch.setitem(sys.modules, mod.__name__, mod)
    return double
