"""ATen ops the cpu target has AOTAutograd keep whole (``Target.kept_ops``) where core ATen
decomposes them. Each has a reference rule written out op for op as PyTorch's decomposition
computes, not ``lower_decomposed``'s decomposition traced at lowering time: that traces once per
distinct shape and would give back part of the gain (lowering ResNet-18 +55 ms, MobileNetV2
+120 ms).

``native_batch_norm_backward``: decomposed, every BatchNorm of a backward is ~30 ops that
AOTAutograd traces one at a time through fake tensors and functionalization, and that lowering
then visits one at a time. Whole, ResNet-18's and MobileNetV2's cold first calls trace ~0.17 s
faster (20 and 35 BatchNorms; docs/benchmarks.md).

``native_layer_norm_backward``: ~15 ops per LayerNorm; ConvNeXt's first call traces ~0.05 s
faster.

trn targets keep decomposing both, so what neuronx-cc receives does not change.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten

KEPT_OPS = (aten.native_batch_norm_backward.default, aten.native_layer_norm_backward.default)
