"""rewrite_neuron_calls: turn ATen subgraphs neuronx-cc has kernels for into ``neuron_compile`` ops.

trn targets only (``TrainiumTarget.pipeline``). The ops in ``kernels/fused.py`` lower to
``AwsNeuron*`` custom calls for neuronx-cc and to their reference decomposition on XLA CPU.

Requires: ``meta["val"]`` (fake tensors) on every node of a candidate match.
Guarantees: each rewritten match computes the same math as before (the ops' references are the
decompositions matched here; in bfloat16/float16 a hand-written GELU rounded after every op and
the kernel's single rounding can differ by a few ulps, as the device kernel would); the new node takes over the matched output's ``meta["val"]`` and
``stack_trace``; interior nodes are erased. A match is rewritten only when

- no interior node (every matched node except the output) has a user outside the match: otherwise
  the interior stays alive and the kernel adds work instead of replacing it. In training graphs the
  RMSNorm ``rsqrt`` (and every interior value of a hand-written GELU/SiLU) is saved for backward,
  so those stay decomposed; the single-node forms AOTAutograd keeps whole are still rewritten;
- every tensor involved is float32, bfloat16 or float16, all of one dtype, with static shapes;
- softmax reduces over the last dim (``_softmax_dim_qualifies``);
- no matched node has effects (``effects.has_effects``): a collective or ``wait_tensor`` can be an
  argument of a rewritten call, never part of one.

Matched forms (``*`` and ``+`` in any operand order and association):

- single nodes: ``aten._softmax(x, dim, False)``, ``aten._softmax_backward_data``, ``aten.gelu``,
  ``aten.gelu_backward(approximate="none")`` (no kernel for the tanh backward), ``aten.silu``,
  ``aten.silu_backward``;
- SiLU ``x * sigmoid(x)``;
- GELU erf ``0.5 * x * (1 + erf(x / sqrt(2)))`` (or ``erf(x * (1 / sqrt(2)))``, ``... / 2``);
- GELU tanh (GPT-2's NewGELU) ``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x³)))`` with
  ``x³`` as ``pow(x, 3)`` or ``x * x * x``; constants must equal these to float32 precision;
- RMSNorm ``x * rsqrt(mean(x², [-1], keepdim=True) + eps) [* weight]`` with ``x²`` as
  ``pow(x, 2)`` or ``x * x``, the mean over ``-1`` or ``rank - 1``, ``weight`` 1-D of the last
  dim's size. LLaMA/HF's form (cast to float32, normalize, cast back, scale) matches its float32
  inner part without the weight.
"""

from __future__ import annotations

import functools
import logging
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

from ..passes.effects import has_effects, without_effects
from ..passes.graph_edits import call_before
from ..passes.graph_queries import nodes_calling
from .kernels import fused  # noqa: F401  (registers torch.ops.neuron_compile.*)

log = logging.getLogger(__name__)

aten = torch.ops.aten
nc = torch.ops.neuron_compile

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_MUL = (aten.mul.Tensor, aten.mul.Scalar)
_DIV = (aten.div.Tensor, aten.div.Scalar)
_ADD = (aten.add.Tensor, aten.add.Scalar)


@dataclass
class _Match:
    """What replaces ``output``: ``op(*args)``; ``interior`` are the other matched nodes."""

    op: Any
    args: tuple[Any, ...]
    interior: list[fx.Node] = field(default_factory=list)


# ---- small structural helpers ----------------------------------------------------------------
def _is(node: object, *targets: Any) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target in targets


def _scalar(arg: object) -> float | None:
    if isinstance(arg, bool) or not isinstance(arg, int | float):
        return None
    return float(arg)


def _near(value: float | None, expected: float) -> bool:
    """Equal to ``expected`` to float32 precision (one ulp, relative)."""
    return value is not None and math.isclose(value, expected, rel_tol=2.0**-23)


def _arg(node: fx.Node, index: int, name: str, default: Any = None) -> Any:
    return node.args[index] if len(node.args) > index else node.kwargs.get(name, default)


def _alpha_is_one(node: fx.Node) -> bool:
    return _scalar(node.kwargs.get("alpha", 1)) == 1.0


@dataclass
class _Product:
    """A tree of ``*`` (and ``/ scalar``) flattened: ``coef * prod(factors)``."""

    factors: list[fx.Node]
    coef: float
    nodes: list[fx.Node]  # the mul/div nodes the tree is made of


def _product(root: fx.Node) -> _Product | None:
    """Flatten the multiplications rooted at ``root``; commutativity and association then stop
    mattering. Below the root, a mul/div is only descended into when the tree is its one user (a
    shared product is a leaf factor, so the flattening never swallows a value used elsewhere).
    None if a tensor is divided by a tensor or a scalar multiplies by a scalar only."""
    prod = _Product([], 1.0, [])

    def visit(node: fx.Node, is_root: bool) -> bool:
        if not _is(node, *_MUL, *_DIV) or (not is_root and len(node.users) != 1):
            prod.factors.append(node)
            return True
        lhs, rhs = node.args[0], node.args[1]
        if _is(node, *_DIV):
            divisor = _scalar(rhs)
            if divisor is None or divisor == 0.0 or "rounding_mode" in node.kwargs:
                if not is_root:
                    prod.factors.append(node)
                    return True
                return False
            prod.coef /= divisor
            operands = [lhs]
        else:
            operands = [lhs, rhs]
        prod.nodes.append(node)
        for operand in operands:
            if isinstance(operand, fx.Node):
                if not visit(operand, False):
                    return False
            elif (c := _scalar(operand)) is not None:
                prod.coef *= c
            else:
                return False
        return True

    if not visit(root, True) or not prod.factors:
        return None
    return prod


def _unary_product(node: fx.Node, coef: float) -> tuple[fx.Node, list[fx.Node]] | None:
    """``node`` is ``coef * t`` for one tensor ``t``: return ``(t, the mul/div nodes)``."""
    prod = _product(node)
    if prod is None or len(prod.factors) != 1 or not _near(prod.coef, coef):
        return None
    return prod.factors[0], prod.nodes


def _add_scalar(node: object, value: float) -> fx.Node | None:
    """``node`` is ``t + value`` (either order): return ``t``."""
    if not _is(node, *_ADD) or not _alpha_is_one(node):
        return None
    a, b = node.args[0], node.args[1]
    if isinstance(a, fx.Node) and _near(_scalar(b), value):
        return a
    if isinstance(b, fx.Node) and _near(_scalar(a), value):
        return b
    return None


def _split(factors: Sequence[fx.Node], x: fx.Node) -> fx.Node | None:
    """``factors`` is ``[x, other]`` in either order: return ``other``."""
    if len(factors) != 2 or x not in factors:
        return None
    rest = list(factors)
    rest.remove(x)
    return rest[0]


def _monomial(node: fx.Node, x: fx.Node) -> tuple[int, float, list[fx.Node]] | None:
    """``node`` is ``coef * x ** n`` (``x * x``, ``pow(x, 2)``, ``0.044715 * x * x * x``, ...):
    return ``(n, coef, its nodes)``."""
    prod = _product(node)
    if prod is None:
        return None
    exponent, nodes = 0, list(prod.nodes)
    for f in prod.factors:
        if f is x:
            exponent += 1
        elif _is(f, aten.pow.Tensor_Scalar) and f.args[0] is x and len(f.users) == 1:
            n = _scalar(f.args[1])
            if n is None or n != int(n) or n < 1:
                return None
            exponent += int(n)
            nodes.append(f)
        else:
            return None
    return exponent, prod.coef, nodes


def _square_of(node: fx.Node, x: fx.Node) -> list[fx.Node] | None:
    """``node`` is ``x * x`` or ``pow(x, 2)``: return its nodes."""
    monomial = _monomial(node, x)
    return monomial[2] if monomial is not None and monomial[:2] == (2, 1.0) else None


# ---- patterns ---------------------------------------------------------------------------------
@dataclass
class _Site:
    """The node the patterns are tried at. Every ``*`` pattern starts by flattening it, so its
    product is computed once for all of them (the graph does not change while they are tried)."""

    node: fx.Node

    @functools.cached_property
    def product(self) -> _Product | None:
        return _product(self.node)


def _softmax_dim_qualifies(dim: object, rank: int) -> bool:
    """neuronx-cc's softmax kernels reduce along the free (last) axis of their SBUF layout; a
    softmax over another dim would need a transpose around the call, which the plain
    decomposition avoids. So only the last dim qualifies."""
    return isinstance(dim, int) and rank > 0 and dim % rank == rank - 1


def _rank(node: fx.Node) -> int:
    return node.meta["val"].dim()


def _single_node(site: _Site) -> _Match | None:
    """ATen ops AOTAutograd keeps whole for trn targets (and core ATen's softmax and gelu)."""
    node = site.node
    if _is(node, aten._softmax.default):
        x, dim, half_to_float = node.args[:3]
        if not half_to_float and _softmax_dim_qualifies(dim, _rank(node)):
            return _Match(nc.softmax.default, (x, dim))
    elif _is(node, aten._softmax_backward_data.default):
        grad, out, dim, input_dtype = node.args[:4]
        if input_dtype == node.meta["val"].dtype and _softmax_dim_qualifies(dim, _rank(node)):
            return _Match(nc.softmax_backward.default, (grad, out, dim))
    elif _is(node, aten.gelu.default):
        return _Match(nc.gelu.default, (node.args[0], _arg(node, 1, "approximate", "none")))
    elif _is(node, aten.gelu_backward.default):
        if _arg(node, 2, "approximate", "none") == "none":  # no kernel for the tanh backward
            return _Match(nc.gelu_backward.default, (node.args[0], node.args[1], "none"))
    elif _is(node, aten.silu.default):
        return _Match(nc.silu.default, (node.args[0],))
    elif _is(node, aten.silu_backward.default):
        return _Match(nc.silu_backward.default, (node.args[0], node.args[1]))
    return None


def _silu(site: _Site) -> _Match | None:
    """``x * sigmoid(x)``."""
    prod = site.product if _is(site.node, *_MUL) else None
    if prod is None or prod.coef != 1.0 or len(prod.factors) != 2:
        return None
    for sig in prod.factors:
        if _is(sig, aten.sigmoid.default) and _split(prod.factors, sig) is sig.args[0]:
            return _Match(nc.silu.default, (sig.args[0],), [*prod.nodes[1:], sig])
    return None


def _gelu_halves(site: _Site, unary: Any) -> tuple[fx.Node, fx.Node, list[fx.Node]] | None:
    """``0.5 * x * (1 + unary(...))``: return ``(x, the unary node, interior so far)``; the
    caller checks that the unary's argument is a function of ``x``."""
    prod = site.product if _is(site.node, *_MUL, *_DIV) else None
    if prod is None or not _near(prod.coef, 0.5) or len(prod.factors) != 2:
        return None
    for one_plus in prod.factors:
        f = _add_scalar(one_plus, 1.0)
        x = _split(prod.factors, one_plus)
        if _is(f, unary) and x is not None:
            return x, f, [*prod.nodes[1:], one_plus]
    return None


def _gelu_erf(site: _Site) -> _Match | None:
    """``0.5 * x * (1 + erf(x / sqrt(2)))``."""
    halves = _gelu_halves(site, aten.erf.default)
    if halves is None:
        return None
    x, erf, interior = halves
    scaled = _unary_product(erf.args[0], 1 / math.sqrt(2.0))
    if scaled is None or scaled[0] is not x:
        return None
    return _Match(nc.gelu.default, (x, "none"), [*interior, erf, *scaled[1]])


def _gelu_tanh(site: _Site) -> _Match | None:
    """``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x³)))``."""
    halves = _gelu_halves(site, aten.tanh.default)
    if halves is None:
        return None
    x, tanh, interior = halves
    scaled = _unary_product(tanh.args[0], math.sqrt(2.0 / math.pi))
    if scaled is None or not _is(scaled[0], aten.add.Tensor) or not _alpha_is_one(scaled[0]):
        return None
    inner = scaled[0]
    cubic_term = _split([a for a in inner.args[:2] if isinstance(a, fx.Node)], x)
    cubic = _monomial(cubic_term, x) if cubic_term is not None else None
    if cubic is None or cubic[0] != 3 or not _near(cubic[1], 0.044715):
        return None
    interior += [tanh, *scaled[1], inner, *cubic[2]]
    return _Match(nc.gelu.default, (x, "tanh"), interior)


def _rms_norm(site: _Site) -> _Match | None:
    """``x * rsqrt(mean(x², [-1], keepdim=True) + eps) [* weight]``."""
    prod = site.product if _is(site.node, *_MUL) else None
    if prod is None or prod.coef != 1.0 or len(prod.factors) not in (2, 3):
        return None
    rsqrt = next((f for f in prod.factors if _is(f, aten.rsqrt.default)), None)
    if rsqrt is None or not _is(rsqrt.args[0], *_ADD) or not _alpha_is_one(rsqrt.args[0]):
        return None
    add = rsqrt.args[0]
    mean, eps = add.args[0], _scalar(add.args[1])
    if eps is None:
        mean, eps = add.args[1], _scalar(add.args[0])
    if eps is None or not _is(mean, aten.mean.dim) or mean.kwargs.get("dtype") is not None:
        return None
    square, dims, keepdim = mean.args[0], mean.args[1], _arg(mean, 2, "keepdim", False)
    rest = [f for f in prod.factors if f is not rsqrt]
    for x in rest:
        square_nodes = _square_of(square, x)
        if square_nodes is not None:
            break
    else:
        return None
    x_val = x.meta.get("val")
    if not isinstance(x_val, torch.Tensor) or x_val.dim() == 0 or not keepdim:
        return None
    if not isinstance(dims, list | tuple) or len(dims) != 1 or not isinstance(dims[0], int):
        return None
    if dims[0] % x_val.dim() != x_val.dim() - 1:  # the kernel normalizes the last dim only
        return None
    rest.remove(x)
    weight = rest[0] if rest else None
    w_val = weight.meta.get("val") if weight is not None else None
    if weight is not None and (w_val is None or tuple(w_val.shape) != (x_val.shape[-1],)):
        return None
    interior = [*prod.nodes[1:], rsqrt, add, mean, *square_nodes]
    return _Match(nc.rms_norm.default, (x, weight, eps), interior)


Pattern = Callable[[_Site], "_Match | None"]

#: The patterns that can match at a node, by the node's target, tried in order (outputs first:
#: ``rewrite_neuron_calls`` walks the graph backwards, so a weighted RMSNorm is seen before its
#: unweighted inner product). Only nodes calling one of these targets are visited.
_SINGLE_NODE_TARGETS = (
    aten._softmax.default,
    aten._softmax_backward_data.default,
    aten.gelu.default,
    aten.gelu_backward.default,
    aten.silu.default,
    aten.silu_backward.default,
)
_PATTERNS_AT: dict[Any, tuple[Pattern, ...]] = {
    **dict.fromkeys(_SINGLE_NODE_TARGETS, (_single_node,)),
    **dict.fromkeys(_MUL, (_silu, _gelu_erf, _gelu_tanh, _rms_norm)),
    **dict.fromkeys(_DIV, (_gelu_erf, _gelu_tanh)),
}
#: The op a decomposed pattern cannot match without (its nonlinearity). A graph without it skips
#: the pattern (most graphs have few of these ops), and rewriting never adds one.
_ANCHOR_OF: dict[Pattern, Any] = {
    _silu: aten.sigmoid.default,
    _gelu_erf: aten.erf.default,
    _gelu_tanh: aten.tanh.default,
    _rms_norm: aten.rsqrt.default,
}


def _patterns_for(graph: fx.Graph) -> dict[Any, tuple[Pattern, ...]]:
    """``_PATTERNS_AT`` without the patterns whose anchor op ``graph`` does not call (shared
    between graphs: read only)."""
    absent = frozenset(
        anchor
        for anchor in _ANCHORS
        if not graph.find_nodes(op="call_function", target=anchor, sort=False)
    )
    return _patterns_without(absent)


_ANCHORS = tuple(dict.fromkeys(_ANCHOR_OF.values()))


@functools.cache
def _patterns_without(absent: frozenset[Any]) -> dict[Any, tuple[Pattern, ...]]:
    patterns_at = {}
    for target, patterns in _PATTERNS_AT.items():
        kept = tuple(p for p in patterns if _ANCHOR_OF.get(p) not in absent)
        if kept:
            patterns_at[target] = kept
    return patterns_at


# ---- legality and rewriting -------------------------------------------------------------------
def _tensors(match: _Match) -> list[fx.Node]:
    return [a for a in match.args if isinstance(a, fx.Node)]


def _why_not(output: fx.Node, match: _Match) -> str | None:
    """None if ``match`` may replace ``output``, else the reason it may not."""
    inside = {output, *match.interior}
    for node in inside:
        if has_effects(node):
            return f"{node.name} has effects ({node.target})"
    for node in match.interior:
        if any(user not in inside for user in node.users):
            return f"interior node {node.name} is used outside the match"
    vals = [n.meta.get("val") for n in (output, *_tensors(match))]
    if not all(isinstance(v, torch.Tensor) for v in vals):
        return "missing meta['val']"
    dtypes = {v.dtype for v in vals}
    if len(dtypes) != 1 or not dtypes <= set(_DTYPES):
        return f"dtypes {sorted(map(str, dtypes))}: kernels take one of float32/bfloat16/float16"
    if not all(isinstance(s, int) for v in vals for s in v.shape):
        return "dynamic shape"
    return None


def _rewrite(graph: fx.Graph, output: fx.Node, match: _Match) -> None:
    # The call computes exactly what ``output`` computed, so it takes over its fake value;
    # running the op's fake impl instead costs ~1 ms per node (the matchers are tested for
    # numerics, which would catch a type change).
    val = output.meta["val"]
    new = call_before(output, match.op, match.args)
    new.meta["val"] = val
    for key in ("stack_trace", "nn_module_stack"):
        if key in output.meta:
            new.meta[key] = output.meta[key]
    output.replace_all_uses_with(new)
    graph.erase_node(output)
    pending = set(match.interior)
    while pending:  # users before producers; every interior node is now dead
        dead = [n for n in pending if not n.users]
        if not dead:  # pragma: no cover - _why_not guarantees the interior dies with output
            break
        for n in dead:
            graph.erase_node(n)
        pending.difference_update(dead)


def rewrite_neuron_calls(gm: fx.GraphModule) -> bool:
    """Rewrite the forms listed in the module docstring into ``torch.ops.neuron_compile`` ops."""
    graph = gm.graph
    erased: set[fx.Node] = set()
    done: Counter[str] = Counter()
    patterns_at = _patterns_for(graph)
    for node in reversed(nodes_calling(graph, without_effects(patterns_at))):
        if node in erased or "val" not in node.meta:
            continue
        site = _Site(node)
        for pattern in patterns_at[node.target]:
            match = pattern(site)
            if match is None:
                continue
            why = _why_not(node, match)
            if why is not None:
                log.debug("rewrite_neuron_calls: %s not rewritten: %s", node.name, why)
            else:
                _rewrite(graph, node, match)
                erased.update(match.interior)
                done[str(match.op.name())] += 1
            break
    log.debug("rewrite_neuron_calls: rewrote %s", dict(done) or "nothing")
    return bool(done)
