"""StableHLO lowering rules, one module per op family. Importing registers them."""

from . import (  # noqa: F401
    activations,
    batch_norm,
    conv,
    distance,
    elementwise,
    indexing,
    linalg,
    matmul,
    normalization,
    pooling,
    random,
    reduction,
    scan,
    shape,
    sort,
    special,
    transcendental,
)
