"""Trainium (trn2, trn3): everything neuron-compile knows about AWS's NeuronCores.

The core finds the targets through the ``neuron_compile.targets`` entry points
(``trainium/target.py``) and imports this package only when a trn target is chosen; the device
probe (``probe.py``) needs only the standard library. Loading ``target.py`` registers the trn
lowering forms (``lowering.py``) and pattern passes (``passes.py``). See docs/trainium.md.
"""

#: The lowering-registry key of the Trainium kernel forms (``TrainiumTarget.lowering_keys``).
TRN_KEY = "trn"
