"""What AOTAutograd traces with: the decomposition table."""

from __future__ import annotations

import operator
from functools import lru_cache
from typing import Any

import torch

from .targets import get_target

aten = torch.ops.aten


@lru_cache(maxsize=4)
def decomposition_table(target: str = "cpu") -> dict[Any, Any]:
    """PyTorch's core ATen decompositions.

    Backward ops that core ATen keeps whole (``convolution_backward``,
    ``max_pool2d_with_indices_backward``) have their own lowering rules instead: their StableHLO
    forms (transposed convolution, ``select_and_scatter``) are what neuronx-cc pattern-matches.

    Added on top: ``batch_norm_backward`` (the backward of the newer ``_batch_norm_with_update``
    family), which core ATen leaves whole although PyTorch ships its decomposition into the
    elementwise ops and reductions everything else lowers through; and the fused inference ops
    of ``torch.nn``'s fast path and the long tail of ops better decomposed than lowered (the
    ``decompositions`` package). The backward ops taking a grad and an
    input promote their operands as eager does (``decompositions/promoting.py``): PyTorch's
    decompositions of them compute in the dtypes that arrive.

    The ops the target keeps whole (``Target.kept_ops``) stay whole.
    """
    from torch._decomp import core_aten_decompositions, get_decompositions

    from .decompositions import added_decompositions, promoting_decompositions

    table = dict(core_aten_decompositions())
    table.update(get_decompositions([aten.batch_norm_backward.default]))
    table.update(added_decompositions())
    table.update(promoting_decompositions(table))
    # Lowered whole (lowering/stablehlo/attention.py): PyTorch's decomposition of the CPU flash
    # op returns the attention weights where the op returns the log-sum-exp its backward reads.
    table.pop(aten._scaled_dot_product_flash_attention_for_cpu.default, None)
    # Lowered whole (lowering/stablehlo/reduction.py): PyTorch decomposes them into a float32
    # sqrt(var), where eager takes the root of a double variance, finite beyond float32's range.
    table.pop(aten.std.correction, None)
    table.pop(aten.std_mean.correction, None)
    for op in get_target(target).kept_ops():
        table.pop(op, None)
    return table


def saving_random_ops(partition_fn: Any) -> Any:
    """Wrap an AOTAutograd ``partition_fn`` so that random ops inside activation-checkpointed
    regions are saved for the backward instead of recomputed in it.

    To recompute a dropout, AOTAutograd wraps it in the ``run_and_save_rng_state`` /
    ``run_with_rng_state`` higher-order ops, which replay torch's CPU generator state (a
    data-dependent-size tensor): they cannot be compiled, so every checkpointed dropout would
    split both graphs into CPU fallback regions. Saving the op's results (for dropout: its output
    and boolean mask) keeps the graphs whole, at the memory cost of those tensors; everything else
    in the region is still recomputed. Ops a selective-checkpoint policy marks
    ``MUST_RECOMPUTE`` are the user's explicit choice and stay recomputed (and fall back).
    """
    from torch.utils.checkpoint import CheckpointPolicy

    def partition(joint: Any, joint_inputs: Any, **kw: Any) -> Any:
        for node in joint.graph.nodes:
            if node.meta.get("recompute") == CheckpointPolicy.PREFER_RECOMPUTE and (
                torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ())
            ):
                # A tuple-valued op (native_dropout) is saved through its getitems: left
                # recomputable, they would re-run the op in the backward with fresh bits.
                parts = [u for u in node.users if u.target is operator.getitem]
                for saved in (node, *parts):
                    saved.meta["recompute"] = CheckpointPolicy.MUST_SAVE
        return partition_fn(joint, joint_inputs, **kw)

    return partition


def dropping_ignored_inputs(partition_fn: Any) -> Any:
    """Wrap an AOTAutograd ``partition_fn`` so that a training-mode ``native_batch_norm_backward``
    (kept whole by the cpu target) no longer takes the running statistics it ignores (it reads
    the batch statistics its forward saved). Left in, the partitioner saved them for the
    backward: two more inputs per BatchNorm (ResNet-18: 40 of 172) imported on every call."""

    def partition(joint: Any, joint_inputs: Any, **kw: Any) -> Any:
        for node in joint.graph.find_nodes(
            op="call_function", target=aten.native_batch_norm_backward.default
        ):
            if len(node.args) > 7 and node.args[7] is True:  # train
                node.args = (*node.args[:3], None, None, *node.args[5:])
        return partition_fn(joint, joint_inputs, **kw)

    return partition
