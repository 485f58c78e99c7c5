"""The house plan holds: the core knows no target, targets load only when chosen, no import cycles."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap

import pytest

from tests.helpers import REPO_ROOT

PACKAGE = REPO_ROOT / "neuron_compile"
#: The core: it asks a ``Target`` and never names one (docs/architecture.md).
CORE = ["backend.py", "compiler.py", "partition.py", "capture.py", "passes", "lowering"]
CORE += ["cache", "report", "runtime", "targets.py", "config.py"]


def _module_name(path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_imports(path, modules: set[str]) -> set[str]:
    """Modules of the package ``path`` imports at run time, at any depth (functions included;
    ``if TYPE_CHECKING:`` blocks excluded)."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
        for stmt in node.body
        for inner in ast.walk(stmt)
    }
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            source = ".".join(base + [node.module] if node.module else base)
            if not node.level:
                source = node.module or ""
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                found.add(sub if sub in modules else source)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m in modules and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                out.append(sorted([v, *component]))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles_counting_imports_inside_functions():
    paths = list(PACKAGE.rglob("*.py"))
    modules = {_module_name(p) for p in paths}
    graph = {_module_name(p): _runtime_imports(p, modules) for p in paths}
    assert _cycles(graph) == []


def _core_files():
    for entry in CORE:
        path = PACKAGE / entry
        yield from sorted(path.rglob("*.py")) if path.is_dir() else [path]


def test_the_core_names_no_target_and_imports_nothing_of_trainium():
    modules = {_module_name(p) for p in PACKAGE.rglob("*.py")}
    named = []
    for path in _core_files():
        where = path.relative_to(REPO_ROOT)
        imports = _runtime_imports(path, modules)
        named += [
            f"{where} imports {m}" for m in imports if m.startswith("neuron_compile.trainium")
        ]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in ("trn", "trn2", "trn3"):
                named.append(f"{where}:{node.lineno} names {node.value!r}")
            if isinstance(node, ast.Attribute) and node.attr == "is_neuron":
                named.append(f"{where}:{node.lineno} asks is_neuron")
    assert named == []


def test_the_compiler_does_not_branch_on_the_target():
    tree = ast.parse((PACKAGE / "compiler.py").read_text())
    tests = [ast.unparse(n.test) for n in ast.walk(tree) if isinstance(n, (ast.If, ast.IfExp))]
    # It may ask the target what it can do (a capability), never which target it is.
    identity = ("cfg.target ==", "cfg.target !=", "cfg.target in", ".name", "isinstance(target")
    assert [t for t in tests if any(word in t for word in identity)] == []


_PROBE = textwrap.dedent(
    """
    import json, sys
    import torch
    import neuron_compile

    options = {"target": sys.argv[1]} if sys.argv[1] != "auto" else {}
    f = torch.compile(lambda x: torch.nn.functional.gelu(x).sum(), backend="neuron", options=options)
    f(torch.randn(4, 8))
    assert neuron_compile.metrics(), "nothing compiled"
    print(json.dumps(sorted(m for m in sys.modules if m.startswith("neuron_compile.trainium"))))
    """
)


@pytest.mark.parametrize(
    ("target", "loaded"),
    [
        ("cpu", []),
        # target="auto" asks the device probe, which is standard library only.
        ("auto", ["neuron_compile.trainium", "neuron_compile.trainium.probe"]),
    ],
)
def test_a_cpu_compile_loads_no_trainium_module(target, loaded, tmp_path):
    env = {
        "PATH": "/usr/bin:/bin",
        "NEURON_COMPILE_CACHE_DIR": str(tmp_path),
        "HOME": str(tmp_path),
    }
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, target],
        env={**env, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == loaded


def test_ops_lists_the_trainium_kernel_forms():
    from neuron_compile.cli import _ops
    from neuron_compile.trainium.kernels.fused import NEURON_CALLS

    trn2 = _ops("trn2")["forms"]
    kernels = {op for op, form in trn2.items() if form == "kernel"}
    flash = {
        "neuron_compile.flash_attention.default",
        "neuron_compile.flash_attention_backward.default",
    }
    assert {str(op) for op in NEURON_CALLS} | flash <= kernels
    assert trn2["aten.addmm.default"] == "reference"
    own = {op for op, form in _ops("cpu")["forms"].items() if form != "reference"}
    assert own == {
        "aten.convolution.default",
        "aten.convolution_backward.default",
        "aten.max_pool2d_with_indices_backward.default",
        "aten.max_pool3d_with_indices_backward.default",
        "aten.cumsum.default",
        "aten.cumprod.default",
    }
