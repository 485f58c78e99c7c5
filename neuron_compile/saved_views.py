"""The backward gets a parameter, not the forward's copy of a view of it.

AOTAutograd's partitioner saves whatever forward node the backward reads. For a Linear that is
``permute(weight)``: the forward then returns the transposed weight as a saved activation, so
the executor materializes a transposed copy of every weight on every step (an XLA ``copy``
thunk; on the MLP benchmark ~8 % of the forward call), holds it until the backward, and the
backward's product reads it transposed once more. Saving the parameter itself and replaying the
view chain (``t``, ``permute``, ``view``, ...) at the top of the backward graph costs nothing: the
parameter is passed to the backward as the tensor it is (no copy, no device memory), and the
backward's products read the weight in the layout it has.

Only parameters are roots. A parameter cannot be modified in place while autograd records (eager
raises), so the value the backward reads is the value the forward read; an optimizer step
between the two is caught by autograd's version counter exactly as in eager, because the saved
tensor is the parameter itself. A buffer, by contrast, may be updated by the forward (BatchNorm's
running statistics) and keeps the saved copy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx

aten = torch.ops.aten

#: Ops whose result is a view of their first argument, fully determined by the other arguments.
VIEW_OPS = frozenset(
    {
        aten.t.default,
        aten.permute.default,
        aten.transpose.int,
        aten.view.default,
        aten._unsafe_view.default,
        aten.unsqueeze.default,
        aten.squeeze.default,
        aten.squeeze.dim,
        aten.squeeze.dims,
        aten.expand.default,
        aten.alias.default,
        aten.slice.Tensor,
        aten.select.int,
    }
)


def _view_chain(node: Any) -> tuple[fx.Node | None, list[fx.Node]]:
    """``node``'s root and the view ops from the root to ``node`` (root first)."""
    chain = []
    while isinstance(node, fx.Node) and node.op == "call_function" and node.target in VIEW_OPS:
        chain.append(node)
        node = node.args[0]
    root = node if isinstance(node, fx.Node) and node.op == "placeholder" else None
    return root, chain[::-1]


def _input_index(placeholder: fx.Node) -> int | None:
    desc = placeholder.meta.get("desc")
    index = getattr(desc, "idx", None) if type(desc).__name__ == "PlainAOTInput" else None
    return index if isinstance(index, int) else None


def save_parameters_not_views(
    fw: fx.GraphModule,
    bw: fx.GraphModule,
    num_fwd_outputs: int,
    is_parameter: Callable[[int], bool],
) -> int:
    """Rewrite a partitioned pair in place: each saved view chain of a parameter becomes the
    parameter, its chain replayed in the backward. Returns how many saved values changed."""
    output = fw.graph.output_node()
    outs = list(output.args[0])
    by_name = {p.name: p for p in bw.graph.find_nodes(op="placeholder")}
    body = next(n for n in bw.graph.nodes if n.op != "placeholder")  # replayed views go first
    changed = 0
    for pos in range(num_fwd_outputs, len(outs)):
        root, chain = _view_chain(outs[pos])
        index = _input_index(root) if root is not None else None
        slot = by_name.get(outs[pos].name) if chain else None
        if index is None or slot is None or not is_parameter(index):
            continue
        # The backward's slot now holds the parameter; its readers read the replayed view.
        with bw.graph.inserting_before(body):
            view: fx.Node = slot
            for node in chain:
                view = bw.graph.call_function(node.target, (view, *node.args[1:]), node.kwargs)
                view.meta = {k: v for k, v in node.meta.items() if k in ("val", "tensor_meta")}
                if view.args[0] is slot:
                    first = view
        slot.replace_all_uses_with(view, delete_user_cb=lambda user, first=first: user is not first)
        slot.meta.update({k: v for k, v in root.meta.items() if k in ("val", "tensor_meta")})
        outs[pos] = root
        changed += 1
    if changed:
        output.args = (type(output.args[0])(outs), *output.args[1:])
        fw.graph.eliminate_dead_code()
        fw.recompile()
        bw.graph.lint()
        bw.recompile()
    return changed


def saving_parameters_for_views(partition_fn: Any, example_inputs: Sequence[Any]) -> Any:
    """Wrap an AOTAutograd ``partition_fn``: ``save_parameters_not_views`` on what it returns,
    the parameters being the frame's example inputs that are ``nn.Parameter``s."""
    params = [isinstance(x, torch.nn.Parameter) for x in example_inputs]

    def is_parameter(index: int) -> bool:
        return index < len(params) and params[index]

    def partition(joint: fx.GraphModule, joint_inputs: Any, *, num_fwd_outputs: int, **kw: Any):
        fw, bw = partition_fn(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kw)
        save_parameters_not_views(fw, bw, num_fwd_outputs, is_parameter)
        return fw, bw

    return partition
