"""What every trn legality rule is made of: its catalogue entry, its violations, its context,
and a structured view of the emitted StableHLO for the per-op rules.

A rule is a generator ``check(gm, lowered, ctx) -> Iterator[Violation]`` declared with
``@legality_rule(...)``: the decorator records which neuronx-cc codes it pre-empts, our error
class, the hint shown to the user, the legal rewrite our trn lowering emits instead (if any) and
where the reference documents it. ``docs/trainium.md``'s error catalogue is checked against these
entries (``tests/test_docs_sync.py``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch.fx as fx

from .. import errors
from ..lowering.lower_graph import LoweredGraph

if TYPE_CHECKING:  # target.py imports the legality modules to check; no cycle at run time
    from .target import TrainiumTarget


@dataclass
class Violation:
    rule: str
    error: type[errors.LegalityError]
    ncc_code: str
    message: str
    node: fx.Node | None = None


@dataclass(frozen=True)
class Context:
    target: TrainiumTarget
    lnc: int
    flags: tuple[str, ...]

    def flag_value(self, name: str) -> str | None:
        """Value of ``--name=value`` / ``--name value`` in the user's neuronx-cc flags."""
        for i, word in enumerate(self.flags):
            if word == name and i + 1 < len(self.flags):
                return self.flags[i + 1]
            if word.startswith(name + "="):
                return word.split("=", 1)[1]
        return None

    def downcast_allowed(self, op: str) -> bool:
        """Whether ``--implicit-integer-downcast`` lets neuronx-cc compute integer ``op`` (dot,
        scatter, all_reduce, ...) in f32."""
        value = self.flag_value("--implicit-integer-downcast")
        return value is not None and (value in ("all", "default") or op in value.split(","))


Rule = Callable[[fx.GraphModule, LoweredGraph, Context], Iterator[Violation]]


@dataclass(frozen=True)
class RuleInfo:
    """One row of the error catalogue.

    ``codes``: the ``NCC_*`` codes the rule pre-empts. ``rewrite``: what our trn lowering emits
    instead of the rejected form ("" when there is no legal rewrite and the rule raises).
    ``source``: where the reference states the rule (``docs/trainium-reference.md`` section).
    """

    rule: str
    error: type[errors.LegalityError]
    codes: tuple[str, ...]
    hint: str
    rewrite: str = ""
    source: str = "R6"


def legality_rule(
    rule: str,
    error: type[errors.LegalityError],
    codes: tuple[str, ...],
    hint: str,
    *,
    rewrite: str = "",
    source: str = "R6",
) -> Callable[[Rule], Rule]:
    """Attach the catalogue entry ``RuleInfo`` to a rule function as ``check.info``."""
    info = RuleInfo(rule, error, codes, hint, rewrite, source)

    def attach(check: Rule) -> Rule:
        check.info = info  # type: ignore[attr-defined]
        return check

    return attach


def info(check: Rule) -> RuleInfo:
    return check.info  # type: ignore[attr-defined]


# -- a structured view of the emitted module ---------------------------------------------------


@dataclass(frozen=True)
class HloOp:
    """One operation of the emitted module, nested regions included (a reduce body's ops too).

    ``attributes`` maps each attribute name to its printed value; ``operand_types`` and
    ``result_types`` are element types (``f32``, ``i32``, ``i1``, ``ui8``; ``""`` for tokens and
    tuples); ``line`` is the 1-based line of ``lowered.text`` (``LoweredGraph.node_at_line``).
    """

    name: str
    line: int
    attributes: Mapping[str, str]
    operand_types: tuple[str, ...]
    result_types: tuple[str, ...]
    region_ops: tuple[str, ...]  # names of the ops in its regions (a reduction body's combiner)

    def ints(self, attribute: str) -> tuple[int, ...] | None:
        """An integer-array attribute (``array<i64: 1, 2>`` or ``dense<[[1, 1], [0, 0]]>``),
        flattened; a splat ``dense<1> : tensor<2xi64>`` repeats its value; None if absent."""
        text = self.attributes.get(attribute)
        if text is None:
            return None
        body = text.split(":", 1)[1] if text.startswith("array<") else text
        body = body.split(" : ", 1)[0]
        values = tuple(int(v) for v in re.findall(r"-?\d+", body))
        splat = re.fullmatch(r"dense<(-?\d+)> : tensor<(\d+(?:x\d+)*)xi64>", text)
        if splat:
            count = 1
            for d in splat.group(2).split("x"):
                count *= int(d)
            return (int(splat.group(1)),) * count
        return values


_LINE = re.compile(r":(\d+):\d+\)")


def _element_type(value: object) -> str:
    from jaxlib.mlir import ir

    t = value.type  # type: ignore[attr-defined]
    if isinstance(t, ir.RankedTensorType):
        return str(t.element_type)
    return ""


def _walk(block: object) -> Iterator[HloOp]:
    for view in block.operations:  # type: ignore[attr-defined]
        op = view.operation
        m = _LINE.search(str(op.location))
        inner = [o for r in op.regions for b in r.blocks for o in _walk(b)]
        yield HloOp(
            name=op.name,
            line=int(m.group(1)) if m else 0,
            attributes={a: str(op.attributes[a]) for a in op.attributes},
            operand_types=tuple(_element_type(v) for v in op.operands),
            result_types=tuple(_element_type(v) for v in op.results),
            region_ops=tuple(o.name for o in inner),
        )
        yield from inner


@functools.lru_cache(maxsize=8)
def hlo_ops(text: str) -> tuple[HloOp, ...]:
    """Every op of the module ``text`` (generic or pretty form) in textual order, nested regions
    after their op. Parsed once per text: every per-op rule of one check shares it."""
    from jaxlib.mlir import ir

    from ..artifact import _context

    if not text.strip():
        return ()
    with _context(), ir.Location.unknown():
        module = ir.Module.parse(text)
        return tuple(op for top in module.body.operations for r in top.regions
                     for b in r.blocks for op in _walk(b))  # fmt: skip


def ops_named(lowered: LoweredGraph, *names: str) -> Iterator[HloOp]:
    """The ops of ``lowered`` named ``stablehlo.<name>`` (or exactly ``name`` if it has a dot);
    no parse at all when the text mentions none of them."""
    full = tuple(n if "." in n else f"stablehlo.{n}" for n in names)
    if not any(n in lowered.text for n in full):
        return
    for op in hlo_ops(lowered.text):
        if op.name in full:
            yield op
