"""The ``cpu`` target's own lowering forms: what XLA's CPU client runs much faster than the
reference rule, with the same result. The target itself is ``targets.CPU`` (a ``CpuTarget``);
``targets.get_target("cpu")`` imports the modules, which register the forms under
``CPU_KEY``, as loading a plugin target registers its own. No other target ever sees them, so
what neuronx-cc receives does not change. See docs/architecture.md#targets.
"""

#: The lowering-registry key of the cpu target's forms (``targets.CPU.lowering_keys``).
CPU_KEY = "cpu"
