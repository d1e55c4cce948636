"""MemoryPass ("memory"): weight bytes of get_attr nodes and activation bytes of ops.

Inference memory of a stage is its weights plus the activations of one
microbatch. We count every non-view output a stage produces (an upper bound on
its peak live set: simple, and safe for the capacity constraint).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.fx as fx

from hetpart.ir import info
from hetpart.passes.flops import is_view
from hetpart.passes.manager import PassContext, PassResult
from hetpart.passes.shape import tensor_bytes


def fetch_attr(gm: fx.GraphModule, target: str) -> object:
    obj: object = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


@dataclass(frozen=True)
class MemoryPass:
    name: ClassVar[str] = "memory"
    summary: ClassVar[str] = "weight bytes per get_attr, activation bytes per op"
    requires: ClassVar[tuple[str, ...]] = ("out_bytes",)
    provides: ClassVar[tuple[str, ...]] = ("param_bytes", "act_bytes")

    def run(self, gm: fx.GraphModule, ctx: PassContext) -> PassResult:
        for node in gm.graph.nodes:
            ni = info(node)
            if node.op == "get_attr":
                value = fetch_attr(gm, node.target)
                ni.param_bytes = tensor_bytes(value) if isinstance(value, torch.Tensor) else 0
                ni.weight = node.target
                ni.act_bytes = 0
            elif node.op in ("placeholder", "call_function"):
                ni.act_bytes = 0 if node.op == "call_function" and is_view(node) else (ni.out_bytes or 0)
        return PassResult(gm, changed=False)
