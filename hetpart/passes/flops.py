"""FlopsPass ("flops"): FLOPs and bytes moved by every op, at the microbatch size.

FLOPs come from `torch.utils.flop_counter` run on meta tensors, plus formulas
for what it misses (NOTE [flop formulas]). Bytes moved are the op's tensor
inputs plus its output; views move nothing.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.fx as fx

from hetpart.ir import info
from hetpart.passes.manager import PassContext, PassResult
from hetpart.passes.meta import meta_run
from hetpart.passes.shape import tensor_bytes

aten = torch.ops.aten

# NOTE [flop formulas]
# FlopCounterMode counts scaled_dot_product_attention as 0 on CPU/meta (only
# the CUDA flash/efficient kernels have formulas) and ignores causal masks. We
# count it ourselves: QK^T and AV are 2*B*H*Lq*Lk*D each; a causal mask keeps
# sum_i min(i+1, Lk) of the Lq*Lk pairs (torch's top-left aligned mask).


def _sdpa_flops(args: tuple, kwargs: dict, out: Any) -> int:
    q, k, v = args[0], args[1], args[2]
    is_causal = kwargs.get("is_causal", args[5] if len(args) > 5 else False)
    *batch, lq, d = q.shape
    lk, dv = k.shape[-2], v.shape[-1]
    heads = 1
    for b in batch:
        heads *= b
    pairs = sum(min(i + 1, lk) for i in range(lq)) if is_causal else lq * lk
    return 2 * heads * pairs * (d + dv)


FORMULAS: dict[Any, Callable[[tuple, dict, Any], int]] = {
    aten.scaled_dot_product_attention.default: _sdpa_flops,
}


def _embedding_bytes(args: tuple, kwargs: dict, out: Any) -> int:
    """A lookup reads the gathered rows and the indices, not the whole table."""
    return 2 * tensor_bytes(out) + tensor_bytes(args[1])


# Bytes moved where "inputs + output" is wrong.
BYTES_FORMULAS: dict[Any, Callable[[tuple, dict, Any], int]] = {
    aten.embedding.default: _embedding_bytes,
}


# NOTE [backward formulas]
# In training, an op whose output needs a gradient runs a backward that computes
# the gradients of those of its inputs that need one (`needs_grad`): a trainable
# weight, or a value computed from one. Model inputs need none, so the first
# matmul on them computes only its weight's gradient, and ops on integer values
# (token ids, masks) have no backward at all.
# - matmuls and convolutions: each operand's gradient is one matmul (conv) of the
#   forward's size (grad_x = grad_out @ W^T, grad_W = grad_out^T @ x), so the
#   backward costs the forward's FLOPs once per operand that needs a gradient; a
#   bias gradient is a reduction of grad_out (bytes). Bytes: per operand, grad_out
#   and the other operand read, the gradient written.
# - scaled_dot_product_attention: the CPU and flash kernels recompute QK^T, then
#   compute dV, dP, dQ and dK: 5 matmuls against the forward's 2 (as
#   torch.utils.flop_counter's `sdpa_backward_flop_count`), over the same causal pairs.
# - embedding: the weight's gradient is a zeroed table plus a scatter-add of
#   grad_out's rows (the whole table is written: it dominates for big vocabularies).
# - everything else (elementwise, norms, softmax, reductions, copies) is
#   memory-bound: it reads grad_out and, per input that needs a gradient, the
#   saved input, and writes that gradient; FLOPs as in the forward.
# Views cost nothing backward either.

# Matmul-like ops: (positions of the two operands, position of the bias or None).
_MATMULS: dict[Any, tuple[tuple[int, int], int | None]] = {
    aten.mm.default: ((0, 1), None),
    aten.bmm.default: ((0, 1), None),
    aten.matmul.default: ((0, 1), None),
    aten.linear.default: ((0, 1), 2),
    aten.addmm.default: ((1, 2), 0),
    aten.baddbmm.default: ((1, 2), 0),
    aten.convolution.default: ((0, 1), 2),
    aten.conv1d.default: ((0, 1), 2),
    aten.conv2d.default: ((0, 1), 2),
    aten.conv3d.default: ((0, 1), 2),
}


def has_floating(value: Any) -> bool:
    """A floating-point tensor, or a tuple/list holding one (the values a gradient can flow through)."""
    if isinstance(value, torch.Tensor):
        return value.is_floating_point()
    if isinstance(value, (tuple, list)):
        return any(has_floating(v) for v in value)
    return False


def needs_grad(gm: fx.GraphModule, values: dict[fx.Node, Any]) -> set[fx.Node]:
    """Nodes whose output needs a gradient in training (NOTE [backward formulas])."""
    found: set[fx.Node] = set()
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value: Any = gm
            for part in node.target.split("."):
                value = getattr(value, part)
            if isinstance(value, torch.nn.Parameter) and value.requires_grad and value.is_floating_point():
                found.add(node)
        elif node.op == "call_function" and any(a in found for a in node.all_input_nodes) and has_floating(values.get(node)):
            found.add(node)
    return found


def backward_cost(node: fx.Node, values: dict[fx.Node, Any], fwd_flops: int, needs: set[fx.Node]) -> tuple[int, int]:
    """(FLOPs, bytes moved) of `node`'s backward at the values' sizes; see NOTE [backward formulas]."""
    if node.op != "call_function" or node not in needs or is_view(node):
        return 0, 0
    grad_out = tensor_bytes(values[node]) if isinstance(values[node], torch.Tensor) else sum(
        tensor_bytes(v) for v in values[node] if isinstance(v, torch.Tensor))
    arg = lambda i: node.args[i] if i < len(node.args) else None  # noqa: E731
    wants = lambda a: isinstance(a, fx.Node) and a in needs  # noqa: E731
    size = lambda a: tensor_bytes(values[a]) if isinstance(a, fx.Node) else 0  # noqa: E731
    if node.target in _MATMULS:
        (i, j), b = _MATMULS[node.target]
        flops = nbytes = 0
        for mine, other in ((arg(i), arg(j)), (arg(j), arg(i))):
            if wants(mine):
                flops += fwd_flops
                nbytes += grad_out + size(other) + size(mine)
        bias = arg(b) if b is not None else None
        if wants(bias):
            nbytes += grad_out + size(bias)
        return flops, nbytes
    if node.target == aten.scaled_dot_product_attention.default:
        q, k, v = arg(0), arg(1), arg(2)
        if not any(wants(a) for a in (q, k, v)):
            return 0, 0
        d, dv = values[q].shape[-1], values[v].shape[-1]
        # fwd_flops = 2 * heads * pairs * (d + dv); the backward's five matmuls are 2 * heads * pairs * (3d + 2dv).
        flops = fwd_flops * (3 * d + 2 * dv) // (d + dv)
        return flops, 2 * grad_out + 2 * (size(q) + size(k) + size(v))
    if node.target == aten.embedding.default:
        weight, indices = arg(0), arg(1)
        if not wants(weight):
            return 0, 0
        return values[node].numel(), size(weight) + 2 * grad_out + size(indices)
    inputs = [a for a in node.all_input_nodes if a in needs]
    return fwd_flops, grad_out + sum(2 * size(a) for a in inputs)


def is_view(node: fx.Node) -> bool:
    """Ops that only reinterpret memory (no kernel, no traffic)."""
    if node.target in (operator.getitem, aten.sym_size.int):
        return True
    return isinstance(node.target, torch._ops.OpOverload) and node.target.is_view


@dataclass(frozen=True)
class FlopsPass:
    name: ClassVar[str] = "flops"
    summary: ClassVar[str] = "FLOPs and bytes moved per op (meta tensors, microbatch size)"
    requires: ClassVar[tuple[str, ...]] = ("out_bytes",)
    provides: ClassVar[tuple[str, ...]] = ("flops", "bytes_moved")  # and bwd_flops, bwd_bytes_moved in training

    def run(self, gm: fx.GraphModule, ctx: PassContext) -> PassResult:
        run = meta_run(gm, ctx.microbatch_size, ctx.meta_runs)  # the shape pass's run: NOTE [one meta run]
        values, counted = run.values, run.counted_flops
        load = lambda a: values[a] if isinstance(a, fx.Node) else a  # noqa: E731
        for node in gm.graph.nodes:
            ni = info(node)
            if node.op != "call_function":
                ni.flops, ni.bytes_moved = 0, 0
                continue
            formula = FORMULAS.get(node.target)
            if formula is not None:
                args = fx.node.map_aggregate(node.args, load)
                kwargs = fx.node.map_aggregate(node.kwargs, load)
                ni.flops = int(formula(args, kwargs, values[node]))
            else:
                ni.flops = int(counted.get(node, 0))
            if is_view(node):
                ni.bytes_moved = 0
            elif node.target in BYTES_FORMULAS:
                args = fx.node.map_aggregate(node.args, load)
                ni.bytes_moved = int(BYTES_FORMULAS[node.target](args, fx.node.map_aggregate(node.kwargs, load), values[node]))
            else:
                ni.bytes_moved = tensor_bytes(values[node]) + sum(tensor_bytes(values[a]) for a in node.all_input_nodes)
        if ctx.mode == "training":
            needs = needs_grad(gm, values)
            for node in gm.graph.nodes:
                ni = info(node)
                ni.needs_grad = node in needs
                ni.bwd_flops, ni.bwd_bytes_moved = backward_cost(node, values, ni.flops or 0, needs)
        return PassResult(gm, changed=False)
