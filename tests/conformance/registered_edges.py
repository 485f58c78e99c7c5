"""Zero-size and rank-0 edges of the registered lowerings that no OpInfo entry reaches.

``edges.py`` generates edges from OpInfo samples; an op the OpInfo database does not exercise
(internal ATen entry points, ``prims``, quantization, asserts, random draws) gets hand-written
cases here. Every registered op is accounted for in one of three ways (``unaccounted`` lists the
ones that are not, and ``test_edges.py`` fails on them):

- its name matches an OpInfo entry (``opinfo_names``), so the generated sweep covers it;
- ``REACHED_BY``: an OpInfo entry reaches it under another name (``convolution`` through
  ``nn.functional.conv2d``), or it is our own plumbing no user graph carries;
- ``CASES``: hand-written edge cases, each compiled with ``backend="neuron"`` vs eager.

A case may fall back or match eager (random draws: shape and dtype); it may never raise one of
our bugs (NC102, NC103, an uncoded exception) or differ. ``python -m
tests.conformance.registered_edges`` prints every case's outcome.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import torch

from tests.conformance.compare import compare, leaves
from tests.conformance.outcomes import _clear_fallbacks, _fell_back_ops, classify_exception

aten, prims = torch.ops.aten, torch.ops.prims


class Case(NamedTuple):
    label: str
    fn: Callable[..., Any]
    inputs: Callable[[], list[Any]]
    random: bool = False  # compare shape and dtype only


def _f(*shape: int, dtype: torch.dtype = torch.float32) -> Callable[[], torch.Tensor]:
    return lambda: (
        torch.randn(shape).to(dtype) if dtype.is_floating_point else torch.ones(shape, dtype=dtype)
    )


def _ins(*makers: Callable[[], Any]) -> Callable[[], list[Any]]:
    return lambda: [m() for m in makers]


EMPTY, SCALAR = _f(0, 3), _f()
I_EMPTY, I_SCALAR = _f(0, 3, dtype=torch.int32), _f(dtype=torch.int32)

#: Registered ops an OpInfo entry reaches under another name, or our own plumbing.
#: The functional collectives: each needs real ranks, checked against eager bit for bit by
#: tests/distributed/test_collectives.py (every op, reduce op, group shape) and the settings tests.
_COLLECTIVES_TESTED = "tests/distributed/test_collectives.py (real gloo ranks)"

REACHED_BY: dict[str, str] = {
    **{
        f"{ns}.{op}.default": _COLLECTIVES_TESTED
        for ns, ops in (
            (
                "_c10d_functional",
                (
                    "all_reduce",
                    "all_reduce_coalesced",
                    "all_gather_into_tensor",
                    "all_gather_into_tensor_coalesced",
                    "reduce_scatter_tensor",
                    "reduce_scatter_tensor_coalesced",
                    "all_to_all_single",
                    "broadcast",
                    "wait_tensor",
                    "_wrap_tensor_autograd",
                ),
            ),
            (
                "_c10d_functional_autograd",
                ("all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single"),
            ),
        )
        for op in ops
    },
    "aten._batch_norm_with_update_functional.default": "nn.functional.batch_norm (training)",
    "aten._native_batch_norm_legit_functional.default": "nn.functional.batch_norm (training)",
    "aten._native_batch_norm_legit_no_training.default": "nn.functional.batch_norm (eval)",
    "aten._trilinear.default": "nn.functional.bilinear",
    "aten._scaled_dot_product_flash_attention_for_cpu.default": (
        "nn.functional.scaled_dot_product_attention (4-D inputs)"
    ),
    "aten._scaled_dot_product_flash_attention_for_cpu_backward.default": (
        "nn.functional.scaled_dot_product_attention (4-D inputs, backward)"
    ),
    "aten._unsafe_index_put.default": "index_put",
    "aten.index.Tensor": "index_put, take, __getitem__ samples",
    "aten.convolution.default": "nn.functional.conv1d/2d/3d, conv_transpose*",
    "aten.convolution_backward.default": "nn.functional.conv2d (backward)",
    "aten.max_pool2d_with_indices.default": "nn.functional.max_pool2d",
    "aten.max_pool3d_with_indices.default": "nn.functional.max_pool3d",
    "aten.max_pool3d_with_indices_backward.default": "nn.functional.max_pool3d (backward)",
    "aten.replication_pad1d_backward.default": "nn.functional.pad.replicate (backward)",
    "aten.replication_pad2d_backward.default": "nn.functional.pad.replicate (backward)",
    "aten.replication_pad3d_backward.default": "nn.functional.pad.replicate (backward)",
    "aten._linalg_check_errors.default": "linalg.cholesky, linalg.inv (error checks)",
    "aten._histogramdd_bin_edges.default": "histogramdd",
    "aten._histogramdd_from_bin_cts.default": "histogramdd",
    "aten._histogramdd_from_bin_tensors.default": "histogramdd",
    "torch_nn._linear_cross_entropy_batch_chunked.default": "nn.functional.linear_cross_entropy",
    "torch_nn._linear_cross_entropy_batch_chunked_no_reduction.default": (
        "nn.functional.linear_cross_entropy"
    ),
    "with_effects": "effect-token plumbing of effectful ops (print, _linalg_check_errors)",
    "prims._make_token.default": "effect-token plumbing",
    "prims._sink_tokens.default": "effect-token plumbing",
}


def _quantization_cases() -> dict[str, list[Case]]:
    """quantized_decomposed and fake_quantize ops: an empty and a 0-d input each."""
    import torch.ao.quantization.fx._decomposed  # noqa: F401 - registers quantized_decomposed

    qd = torch.ops.quantized_decomposed
    i8 = torch.int8
    scale, zp = lambda: torch.tensor(0.1), lambda: torch.tensor(3, dtype=torch.int32)
    per_ch = (
        lambda: torch.tensor([0.1, 0.2, 0.3]),
        lambda: torch.tensor([0, 1, -1], dtype=torch.int32),
    )
    q = {
        "quantize_per_tensor.default": lambda a: qd.quantize_per_tensor(a, 0.1, 3, -128, 127, i8),
        "quantize_per_tensor.tensor": lambda a, s, z: qd.quantize_per_tensor.tensor(
            a, s, z, -128, 127, i8
        ),
        "quantize_per_tensor.tensor2": lambda a, s, z: qd.quantize_per_tensor.tensor2(
            a, s, z, torch.tensor(-128), torch.tensor(127), i8
        ),
        "dequantize_per_tensor.default": lambda a: qd.dequantize_per_tensor(
            qd.quantize_per_tensor(a, 0.1, 3, -128, 127, i8), 0.1, 3, -128, 127, i8
        ),
        "dequantize_per_tensor.tensor": lambda a, s, z: qd.dequantize_per_tensor.tensor(
            qd.quantize_per_tensor(a, 0.1, 3, -128, 127, i8), s, z, -128, 127, i8
        ),
        "dequantize_per_tensor.tensor2": lambda a, s, z: qd.dequantize_per_tensor.tensor2(
            qd.quantize_per_tensor(a, 0.1, 3, -128, 127, i8),
            s,
            z,
            torch.tensor(-128),
            torch.tensor(127),
            i8,
        ),
    }
    cases: dict[str, list[Case]] = {}
    for name, fn in q.items():
        extra = (scale, zp) if "tensor" in name.split(".")[1] else ()
        cases[f"quantized_decomposed.{name}"] = [
            Case("empty", fn, _ins(EMPTY, *extra)),
            Case("scalar", fn, _ins(SCALAR, *extra)),
        ]
    cases["quantized_decomposed.quantize_per_channel.default"] = [
        Case(
            "empty",
            lambda a, s, z: qd.quantize_per_channel(a, s, z, 1, -128, 127, i8),
            _ins(EMPTY, *per_ch),
        ),
    ]
    cases["quantized_decomposed.dequantize_per_channel.default"] = [
        Case(
            "empty",
            lambda a, s, z: qd.dequantize_per_channel(
                qd.quantize_per_channel(a, s, z, 1, -128, 127, i8), s, z, 1, -128, 127, i8
            ),
            _ins(EMPTY, *per_ch),
        ),
    ]
    fq = {
        "aten.fake_quantize_per_tensor_affine.default": (
            lambda a: aten.fake_quantize_per_tensor_affine(a, 0.1, 3, -128, 127),
            (),
        ),
        "aten.fake_quantize_per_tensor_affine.tensor_qparams": (
            lambda a, s, z: aten.fake_quantize_per_tensor_affine.tensor_qparams(a, s, z, -128, 127),
            (scale, zp),
        ),
        "aten.fake_quantize_per_tensor_affine_cachemask.default": (
            lambda a: aten.fake_quantize_per_tensor_affine_cachemask(a, 0.1, 3, -128, 127),
            (),
        ),
        "aten._fake_quantize_per_tensor_affine_cachemask_tensor_qparams.default": (
            lambda a, s, z: aten._fake_quantize_per_tensor_affine_cachemask_tensor_qparams(
                a, s, z, torch.ones(1, dtype=torch.long), -128, 127
            ),
            (scale, zp),
        ),
        "aten.fake_quantize_per_tensor_affine_cachemask_backward.default": (
            lambda g: aten.fake_quantize_per_tensor_affine_cachemask_backward(g, g > 0),
            (),
        ),
    }
    for name, (fn, extra) in fq.items():
        cases[name] = [
            Case("empty", fn, _ins(EMPTY, *extra)),
            Case("scalar", fn, _ins(SCALAR, *extra)),
        ]
    for name in ("fake_quantize_per_channel_affine", "fake_quantize_per_channel_affine_cachemask"):
        cases[f"aten.{name}.default"] = [
            Case(
                "empty",
                lambda a, s, z, _n=name: getattr(aten, _n)(a, s, z, 1, -128, 127),
                _ins(EMPTY, *per_ch),
            ),
        ]
    return cases


#: Hand-written edge cases: op name -> cases.
CASES: dict[str, list[Case]] = {
    "aten.__lshift__.Tensor": [
        Case("empty", lambda a, b: aten.__lshift__.Tensor(a, b), _ins(I_EMPTY, I_EMPTY)),
        Case("scalar", lambda a, b: aten.__lshift__.Tensor(a, b), _ins(I_SCALAR, I_SCALAR)),
    ],
    "aten.__rshift__.Tensor": [
        Case("empty", lambda a, b: aten.__rshift__.Tensor(a, b), _ins(I_EMPTY, I_EMPTY)),
        Case("scalar", lambda a, b: aten.__rshift__.Tensor(a, b), _ins(I_SCALAR, I_SCALAR)),
    ],
    "aten.__lshift__.Scalar": [
        Case("empty", lambda a: aten.__lshift__.Scalar(a, 2), _ins(I_EMPTY)),
        Case("scalar", lambda a: aten.__lshift__.Scalar(a, 2), _ins(I_SCALAR)),
    ],
    "aten.__rshift__.Scalar": [
        Case("empty", lambda a: aten.__rshift__.Scalar(a, 1), _ins(I_EMPTY)),
        Case("scalar", lambda a: aten.__rshift__.Scalar(a, 1), _ins(I_SCALAR)),
    ],
    "aten._to_copy.default": [
        Case("empty", lambda a: a.to(torch.int32) + 1, _ins(EMPTY)),
        Case("scalar", lambda a: a.to(torch.bfloat16) * 2, _ins(SCALAR)),
    ],
    "aten._unsafe_view.default": [
        Case("empty", lambda a: aten._unsafe_view(a * 2, [3, 0]), _ins(EMPTY)),
        Case("scalar", lambda a: aten._unsafe_view(a * 2, [1]), _ins(SCALAR)),
    ],
    "aten.alias.default": [
        Case("empty", lambda a: aten.alias(a * 2), _ins(EMPTY)),
        Case("scalar", lambda a: aten.alias(a * 2), _ins(SCALAR)),
    ],
    "aten.detach.default": [
        Case("empty", lambda a: (a * 2).detach() + 1, _ins(EMPTY)),
        Case("scalar", lambda a: (a * 2).detach() + 1, _ins(SCALAR)),
    ],
    "aten.copy.default": [
        Case("empty", lambda a, b: aten.copy(a, b * 2), _ins(EMPTY, EMPTY)),
        Case("scalar", lambda a, b: aten.copy(a, b * 2), _ins(SCALAR, SCALAR)),
    ],
    "aten.lift_fresh_copy.default": [
        Case("empty", lambda a: aten.lift_fresh_copy(a) * 2, _ins(EMPTY)),
        Case("scalar", lambda a: aten.lift_fresh_copy(a) * 2, _ins(SCALAR)),
    ],
    "aten._efficientzerotensor.default": [
        Case("empty", lambda a: a + aten._efficientzerotensor([0, 3]), _ins(EMPTY)),
        Case("scalar", lambda a: a + aten._efficientzerotensor([]), _ins(SCALAR)),
    ],
    "aten.native_dropout.default": [
        Case("empty-eval", lambda a: aten.native_dropout(a, 0.5, False), _ins(EMPTY)),
        Case("scalar-eval", lambda a: aten.native_dropout(a, 0.5, False), _ins(SCALAR)),
        Case("empty-train", lambda a: aten.native_dropout(a, 0.5, True), _ins(EMPTY), True),
    ],
    "aten.rand.default": [
        Case("empty", lambda a: a + torch.rand(0, 3), _ins(EMPTY), True),
        Case("scalar", lambda a: a + torch.rand(()), _ins(SCALAR), True),
    ],
    "aten.rand.generator": [
        Case("empty", lambda a: a + torch.rand(0, 3), _ins(EMPTY), True),
    ],
    "aten.randperm.default": [
        Case("empty", lambda a: a + torch.randperm(0), _ins(_f(0)), True),
    ],
    "aten.randperm.generator": [
        Case("empty", lambda a: a + torch.randperm(0), _ins(_f(0)), True),
    ],
    "aten.random.default": [
        Case("empty", lambda a: torch.empty_like(a).random_(), _ins(EMPTY), True),
    ],
    "aten.random.from": [
        Case("empty", lambda a: torch.empty_like(a).random_(2, 9), _ins(EMPTY), True),
        Case("scalar", lambda a: torch.empty_like(a).random_(2, 9), _ins(SCALAR), True),
    ],
    "aten.random.to": [
        Case("empty", lambda a: torch.empty_like(a).random_(9), _ins(EMPTY), True),
        Case("scalar", lambda a: torch.empty_like(a).random_(9), _ins(SCALAR), True),
    ],
    "aten._assert_async.default": [
        Case("scalar", lambda a: (torch._assert_async(a.isfinite()), a * 2)[1], _ins(SCALAR)),
    ],
    "aten._assert_async.msg": [
        Case(
            "scalar", lambda a: (aten._assert_async.msg(a.isfinite(), "x"), a * 2)[1], _ins(SCALAR)
        ),
    ],
    "aten._functional_assert_async.msg": [
        Case("scalar", lambda a: (torch._assert_async(a.isfinite(), "x"), a + 1)[1], _ins(SCALAR)),
    ],
    "aten._assert_scalar.default": [
        Case("empty", lambda a: (aten._assert_scalar(a.shape[0] == 0, "n"), a + 1)[1], _ins(EMPTY)),
    ],
    "aten._functional_assert_scalar.default": [
        Case("empty", lambda a: (aten._assert_scalar(a.shape[0] == 0, "n"), a + 1)[1], _ins(EMPTY)),
    ],
    **{
        f"prims.{name}.default": [
            Case("empty", lambda a, _n=name: getattr(prims, _n)(a.abs() / 4), _ins(EMPTY)),
            Case("scalar", lambda a, _n=name: getattr(prims, _n)(a.abs() / 4), _ins(SCALAR)),
        ]
        for name in ("bessel_i0", "bessel_i0e", "bessel_i1", "bessel_i1e", "cbrt", "erf_inv")
    },
    "prims.rev.default": [Case("empty", lambda a: prims.rev(a * 2, [0, 1]), _ins(EMPTY))],
    "prims.shift_left.default": [
        Case("empty", lambda a, b: prims.shift_left(a, b), _ins(I_EMPTY, I_EMPTY)),
        Case("scalar", lambda a, b: prims.shift_left(a, b), _ins(I_SCALAR, I_SCALAR)),
    ],
    "prims.shift_right_arithmetic.default": [
        Case("empty", lambda a, b: prims.shift_right_arithmetic(a, b), _ins(I_EMPTY, I_EMPTY)),
    ],
    "prims.collapse.default": [
        Case("empty", lambda a: prims.collapse(a * 2, 0, 1), _ins(EMPTY)),
    ],
    "prims.convert_element_type.default": [
        Case("empty", lambda a: prims.convert_element_type(a, torch.int32), _ins(EMPTY)),
        Case("scalar", lambda a: prims.convert_element_type(a, torch.bfloat16), _ins(SCALAR)),
    ],
    "prims.iota.default": [
        Case(
            "empty",
            lambda a: (
                a.sum()
                + prims.iota(
                    0, start=0, step=1, dtype=torch.int32, device=a.device, requires_grad=False
                )
            ),
            _ins(EMPTY),
        ),
    ],
    **_quantization_cases(),
    "aten._int_mm.default": [
        Case(
            "empty",
            lambda a, b: aten._int_mm(a, b),
            _ins(_f(0, 8, dtype=torch.int8), _f(8, 8, dtype=torch.int8)),
        ),
    ],
    "aten.rrelu_with_noise_functional.default": [
        Case(
            "empty-eval",
            lambda a, n: aten.rrelu_with_noise_functional(a, n, 0.1, 0.3),
            _ins(EMPTY, EMPTY),
        ),
        Case(
            "scalar-eval",
            lambda a, n: aten.rrelu_with_noise_functional(a, n, 0.1, 0.3),
            _ins(SCALAR, SCALAR),
        ),
        Case(
            "empty-train",
            lambda a, n: aten.rrelu_with_noise_functional(a, n, 0.1, 0.3, True),
            _ins(EMPTY, EMPTY),
            True,
        ),
    ],
    **{
        f"aten.{name}.default": [
            Case(
                "empty",
                lambda a, _n=name: (getattr(aten, _n)(a.shape[0], min=0, max=4), a + 1)[1],
                _ins(EMPTY),
            ),
        ]
        for name in ("sym_constrain_range", "sym_constrain_range_for_size")
    },
    **{
        f"aten._functional_{name}.default": [
            Case(
                "empty",
                lambda a, _n=name: (getattr(aten, _n)(a.shape[0], min=0, max=4), a + 1)[1],
                _ins(EMPTY),
            ),
        ]
        for name in ("sym_constrain_range", "sym_constrain_range_for_size")
    },
}


def opinfo_names() -> set[str]:
    """Names an OpInfo entry is known by (its name, ATen name, aliases, backward name), in the
    spellings registered ops use (``linalg.ldl_factor`` -> ``linalg_ldl_factor``)."""
    from tests.conformance.opinfo import load_op_db

    names: set[str] = set()
    for op in load_op_db():
        for n in (op.name, getattr(op, "aten_name", None), *(a.name for a in op.aliases)):
            if n:
                bare = n.removeprefix("nn.functional.")
                names |= {n, bare, bare.replace(".", "_"), bare.split(".")[-1]}
        if getattr(op, "aten_backward_name", None):
            names.add(op.aten_backward_name)
    return names


def _stems(op_name: str) -> set[str]:
    base = re.sub(r"^[\w]+\.(\w+)\.\w+$", r"\1", op_name)
    bare = base.strip("_")
    trimmed = re.sub(r"_(backward|forward|functional|out)$", "", bare)
    return {base, bare, trimmed}


#: Namespaces of ops that are ours (the trn kernel ops: flash attention, ``dot_general``) or
#: the tests' own (NKI and fallback stand-ins): their own tests exercise them.
OWN_NAMESPACES = ("neuron_compile.", "nkitest.", "nctest.")


def unaccounted(registered: Iterable[str], names: set[str]) -> list[str]:
    """Registered PyTorch ops no OpInfo name matches, not in ``REACHED_BY`` and without
    ``CASES``."""
    return sorted(
        op
        for op in registered
        if not op.startswith(OWN_NAMESPACES)
        and op not in REACHED_BY
        and op not in CASES
        and not (_stems(op) & names)
    )


def run_case(case: Case) -> tuple[str, str]:
    """``(outcome, reason)``: pass, fallback, skip (eager rejects the inputs) or a failure."""
    args = case.inputs()
    try:
        expected = case.fn(*args)
    except Exception as e:  # noqa: BLE001 - eager rejecting an edge makes it not applicable
        return "skip", f"eager raised {type(e).__name__}"
    torch._dynamo.reset()
    _clear_fallbacks()
    try:
        compiled = torch.compile(case.fn, backend="neuron", dynamic=False)
        actual = compiled(*args)
    except Exception as e:  # noqa: BLE001 - classified below
        return classify_exception(e, reached_backend=True)
    finally:
        torch._dynamo.reset()
    if _fell_back_ops():
        return "fallback", ", ".join(_fell_back_ops())
    if case.random:
        got, want = leaves(actual), leaves(expected)
        meta = [(t.shape, t.dtype) for t in got] == [(t.shape, t.dtype) for t in want]
        return ("pass", "") if meta else ("mismatch", f"shapes/dtypes {got} vs eager {want}")
    why = compare(actual, expected, torch.float32)[0]
    return ("mismatch", why) if why else ("pass", "")


def main() -> int:
    bad = 0
    for op, cases in CASES.items():
        for case in cases:
            outcome, reason = run_case(case)
            bad += outcome not in ("pass", "fallback", "skip")
            print(f"{op} [{case.label}]: {outcome} {reason}".rstrip(), flush=True)
    print(f"{bad} failing case(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
