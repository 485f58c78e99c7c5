"""Delta debugging over the ops of a failing StableHLO module.

``minimize(text, still_fails)`` returns the smallest module (1-minimal in ops, by Zeller's ddmin)
for which ``still_fails(text)`` is true. Removing an op never breaks the module's SSA form: a
value whose producer was removed becomes a new argument of ``@main`` with the producer's result
type, so every candidate is as well-typed as the original except for the defect itself.

Works on the generic-form text neuron-compile's emitter writes (``"stablehlo.op"(...) : (...) ->
...``, one top-level op per line starting with four spaces, regions on following lines), which is
what failure bundles store. Predicates for failures reproducible on this machine:
``verifier_fails_like`` (NC103) and ``executor_fails`` (NC301 / XLA rejecting the module).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

_FUNC_RE = re.compile(
    r"^\s*func\.func\s+(?:public\s+)?@main\((?P<args>.*)\)\s*->\s*(?P<res>.*?)\s*\{\s*$"
)
_ARG_RE = re.compile(r"(%[\w.$-]+)\s*:\s*(tensor<[^>]*>)")
_RESULT_RE = re.compile(r"^    (%[\w.$-]+)(?::(\d+))? = ")
_VALUE_RE = re.compile(r"%[\w.$-]+(?:#\d+)?")
_DEF_RE = re.compile(r"(%[\w.$-]+)(?::\d+)? = ")
_BB_RE = re.compile(r"\^bb\d*\((.*?)\)")
_SIG_RE = re.compile(r"->\s*(\(.*\)|tensor<[^>]*>)\s*$")


@dataclass
class _Op:
    text: str
    results: list[str]  # value names as used: %7, or %m7#0, %m7#1
    types: list[str]
    uses: list[str]

    @property
    def name(self) -> str:
        m = re.search(r'"([\w.]+)"\(', self.text)
        return m.group(1) if m else "?"


@dataclass
class Module:
    """A parsed ``@main``: everything needed to rebuild it from a subset of its ops."""

    head: list[str]  # lines before func.func
    args: list[tuple[str, str]]
    result_types: str  # as written after '->'
    ops: list[_Op]
    ret: list[str]  # returned value names
    ret_line: str
    tail: list[str]

    @classmethod
    def parse(cls, text: str) -> Module:
        lines = text.splitlines()
        start = next(i for i, ln in enumerate(lines) if _FUNC_RE.match(ln))
        m = _FUNC_RE.match(lines[start])
        assert m is not None
        end = next(i for i in range(start + 1, len(lines)) if lines[i].strip().startswith("return"))
        chunks: list[list[str]] = []
        for ln in lines[start + 1 : end]:
            if ln.startswith("    ") and not ln.startswith("     ") and ln.strip():
                chunks.append([ln])
            elif chunks:
                chunks[-1].append(ln)
        ops = [_parse_op("\n".join(c)) for c in chunks]
        ret_line = lines[end]
        ret_vals = ret_line.strip()[len("return") :].split(":", 1)[0]
        return cls(
            head=lines[:start],
            args=_ARG_RE.findall(m["args"]),
            result_types=m["res"],
            ops=ops,
            ret=_VALUE_RE.findall(ret_vals),
            ret_line=ret_line,
            tail=lines[end + 1 :],
        )

    def build(self, keep: Sequence[int]) -> str:
        """The module with only ops ``keep`` (indices); missing producers become arguments."""
        kept = sorted(set(keep))
        defined: set[str] = set()
        arg_types = dict(self.args)
        result_type = {r: t for op in self.ops for r, t in zip(op.results, op.types, strict=False)}
        extra: dict[str, str] = {}

        def need(v: str) -> None:
            if v in defined or v in arg_types or v in extra:
                return
            if v in result_type:
                extra[v] = result_type[v]

        body = []
        for i in kept:
            op = self.ops[i]
            for u in op.uses:
                need(u)
            defined.update(op.results)
            body.append(op.text)
        for v in self.ret:
            need(v)
        used = {u for i in kept for u in self.ops[i].uses} | set(self.ret)
        params = [(n, t) for n, t in self.args if n in used] + list(extra.items())
        rename = {n: _arg_name(n) for n in extra}
        sig = ", ".join(f"{rename.get(n, n)}: {t}" for n, t in params)
        text = "\n".join(
            [
                *self.head,
                f"  func.func public @main({sig}) -> {self.result_types} {{",
                *body,
                self.ret_line,
                *self.tail,
            ]
        )
        for old, new in sorted(rename.items(), key=lambda kv: -len(kv[0])):
            if old != new:
                text = re.sub(re.escape(old) + r"(?![\w#])", new, text)
        return text


def _arg_name(value: str) -> str:
    """``%m7#1`` cannot name a block argument: ``%m7_1``."""
    return value.replace("#", "_")


def _split_types(s: str) -> list[str]:
    s = s.strip()
    if s.startswith("(") and s.endswith(")"):
        s = s[1:-1]
    out, depth, cur = [], 0, ""
    for ch in s:
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return [t for t in [*out, cur.strip()] if t]


def _parse_op(text: str) -> _Op:
    first, last = text.splitlines()[0], text.splitlines()[-1]
    m = _RESULT_RE.match(first)
    sig = _SIG_RE.search(last)
    types = _split_types(sig.group(1)) if sig else []
    if m is None:
        results: list[str] = []
    elif m.group(2):
        results = [f"{m.group(1)}#{i}" for i in range(int(m.group(2)))]
    else:
        results = [m.group(1)]
    local = set(_DEF_RE.findall(text))
    for bb in _BB_RE.findall(text):
        local.update(v for v, _ in _ARG_RE.findall(bb))
    body = text[m.end() :] if m else text
    uses = []
    for v in _VALUE_RE.findall(body):
        if v.split("#")[0] not in local and v not in uses:
            uses.append(v)
    return _Op(text, results, types, uses)


def count_ops(text: str) -> int:
    """Top-level ops of ``@main`` (what the minimizer counts)."""
    return len(Module.parse(text).ops)


def ddmin(items: list[int], test: Callable[[list[int]], bool]) -> list[int]:
    """Zeller's ddmin: a 1-minimal sublist of ``items`` for which ``test`` holds."""
    n = 2
    while len(items) >= 2:
        size = -(-len(items) // n)
        parts = [items[i : i + size] for i in range(0, len(items), size)]
        for part in parts:
            if test(part):
                items, n = part, 2
                break
        else:
            for part in parts:
                rest = [x for x in items if x not in part]
                if rest and test(rest):
                    items, n = rest, max(n - 1, 2)
                    break
            else:
                if n >= len(items):
                    break
                n = min(len(items), 2 * n)
    return items


def minimize(text: str, still_fails: Callable[[str], bool]) -> str:
    """The smallest module whose ``still_fails`` is true (``text`` itself must fail)."""
    module = Module.parse(text)
    cache: dict[tuple[int, ...], bool] = {}

    def test(keep: list[int]) -> bool:
        key = tuple(keep)
        if key not in cache:
            try:
                cache[key] = bool(still_fails(module.build(keep)))
            except Exception:
                cache[key] = False
        return cache[key]

    everything = list(range(len(module.ops)))
    if not test(everything):
        raise ValueError("the module does not fail the predicate: nothing to minimize")
    return module.build(ddmin(everything, test))


def _normalize(message: str) -> str:
    return re.sub(r"%[\w.$#-]+|\d+", "#", message).strip()


def verifier_fails_like(message: str | None = None) -> Callable[[str], bool]:
    """Predicate: the StableHLO verifier rejects the module (with ``message``, modulo SSA names
    and numbers, when given)."""
    from ..artifact import VerifyFailure, verify

    want = _normalize(message) if message else None

    def check(text: str) -> bool:
        try:
            verify(text)
        except VerifyFailure as e:
            return want is None or _normalize(e.message) == want
        return False

    return check


def executor_fails(text: str) -> bool:
    """Predicate: the module verifies, but XLA's CPU client cannot compile or run it."""
    from ..artifact import VerifyFailure, serialize, verify
    from ..runtime.xla_cpu import XlaCpuExecutable

    try:
        verify(text)
    except VerifyFailure:
        return False
    try:
        exe = XlaCpuExecutable(serialize(text))
        inputs = random_inputs(text)
        exe(inputs, [None] * len(inputs))
    except Exception:
        return True
    return False


_DTYPES = {
    "f32": "float32",
    "f16": "float16",
    "bf16": "bfloat16",
    "f64": "float64",
    "i1": "bool",
    "i8": "int8",
    "ui8": "uint8",
    "i16": "int16",
    "i32": "int32",
    "i64": "int64",
}


def random_inputs(text: str, seed: int = 0) -> list:
    """Deterministic random torch tensors for ``@main``'s arguments."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = []
    for _, ty in Module.parse(text).args:
        parts = ty[len("tensor<") : -1].split("x")
        shape = [int(p) for p in parts[:-1]]
        dtype = getattr(torch, _DTYPES.get(parts[-1], "float32"))
        if dtype.is_floating_point:
            out.append(torch.randn(shape, generator=g).to(dtype))
        elif dtype == torch.bool:
            out.append(torch.randint(0, 2, shape, generator=g).bool())
        else:
            out.append(torch.randint(0, 8, shape, generator=g).to(dtype))
    return out
