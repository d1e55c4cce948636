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
from torch.utils.flop_counter import FlopCounterMode

from hetpart.ir import info
from hetpart.passes.manager import PassContext, PassResult
from hetpart.passes.meta import run_on_meta
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
    provides: ClassVar[tuple[str, ...]] = ("flops", "bytes_moved")

    def run(self, gm: fx.GraphModule, ctx: PassContext) -> PassResult:
        counted: dict[fx.Node, int] = {}

        def count(node: fx.Node, call: Callable[[], Any]) -> Any:
            with FlopCounterMode(display=False) as counter:
                out = call()
            counted[node] = counter.get_total_flops()
            return out

        values = run_on_meta(gm, ctx.microbatch_size, on_node=count)
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
        return PassResult(gm, changed=False)
