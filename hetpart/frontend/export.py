"""nn.Module + example inputs -> FX GraphModule, through torch.export with a dynamic batch."""

from __future__ import annotations

import torch
import torch.fx as fx
from torch.export import Dim

from hetpart.errors import HetpartError


def export_model(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> fx.GraphModule:
    """Export non-strict with dim 0 of every input dynamic; returns the unlifted GraphModule.

    Weights stay attributes (get_attr nodes); the runtime guard submodule export
    adds is dropped: the stages check their own inputs.
    """
    dynamic = tuple({0: Dim.DYNAMIC} if x.dim() > 0 else None for x in inputs)
    try:
        with torch.no_grad():
            ep = torch.export.export(module, inputs, dynamic_shapes=dynamic, strict=False)
    except Exception as err:  # torch raises many types; the user needs the first lines
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise HetpartError(
            f"torch.export could not trace the model: {type(err).__name__}: {first}\n"
            "  what to try: remove data-dependent Python control flow (if/for on tensor values), "
            "or make the batch dimension independent of other dimensions"
        ) from None
    gm = ep.module()
    for node in list(gm.graph.nodes):
        if node.op == "call_module" and node.target == "_guards_fn":
            gm.graph.erase_node(node)
    if hasattr(gm, "_guards_fn"):
        delattr(gm, "_guards_fn")
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm
