"""ShapePass ("shape"): shape, dtype and output bytes of every node.

Shapes are printed symbolically from export's metadata (the dynamic batch is
`s0`); bytes are counted at the microbatch size by running the graph on meta
tensors (once for this pass and the next: NOTE [one meta run] in meta.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import sympy
import torch
import torch.fx as fx

from hetpart.ir import info
from hetpart.ir.info import DTYPE_NAMES
from hetpart.passes.manager import PassContext, PassResult
from hetpart.passes.meta import meta_run


def tensor_bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    return 0


def symbol_names(gm: fx.GraphModule) -> dict[sympy.Symbol, sympy.Symbol]:
    """Export's symbols (s95, s12, ...) renamed s0, s1, ... in order of first use by an input."""
    renames: dict[sympy.Symbol, sympy.Symbol] = {}
    for node in gm.graph.find_nodes(op="placeholder"):
        for d in getattr(node.meta.get("val"), "shape", ()):
            if isinstance(d, torch.SymInt):
                for s in sorted(d.node.expr.free_symbols, key=str):
                    renames.setdefault(s, sympy.Symbol(f"s{len(renames)}"))
    return renames


def symbolic_shape(value: Any, renames: dict) -> tuple[str, ...]:
    return tuple(
        str(d.node.expr.xreplace(renames)) if isinstance(d, torch.SymInt) else str(int(d)) for d in value.shape
    )


@dataclass(frozen=True)
class ShapePass:
    name: ClassVar[str] = "shape"
    summary: ClassVar[str] = "shape, dtype and output bytes of every node"
    requires: ClassVar[tuple[str, ...]] = ()
    provides: ClassVar[tuple[str, ...]] = ("is_tensor", "shape", "dtype", "out_bytes")

    def run(self, gm: fx.GraphModule, ctx: PassContext) -> PassResult:
        renames = symbol_names(gm)
        values = meta_run(gm, ctx.microbatch_size, ctx.meta_runs).values  # NOTE [one meta run]
        for node in gm.graph.nodes:
            if node.op == "output":
                continue
            ni, value = info(node), values.get(node)
            traced = node.meta.get("val", value)
            ni.is_tensor = isinstance(value, torch.Tensor)
            if ni.is_tensor:
                ni.shape = symbolic_shape(traced if isinstance(traced, torch.Tensor) else value, renames)
                ni.dtype = DTYPE_NAMES.get(value.dtype, str(value.dtype).removeprefix("torch."))
            else:
                ni.dtype = "tuple" if isinstance(value, (tuple, list)) else "scalar"
            ni.out_bytes = tensor_bytes(value)
        return PassResult(gm, changed=False)
