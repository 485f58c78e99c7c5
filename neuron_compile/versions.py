"""Versions of this package and of the toolchain it compiles with: one place for the cache key,
debug dumps, failure bundles, reports and ``neuron-compile info``."""

from __future__ import annotations

import functools
from importlib import metadata

__version__ = "0.1.0"  # pyproject.toml's version; ``neuron_compile.__version__``


def dist_version(name: str) -> str:
    """Installed version of a distribution, ``absent`` without it. The PyPI placeholders of
    neuronx-cc / nki (``WRONG PACKAGE``) carry version 0.0.x; they stay distinguishable."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"


@functools.lru_cache(maxsize=1)
def toolchain_versions() -> dict[str, str]:
    """torch, jax, jaxlib, StableHLO, neuronx-cc and nki versions: the toolchain components of
    every cache key (``cache.key.environment_components``)."""
    import jaxlib
    import torch

    from .artifact import stablehlo_version

    return {
        "torch": torch.__version__,
        "jax": dist_version("jax"),  # not ``import jax``: ~0.5 s we never otherwise pay
        "jaxlib": jaxlib.__version__,
        "stablehlo": stablehlo_version(),
        "neuronx-cc": dist_version("neuronx-cc"),
        "nki": dist_version("nki"),
    }


def versions() -> dict[str, str]:
    """``neuron_compile``'s version and ``toolchain_versions()``: what dumps, failure bundles,
    reports and ``neuron-compile info`` record."""
    return {"neuron_compile": __version__, **toolchain_versions()}
