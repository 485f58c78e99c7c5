"""Saved activations stay on the device between a forward graph and its backward graph.

AOTAutograd's forward graph returns the activations the backward needs as extra outputs, and
hands them back as the backward's first inputs. Converting each one to a torch tensor and back
costs ~2-4 us per tensor per step (dlpack export, address registration, import), which for a
GPT block is most of our per-call overhead — and on a device it would mean host round trips of
tensors nobody on the host looks at. So the forward keeps them as executor arrays and returns,
in every saved slot, one per-call *token*: an empty tensor whose ``_neuron_saved`` attribute
lists the arrays by saved index. The backward reads the arrays from the token. This is what
device backends do (torch_xla's saved tensors are device tensors); the token is only the handle
AOTAutograd stores in its autograd context, so it lives exactly as long as the arrays must.

Residency is skipped, and every saved tensor is a real tensor, when something outside us must
see the saved tensors: saved-tensor hooks (``save_on_cpu``, offloading) and compiled autograd,
which traces the backward graph into its own graph with the saved tensors as inputs (a token
there would stand in for a real activation). Compiled autograd is seen when it is on while the
forward runs (``torch._dynamo.config.compiled_autograd`` set before ``torch.compile``); enabling
it only around ``backward()`` (``compiled_autograd._enable``) is not covered. Saved values that are also user
outputs are real tensors too, so in-place edits of them still trip autograd's version-counter
check as in eager.
"""

from __future__ import annotations

import operator
import sys
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

from .lowering.lower_graph import USER_OUTPUTS
from .lowering.rules import arg
from .lowering.stablehlo.pooling import pool_dims, pooled_dims

META_KEY = "neuron_saved"

#: ``GraphModule.meta`` key of a backward graph: ``{placeholder name: PoolWindow}`` for each saved
#: index tensor of a max pool, ``getitem(max_pool*d_with_indices(x, ...), 1)`` in the forward.
#: Indices from there point inside their own windows, which a backward rule may rely on
#: (cpu/pooling.py); indices from anywhere else may point anywhere in their plane.
POOL_INDICES = "neuron_pool_indices"
_MAX_POOLS = (
    torch.ops.aten.max_pool2d_with_indices.default,
    torch.ops.aten.max_pool3d_with_indices.default,
)


@dataclass
class SavedLink:
    """Shared by one forward graph and its backward graph (``GraphModule.meta[META_KEY]``)."""

    num_fwd_outputs: int  # forward outputs before the saved values (mutations, user outputs)
    #: saved indices whose values the forward keeps as executor arrays (set when it compiles)
    resident: tuple[int, ...] = field(default=())


def partition_attaching(partition_fn: Any, key: str, make: Any) -> Any:
    """Wrap an AOTAutograd ``partition_fn`` to attach one ``make(num_fwd_outputs)`` object to both
    graphs' ``meta[key]``: what the forward's compiler learns, the backward's compiler reads."""

    def partition(joint: fx.GraphModule, joint_inputs: Any, *, num_fwd_outputs: int, **kw: Any):
        fw, bw = partition_fn(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kw)
        fw.meta[key] = bw.meta[key] = make(num_fwd_outputs - _tokens_to_unlift(fw))
        return fw, bw

    return partition


def _tokens_to_unlift(fw: fx.GraphModule) -> int:
    """Effect-token outputs AOTAutograd removes from the forward after partitioning.

    The backend traces with ``unlift_effect_tokens``: the partitioned forward still takes each
    token as an input and returns it first, then AOTAutograd's ``unlift_tokens`` erases one token
    input and one token output per effect (torch/_functorch/_aot_autograd/utils.py), so the
    forward we compile has that many fewer outputs before its saved values."""
    import torch._functorch.config as functorch_config

    if not functorch_config.unlift_effect_tokens:
        return 0
    effects = fw.graph.find_nodes(op="call_function", target=torch.ops.higher_order.with_effects)
    return len({n.args[0] for n in effects if n.args[0].op == "placeholder"})


def partition_with_link(partition_fn: Any) -> Any:
    """Wrap an AOTAutograd ``partition_fn`` to attach one ``SavedLink`` to both graphs, and say
    which outputs the caller sees (``lower_graph.USER_OUTPUTS``): the forward's before its saved
    activations; none of the backward's (gradients, accumulated by autograd)."""
    linked = partition_attaching(partition_fn, META_KEY, SavedLink)

    def partition(joint: fx.GraphModule, joint_inputs: Any, **kw: Any):
        fw, bw = linked(joint, joint_inputs, **kw)
        fw.meta[USER_OUTPUTS], bw.meta[USER_OUTPUTS] = fw.meta[META_KEY].num_fwd_outputs, 0
        bw.meta[POOL_INDICES] = saved_pool_indices(fw, bw)
        return fw, bw

    return partition


#: A max pool's window as its op computes it: (op, input shape, kernel, stride, padding,
#: dilation, ceil_mode), torch's defaults and one-value-for-all-dims expansion applied.
PoolWindow = tuple[str, tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...],
                   tuple[int, ...], bool]  # fmt: skip


def pool_window(
    op: Any, x_shape: Any, n: int, kernel_size: Any, stride: Any, padding: Any, dilation: Any,
    ceil_mode: Any,
) -> PoolWindow:  # fmt: skip
    """The ``PoolWindow`` of max pool ``op`` over the last ``n`` dims of an input of ``x_shape``."""
    kernel = pool_dims(kernel_size, (), n)
    return (str(op), tuple(int(d) for d in x_shape), tuple(kernel),
            tuple(pool_dims(stride, kernel, n)), tuple(pool_dims(padding, [0] * n, n)),
            tuple(pool_dims(dilation, [1] * n, n)), bool(ceil_mode))  # fmt: skip


def forward_pool_window(pool: fx.Node) -> PoolWindow:
    """The ``PoolWindow`` of a ``max_pool*d_with_indices`` node."""
    return pool_window(
        pool.target, pool.args[0].meta["val"].shape, pooled_dims(pool), arg(pool, 1, "kernel_size"),
        arg(pool, 2, "stride", ()), arg(pool, 3, "padding", 0), arg(pool, 4, "dilation", 1),
        arg(pool, 5, "ceil_mode", False),
    )  # fmt: skip


def max_pool_of_indices(node: Any) -> fx.Node | None:
    """The max pool whose indices ``node`` is (``getitem(max_pool*d_with_indices(...), 1)``)."""
    if isinstance(node, fx.Node) and node.target is operator.getitem and node.args[1] == 1:
        pool = node.args[0]
        return pool if isinstance(pool, fx.Node) and pool.target in _MAX_POOLS else None
    return None


def saved_pool_indices(fw: fx.GraphModule, bw: fx.GraphModule) -> dict[str, PoolWindow]:
    """``bw.meta[POOL_INDICES]``: the backward's inputs that are a forward max pool's indices.
    A saved value keeps its joint-graph name in both graphs (as in ``saved_views``)."""
    inputs = {p.name for p in bw.graph.find_nodes(op="placeholder")}
    saved = {}
    for node in fw.graph.find_nodes(op="call_function", target=operator.getitem):
        pool = max_pool_of_indices(node)
        if pool is not None and node.name in inputs:
            saved[node.name] = forward_pool_window(pool)
    return saved


_top_hooks = torch._C._autograd._top_saved_tensors_default_hooks


def _compiled_autograd_on() -> bool:
    # True while torch.compile runs a frame with compiled autograd on (config.compiled_autograd
    # set when torch.compile wrapped the function), i.e. while our forward runs in it.
    try:  # private module: a torch release that moves it simply loses this check
        return bool(sys.modules["torch._dynamo.compiled_autograd"].compiled_autograd_enabled)
    except (KeyError, AttributeError):
        return False


def externally_observed() -> bool:
    """True when saved tensors must be real tensors this call (see the module docstring)."""
    return _top_hooks(False) is not None or _compiled_autograd_on()


def token_holding(arrays: list[Any]) -> torch.Tensor:
    """A fresh token that owns ``arrays`` (saved index -> array, None where not resident)."""
    token = torch.empty(0)
    token._neuron_saved = arrays
    return token


def token_arrays(value: Any) -> list[Any] | None:
    """The arrays behind a token, or None for a real tensor."""
    return getattr(value, "_neuron_saved", None)
