"""Choose bucket boundaries from observed lengths: exact dynamic programming.

Every sequence of length ``l`` is padded to the smallest bucket ``B >= l`` and costs
``a*B + b*B**2`` (``cost="linear"``: ``a=1, b=0``, i.e. padded tokens; ``cost="attention"`` adds
the quadratic attention term). Given a budget of at most ``K`` buckets and/or a per-bucket
compile cost ``λ``, ``plan_buckets`` minimizes ``Σ count·cost(bucket) + λ·buckets`` exactly.

Why it is exact: shrinking a boundary down to the longest length it holds (or, under an
alignment constraint, to the smallest aligned value holding it) never increases any cost, so some
optimum uses only the *candidates* ``ceil(l / align) * align`` of the observed lengths. Over the
``m`` sorted candidates with prefix counts ``C``, the best cost of covering candidates ``1..j``
with exactly ``k`` buckets, the last ending at candidate ``j``, is

    f[k][j] = min over i < j of  f[k-1][i] + cost(cand_j) * (C[j] - C[i]),

an ``O(K·m²)`` recurrence (vectorized over ``i``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .shapes import bucket_for

#: ``cost="attention"``: a transformer layer costs about ``24·d²·L + 4·d·L²`` FLOPs per sequence
#: of length ``L``; divided by ``24·d²`` that is ``L + L²/(6·d)``, here for ``d = 768``.
ATTENTION_D_MODEL = 768


def cost_coefficients(cost: str | tuple[float, float]) -> tuple[float, float]:
    """``(a, b)`` of the per-sequence cost ``a*L + b*L**2`` for ``"linear"``, ``"attention"``, or
    an explicit pair."""
    if cost == "linear":
        return (1.0, 0.0)
    if cost == "attention":
        return (1.0, 1.0 / (6 * ATTENTION_D_MODEL))
    if isinstance(cost, tuple) and len(cost) == 2:
        a, b = float(cost[0]), float(cost[1])
        if a < 0 or b < 0 or a + b == 0:
            raise ValueError(f"cost coefficients must be non-negative and not both 0: {cost}")
        return (a, b)
    raise ValueError(f"cost must be 'linear', 'attention' or (a, b), got {cost!r}")


def length_histogram(
    source: Iterable[Any] | Mapping[int, int], length_fn: Callable[[Any], int] | None = None
) -> Counter[int]:
    """Histogram ``{length: count}`` from lengths, a ``Counter``/mapping, or a dataset scan.

    ``source`` may be a list of ints, a mapping length -> count, a dataset (anything iterable,
    e.g. a ``torch.utils.data.Dataset`` or a list of samples) or a ``DataLoader`` (its
    ``dataset`` is scanned, item by item). Items are measured with ``length_fn`` (default:
    the int itself, ``len(item)``, ``len(item[0])`` for tuples, or for a dict the length of its
    first field that has one, the sequence ``bucketed_collate`` pads).
    """
    if isinstance(source, Mapping):
        hist = Counter({int(k): int(v) for k, v in source.items() if v})
    else:
        dataset = getattr(source, "dataset", None)
        if dataset is not None and hasattr(source, "batch_size"):  # a DataLoader
            source = (dataset[i] for i in range(len(dataset)))

        def measure(item: Any) -> int:
            if length_fn is not None:
                return int(length_fn(item))
            if isinstance(item, (int, np.integer)):
                return int(item)
            if isinstance(item, (tuple, list)) and item and hasattr(item[0], "__len__"):
                return len(item[0])
            if isinstance(item, Mapping):  # a dict sample: its first sequence, as collate pads
                for value in item.values():
                    if getattr(value, "ndim", 1) >= 1 and hasattr(value, "__len__"):
                        return len(value)
                raise ValueError(f"no field of the sample has a length: {list(item)}")
            return len(item)

        hist = Counter(measure(item) for item in source)
    if not hist:
        raise ValueError("no lengths observed")
    if min(hist) <= 0 or min(hist.values()) < 0:
        raise ValueError("lengths must be positive and counts non-negative")
    return hist


@dataclass(frozen=True)
class Bucket:
    """One bucket of a plan: its boundary and what it holds."""

    size: int  # the padded length (boundary)
    count: int  # sequences assigned to it
    max_len: int  # longest observed length in it (0 when empty)
    real_tokens: int
    padded_tokens: int  # count * size

    @property
    def waste(self) -> float:
        """Fraction of this bucket's padded tokens that is padding."""
        return 1 - self.real_tokens / self.padded_tokens if self.padded_tokens else 0.0


@dataclass(frozen=True)
class BucketPlan:
    """Bucket boundaries with per-bucket counts, padded tokens and waste, and the total cost."""

    buckets: tuple[Bucket, ...]
    cost: float  # Σ count · (a·size + b·size²)
    coefficients: tuple[float, float]
    align: int = 1
    name: str = "planner"
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def boundaries(self) -> list[int]:
        """Bucket sizes, ascending."""
        return [b.size for b in self.buckets]

    @property
    def used(self) -> int:
        """Buckets that hold at least one sequence (= static compiles)."""
        return sum(1 for b in self.buckets if b.count)

    @property
    def real_tokens(self) -> int:
        """Tokens before padding."""
        return sum(b.real_tokens for b in self.buckets)

    @property
    def padded_tokens(self) -> int:
        """Tokens after padding every sequence to its bucket."""
        return sum(b.padded_tokens for b in self.buckets)

    @property
    def waste(self) -> float:
        """Overall fraction of padded tokens that is padding."""
        return 1 - self.real_tokens / self.padded_tokens if self.padded_tokens else 0.0

    @property
    def real_cost(self) -> float:
        """The cost without padding: ``Σ count · (a·l + b·l²)`` over observed lengths."""
        return float(self.meta.get("real_cost", 0.0))

    @property
    def cost_waste(self) -> float:
        """Fraction of the cost spent on padding (equals ``waste`` for linear cost)."""
        return 1 - self.real_cost / self.cost if self.cost else 0.0

    def bucket_for(self, length: int) -> int:
        """The boundary a sequence of ``length`` is padded to."""
        size = bucket_for(length, self.boundaries)
        if size is None:
            raise ValueError(f"length {length} exceeds the largest bucket {self.boundaries[-1]}")
        return size

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "name": self.name,
            "boundaries": self.boundaries,
            "buckets": [
                {
                    "size": b.size,
                    "count": b.count,
                    "max_len": b.max_len,
                    "padded_tokens": b.padded_tokens,
                    "real_tokens": b.real_tokens,
                    "waste": b.waste,
                }
                for b in self.buckets
            ],
            "padded_tokens": self.padded_tokens,
            "real_tokens": self.real_tokens,
            "waste": self.waste,
            "cost": self.cost,
            "cost_waste": self.cost_waste,
            "align": self.align,
        }


def _seq_cost(a: float, b: float, size: int | np.ndarray) -> Any:
    return a * size + b * size * size


def evaluate_buckets(
    lengths: Iterable[Any] | Mapping[int, int],
    boundaries: Sequence[int],
    cost: str | tuple[float, float] = "linear",
    *,
    name: str = "buckets",
    align: int = 1,
) -> BucketPlan:
    """The plan that pads each length to the smallest of ``boundaries`` that holds it."""
    hist = length_histogram(lengths)
    a, b = cost_coefficients(cost)
    bounds = sorted(set(int(x) for x in boundaries))
    if not bounds or max(hist) > bounds[-1]:
        raise ValueError(f"longest length {max(hist)} exceeds the largest bucket {bounds}")
    rows: dict[int, list[int]] = {s: [0, 0, 0] for s in bounds}  # count, max_len, real
    for length, count in hist.items():
        s = bucket_for(length, bounds)
        r = rows[s]
        r[0] += count
        r[1] = max(r[1], length) if count else r[1]
        r[2] += count * length
    buckets = tuple(Bucket(s, r[0], r[1], r[2], r[0] * s) for s, r in rows.items())
    total = sum(bk.count * _seq_cost(a, b, bk.size) for bk in buckets)
    real = sum(c * _seq_cost(a, b, n) for n, c in hist.items())
    return BucketPlan(buckets, float(total), (a, b), align, name, {"real_cost": float(real)})


def plan_buckets(
    lengths: Iterable[Any] | Mapping[int, int],
    max_buckets: int | None = None,
    *,
    compile_cost: float = 0.0,
    align: int = 1,
    cost: str | tuple[float, float] = "linear",
    length_fn: Callable[[Any], int] | None = None,
) -> BucketPlan:
    """Optimal boundaries: minimize ``Σ count·cost(bucket) + compile_cost·buckets``.

    ``max_buckets`` caps the number of buckets (``None``: no cap; then set ``compile_cost`` or
    every distinct length becomes a bucket). Boundaries are multiples of ``align`` (the last is
    the aligned ceiling of the longest length). Ties prefer fewer buckets.
    """
    hist = length_histogram(lengths, length_fn)
    if align < 1:
        raise ValueError(f"align must be >= 1, got {align}")
    if max_buckets is not None and max_buckets < 1:
        raise ValueError(f"max_buckets must be >= 1, got {max_buckets}")
    a, b = cost_coefficients(cost)
    groups: Counter[int] = Counter()
    for length, count in hist.items():
        groups[-(-length // align) * align] += count
    cand = np.array(sorted(groups), dtype=np.float64)
    counts = np.array([groups[int(c)] for c in cand], dtype=np.float64)
    m = len(cand)
    k_max = m if max_buckets is None else min(max_buckets, m)
    prefix = np.concatenate([[0.0], np.cumsum(counts)])
    unit = _seq_cost(a, b, cand)  # cost of one sequence in a bucket ending at candidate j
    inf = math.inf
    # f[k][j]: best cost covering candidates 0..j-1 with exactly k buckets (last ends at j-1).
    f = np.full((k_max + 1, m + 1), inf)
    f[0][0] = 0.0
    arg = np.zeros((k_max + 1, m + 1), dtype=np.int64)
    for k in range(1, k_max + 1):
        prev = f[k - 1]
        for j in range(k, m + 1):
            # bucket = candidates i..j-1, ending at cand[j-1]
            options = prev[:j] + unit[j - 1] * (prefix[j] - prefix[:j])
            i = int(np.argmin(options))
            f[k][j], arg[k][j] = options[i], i
    totals = [f[k][m] + compile_cost * k for k in range(1, k_max + 1)]
    best_k = 1 + int(np.argmin(totals))  # argmin returns the first minimum: fewest buckets
    bounds, j = [], m
    for k in range(best_k, 0, -1):
        bounds.append(int(cand[j - 1]))
        j = int(arg[k][j])
    plan = evaluate_buckets(hist, sorted(bounds), (a, b), name="planner", align=align)
    plan.meta.update(dp_cost=float(f[best_k][m]), candidates=m, compile_cost=compile_cost)
    return plan


def power_of_two_buckets(max_len: int, k: int, align: int = 1) -> list[int]:
    """The ``k`` largest powers of two up to the first one ``>= max_len`` (those ``>= align``)."""
    top = 1
    while top < max(max_len, align):
        top <<= 1
    out = [top >> i for i in range(k) if (top >> i) >= max(align, 1)]
    return sorted(out)


def fixed_step_buckets(max_len: int, k: int, step: int = 128) -> list[int]:
    """At most ``k`` evenly spaced multiples of ``step`` covering ``max_len``.

    Every multiple of ``step`` when that needs at most ``k`` buckets, else every ``s``-th one with
    the smallest ``s`` that fits in ``k``.
    """
    n = -(-max_len // step)
    stride = -(-n // k)
    return [stride * step * i for i in range(1, -(-n // stride) + 1)]


def compare_plans(
    lengths: Iterable[Any] | Mapping[int, int],
    k: int,
    *,
    align: int = 1,
    step: int | None = None,
    cost: str | tuple[float, float] = "linear",
) -> dict[str, BucketPlan]:
    """The planner's optimum vs powers of two and fixed-step buckets, all with at most ``k``."""
    hist = length_histogram(lengths)
    longest = max(hist)
    step = step or (align if align > 1 else 128)
    return {
        "planner": plan_buckets(hist, k, align=align, cost=cost),
        "powers of two": evaluate_buckets(
            hist, power_of_two_buckets(longest, k, align), cost, name="powers of two", align=align
        ),
        f"multiples of {step}": evaluate_buckets(
            hist,
            fixed_step_buckets(longest, k, step),
            cost,
            name=f"multiples of {step}",
            align=step,
        ),
    }


# ---- cost coefficients from the cost model ----------------------------------------------------


def _fit_nonnegative(sizes: np.ndarray, seconds: np.ndarray) -> tuple[float, float]:
    """Least-squares ``seconds ≈ a·L + b·L² + c`` with ``a, b, c >= 0``; returns ``(a, b)``.

    The intercept ``c`` (weights read once per call, fixed-size work) is fitted so it does not
    leak into ``a``, then dropped: a per-sequence constant adds the same amount to every plan
    and never changes which boundaries are best. Three unknowns, so the exact non-negative
    optimum is found by trying every subset of active columns (no SciPy needed).
    """
    cols = np.stack([sizes, sizes**2, np.ones_like(sizes)], axis=1)
    scale = np.abs(cols).max(axis=0)  # L² dwarfs L: scale columns for a well-conditioned solve
    best: tuple[float, np.ndarray] | None = None
    for mask in range(1, 8):
        idx = [i for i in range(3) if mask >> i & 1]
        sol, *_ = np.linalg.lstsq(cols[:, idx] / scale[idx], seconds, rcond=None)
        if np.any(sol < 0):
            continue
        coef = np.zeros(3)
        coef[idx] = sol / scale[idx]
        residual = float(np.sum((cols @ coef - seconds) ** 2))
        if best is None or residual < best[0] * (1 - 1e-12):
            best = (residual, coef)
    assert best is not None  # the intercept alone is feasible for non-negative data
    return float(best[1][0]), float(best[1][1])


def cost_from_model(
    build_graph_text: Callable[[int], str],
    sizes: Sequence[int],
    target: str = "trn2",
    lnc: int = 1,
) -> tuple[float, float]:
    """``(a, b)`` for ``plan_buckets(cost=...)`` fitted to the roofline cost model.

    ``build_graph_text(L)`` returns the StableHLO text of one call at sequence length ``L``;
    each is estimated with ``cost_model.estimate_module`` on ``target`` and ``a·L + b·L²`` is
    fitted by non-negative least squares (a constant term is fitted and dropped, see
    ``_fit_nonnegative``). Use three or more ``sizes`` spanning the lengths to be bucketed.
    Units: estimated device seconds per call.
    """
    from .trainium.cost_model import estimate_module

    if len(set(sizes)) < 2 or any(s <= 0 for s in sizes):
        raise ValueError(f"need at least two distinct positive sizes, got {list(sizes)}")
    lengths = np.array(sorted(set(sizes)), dtype=np.float64)
    seconds = np.array(
        [estimate_module(build_graph_text(int(n)), target, lnc).seconds for n in lengths]
    )
    a, b = _fit_nonnegative(lengths, seconds)
    if a + b == 0:  # flat in L (everything fixed-size): any plan is as good; say "padded tokens"
        a = float(seconds.max() / lengths.max())
    return a, b


def inference_graph_text(
    module: Any,
    inputs: Sequence[Any],
    target: str = "trn2",
    lnc: int | None = None,
    flash_attention: bool = True,
) -> str:
    """StableHLO text of ``module(*inputs)``'s inference graph, as the backend would lower it
    for ``target`` and ``lnc`` (its decompositions, its SDPA routing to the flash-attention op
    unless ``flash_attention`` is off, its passes), without executing the module: shapes come
    from fake tensors."""
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    from .capture import decomposition_table
    from .config import NeuronConfig
    from .lowering import lower_graph
    from .passes import pipeline_for, run_pipeline
    from .targets import get_target

    # Parameters and buffers become graph inputs (as under torch.compile), so fake tracing
    # never touches real weights and the estimate counts reading them.
    state = {**dict(module.named_parameters()), **dict(module.named_buffers())}

    def call(params: dict[str, Any], *args: Any) -> Any:
        return torch.func.functional_call(module, params, args)

    chosen = get_target(target)
    lnc = chosen.resolve_lnc(lnc)  # None: as NeuronConfig resolves it
    routing = chosen.frame_routing(NeuronConfig(target=target, flash_attention=flash_attention))
    with torch.no_grad(), routing:  # the backend's SDPA path
        gm = make_fx(call, decomposition_table=decomposition_table(target), tracing_mode="fake")(
            state, *inputs
        )
    run_pipeline(gm, pipeline_for(target))
    return lower_graph(gm, target=chosen, lnc=lnc).text


def cost_from_module(
    module: Any,
    make_input: Callable[[int], Any],
    sizes: Sequence[int] = (64, 128, 256, 512),
    target: str = "trn2",
    lnc: int = 1,
) -> tuple[float, float]:
    """``cost_from_model`` for a torch module: ``make_input(L)`` returns the input (or a tuple
    of inputs) at sequence length ``L``; each size's inference graph is traced and lowered
    (``inference_graph_text``), never run."""

    def text(n: int) -> str:
        inputs = make_input(n)
        return inference_graph_text(
            module, inputs if isinstance(inputs, tuple) else (inputs,), target, lnc
        )

    return cost_from_model(text, sizes, target, lnc)
