"""The decompositions we add to PyTorch's core ATen table (``capture.decomposition_table``).

AOTAutograd traces with them, so an op decomposed here reaches the lowering as ops it already
covers, and its backward is derived from the decomposition (a lowering rule would need a rule for
the backward op too). One module per family:

- ``fast_path``: the fused inference ops of ``torch.nn``'s fast path;
- ``promoting``: backward ops over a grad and an input, promoting their operands as eager does;
- ``sampling``: grid sampling and anti-aliased upsampling;
- ``embedding``: ``embedding_bag``;
- ``segments``: ``segment_reduce``;
- ``indexing``: indexing ops whose PyTorch decomposition goes through Python indexing;
- ``dropout``: ``native_dropout`` of an empty tensor (eager's float mask);
- ``lerp``: ``lerp`` in float32, rounded once, as eager's kernel computes it;
- ``logit``: ``logit`` clamped to bounds in the input's dtype, as eager's kernel does;
- ``fma``: Inductor's ``prims.fma``, Dynamo's spelling of optimizers' ``addcmul_(value=)``
  (its table is made on demand: the prim exists only once Dynamo is loaded);
- ``foreach``: the ``_foreach_*`` list ops of ``foreach=True`` optimizers, per tensor (made on
  demand from the registered schemas);
- ``legacy``: the legacy convolution entry points and the other aliases of covered ops.

``functional`` is not a table: it rewrites Dynamo's calls of ``torch.nn.functional`` functions
whose ATen ops PyTorch decomposes ahead of any table or traces into a kernel
(``rewrite_functions``, called by the backend before AOTAutograd).

``counting`` is their shared helper for counts (a float32 scatter-add, legal on Trainium).

A family module exports ``DECOMPOSITIONS`` (op overload -> function); each function computes what
the eager kernel computes (the module docstrings say where the two could differ and why not).
"""

from __future__ import annotations

from typing import Any

from ..errors import RegistryError
from . import dropout, embedding, fma, foreach, indexing, legacy, lerp, logit, sampling, segments
from .fast_path import FAST_PATH_DECOMPOSITIONS
from .promoting import promoting_decompositions

__all__ = ["added_decompositions", "promoting_decompositions"]


def added_decompositions() -> dict[Any, Any]:
    """Every family's ``DECOMPOSITIONS``, merged (the families cover disjoint ops)."""
    table: dict[Any, Any] = dict(FAST_PATH_DECOMPOSITIONS)
    for family in (sampling, embedding, segments, indexing, dropout, lerp, logit, legacy):
        overlap = table.keys() & family.DECOMPOSITIONS.keys()
        if overlap:
            raise RegistryError(f"{family.__name__} decomposes ops decomposed already: {overlap}")
        table.update(family.DECOMPOSITIONS)
    for made_on_demand in (fma.decompositions(), foreach.decompositions()):
        table.update(made_on_demand)
    return table
