"""Entry-point registration and the ``neuron`` name clash with AWS torch-neuronx.

``torch.compile(backend="neuron")`` resolves through the ``torch_dynamo_backends`` entry point.
AWS's torch-neuronx registers the same name and torch silently picks one of them, so we warn once
when another distribution claims it; ``backend="neuron_compile"`` always means this project.
"""

from __future__ import annotations

from importlib import metadata

from .warn_once import first_time, once_set, warn

BACKEND_NAMES = ("neuron", "neuron_compile")
OUR_TARGET = "neuron_compile.backend:neuron_backend"

_checked: set[str] = once_set()


def other_registrations(name: str = "neuron") -> list[str]:
    """``dist (module:attr)`` for every installed distribution other than ours that registers ``name``."""
    found = []
    for dist in metadata.distributions():
        for ep in dist.entry_points:
            if ep.group == "torch_dynamo_backends" and ep.name == name and ep.value != OUR_TARGET:
                found.append(f"{dist.metadata['Name']} ({ep.value})")
    return sorted(set(found))


def warn_if_name_clash() -> None:
    """Warn once per process if another distribution also registers ``neuron``."""
    if not first_time(_checked, "neuron"):
        return
    others = other_registrations("neuron")
    if others:
        warn(
            "neuron-compile: the Dynamo backend name 'neuron' is registered by neuron-compile and "
            f"by {', '.join(others)}; torch picks one of them silently. Use "
            "backend='neuron_compile' to always select neuron-compile.",
        )
