"""Neuron runtime executor: load a NEFF and run it on a NeuronCore (Trainium only).

Used by ``compiler._compile_region`` only when ``available()``: a Neuron device (``/dev/neuron0``)
*and* the runtime library ``libnrt`` (AWS Neuron SDK) are present; everywhere else the XLA CPU
executor runs the same graph. Bindings are plain ``ctypes`` over the documented C API of
``nrt.h`` / ``nrt_experimental.h`` (Neuron runtime 2.x): ``nrt_init``, ``nrt_load``,
``nrt_get_model_tensor_info``, ``nrt_tensor_allocate``, ``nrt_tensor_write``/``read``,
``nrt_add_tensor_to_tensor_set``, ``nrt_execute``. No Neuron Python package is needed.

Device residency: parameters (the same tensors every call, updated in place by optimizers) keep
a device copy per input slot, re-uploaded only when the tensor's version counter or storage
changes, so weights stay on the device between steps and between graphs of one model; outputs are
read back to host tensors (torch has no Neuron device type without torch-neuronx).

NOTE: written against the documented API; it has not run on a device from this repository's CI
(tests/trainium/test_hardware.py carries ``@pytest.mark.neuron`` and runs on a Trainium host).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import threading
from typing import Any

import torch

from .probe import has_device, runtime_library

log = logging.getLogger(__name__)

NRT_SUCCESS = 0
_PLACEMENT_DEVICE = 0
_FRAMEWORK_NO_FW = 1
_USAGE_INPUT, _USAGE_OUTPUT = 0, 1
_NAME_MAX = 256  # NRT_TENSOR_NAME_MAX (nrt.h)


class _TensorInfo(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char * _NAME_MAX),
        ("usage", ctypes.c_int),
        ("size", ctypes.c_size_t),
        ("dtype", ctypes.c_int),
        ("shape", ctypes.POINTER(ctypes.c_uint32)),
        ("ndim", ctypes.c_uint32),
    ]


def available() -> bool:
    """A Neuron device and the runtime library are present (cheap; no runtime init)."""
    if os.environ.get("NEURON_COMPILE_DISABLE_DEVICE", "").strip() in ("1", "true"):
        return False
    return has_device() and runtime_library() is not None


_init_lock = threading.Lock()


@functools.lru_cache(maxsize=1)
def _lib() -> ctypes.CDLL:
    path = runtime_library()
    if path is None:
        raise OSError("libnrt not found")
    lib = ctypes.CDLL(path)
    with _init_lock:
        status = lib.nrt_init(_FRAMEWORK_NO_FW, b"", b"")
    _check(status, "nrt_init")
    return lib


def _check(status: int, what: str) -> None:
    if status != NRT_SUCCESS:
        from ..errors import NeuronRuntimeError

        raise NeuronRuntimeError(
            f"Neuron runtime call {what} failed with NRT_STATUS {status}",
            hint="check `neuron-ls`, NEURON_RT_VISIBLE_CORES and that the NEFF's --lnc equals "
            "NEURON_LOGICAL_NC_CONFIG",
        )


def runtime_version() -> str:
    """Version string of the Neuron runtime, or ``absent``."""
    if not available():
        return "absent"
    from ..versions import dist_version

    version = dist_version("neuronx-runtime-lib")
    return "present" if version == "absent" else version


class NeuronExecutable:
    """A NEFF loaded on one (logical) NeuronCore; same calling convention as
    ``XlaCpuExecutable``: ``exe(inputs, param_slots) -> list[torch.Tensor]``."""

    def __init__(self, neff: bytes, lowered: Any, *, lnc: int = 1, start_nc: int = 0) -> None:
        lib = _lib()
        self._lib = lib
        self._model = ctypes.c_void_p()
        buf = ctypes.create_string_buffer(neff, len(neff))
        _check(lib.nrt_load(buf, len(neff), start_nc, 1, ctypes.byref(self._model)), "nrt_load")
        info_p = ctypes.c_void_p()
        _check(lib.nrt_get_model_tensor_info(self._model, ctypes.byref(info_p)), "tensor_info")
        count = ctypes.c_uint64.from_address(info_p.value).value
        infos = (_TensorInfo * count).from_address(info_p.value + ctypes.sizeof(ctypes.c_uint64))
        self._inputs = [(i.name, i.size) for i in infos if i.usage == _USAGE_INPUT]
        self._outputs = [(i.name, i.size) for i in infos if i.usage == _USAGE_OUTPUT]
        # NOTE: the NEFF orders tensors by name ("input0", ...); @main's order is ours.
        self._inputs.sort(key=lambda t: _index(t[0]))
        self._outputs.sort(key=lambda t: _index(t[0]))
        result_specs = sorted(
            (o for o in lowered.outputs if o.kind == "result"), key=lambda o: o.index
        )
        self._out_dtypes = [_result_dtype(o.dtype) for o in result_specs]
        self._out_shapes = _result_shapes(lowered)
        self._in_tensors = [self._allocate(n, s) for n, s in self._inputs]
        self._out_tensors = [self._allocate(n, s) for n, s in self._outputs]
        self._in_set = self._tensor_set(self._inputs, self._in_tensors)
        self._out_set = self._tensor_set(self._outputs, self._out_tensors)
        self._uploaded: list[tuple[int, int, int] | None] = [None] * len(self._inputs)

    def _allocate(self, name: bytes, size: int) -> ctypes.c_void_p:
        t = ctypes.c_void_p()
        _check(
            self._lib.nrt_tensor_allocate(_PLACEMENT_DEVICE, 0, size, name, ctypes.byref(t)),
            "nrt_tensor_allocate",
        )
        return t

    def _tensor_set(self, specs: list, tensors: list) -> ctypes.c_void_p:
        s = ctypes.c_void_p()
        _check(self._lib.nrt_allocate_tensor_set(ctypes.byref(s)), "nrt_allocate_tensor_set")
        for (name, _), t in zip(specs, tensors, strict=True):
            _check(self._lib.nrt_add_tensor_to_tensor_set(s, name, t), "add_tensor_to_set")
        return s

    def __call__(
        self,
        inputs: list[torch.Tensor],
        param_slots: list[Any] | None = None,
        export: Any = None,
        register: bool = True,
    ) -> list[torch.Tensor]:
        """Run on host tensors; results come back as host tensors (``export``/``register``, the
        XLA executor's hints for saved activations, are accepted and ignored)."""
        for i, t in enumerate(inputs):
            stamp = (t.untyped_storage().data_ptr(), t._version, id(t))
            if self._uploaded[i] == stamp:  # unchanged parameter: already on the device
                continue
            data = t.contiguous()
            _check(
                self._lib.nrt_tensor_write(
                    self._in_tensors[i], ctypes.c_void_p(data.data_ptr()), 0, self._inputs[i][1]
                ),
                "nrt_tensor_write",
            )
            self._uploaded[i] = stamp if t.requires_grad or t.is_leaf else None
        _check(self._lib.nrt_execute(self._model, self._in_set, self._out_set), "nrt_execute")
        outs = []
        for (_, size), t, dtype, shape in zip(
            self._outputs, self._out_tensors, self._out_dtypes, self._out_shapes, strict=True
        ):
            host = torch.empty(shape, dtype=dtype)
            _check(
                self._lib.nrt_tensor_read(t, ctypes.c_void_p(host.data_ptr()), 0, size),
                "nrt_tensor_read",
            )
            outs.append(host)
        return outs


def _index(name: bytes) -> int:
    digits = "".join(c for c in name.decode(errors="replace") if c.isdigit())
    return int(digits) if digits else 0


def _result_dtype(dtype: torch.dtype | None) -> torch.dtype:
    from ..lowering.context import canonical_dtype

    return canonical_dtype(dtype or torch.float32)


def _result_shapes(lowered: Any) -> list[tuple[int, ...]]:
    """Result shapes of @main, parsed from its signature in the StableHLO text."""
    import re

    sig = re.search(r"func\.func (?:public )?@main\(.*?\)\s*->\s*\(?(.*?)\)?\s*\{", lowered.text)
    shapes = []
    for m in re.finditer(r"tensor<([^>]*)>", sig.group(1) if sig else ""):
        dims = m.group(1).split("x")[:-1]
        shapes.append(tuple(int(d) for d in dims))
    return shapes
