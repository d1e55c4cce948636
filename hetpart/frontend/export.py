"""nn.Module + example inputs -> FX GraphModule, through torch.export with a dynamic batch."""

from __future__ import annotations

import traceback
from pathlib import Path

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
        where = model_source_line(err)
        raise HetpartError(
            f"torch.export could not trace the model{f' at {where}' if where else ''}: {type(err).__name__}: {first}\n"
            "  what to try: remove data-dependent Python control flow (if/for on tensor values), "
            "or make the batch dimension independent of other dimensions"
        ) from None
    gm = ep.module()
    for node in list(gm.graph.nodes):
        if node.op == "call_module" and node.target == "_guards_fn":
            gm.graph.erase_node(node)
    if hasattr(gm, "_guards_fn"):
        delattr(gm, "_guards_fn")
    follow_input_devices(gm)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


def model_source_line(err: BaseException) -> str | None:
    """`path/to/model.py:192 in forward: code`, the innermost frame of the model's own code.

    Non-strict export runs the model's Python, so the traceback holds the model's frames
    between export's and torch's own; the innermost of them is the line that failed.
    """
    torch_dir = Path(torch.__file__).parent
    own = Path(__file__).parent
    frames = [f for f in traceback.extract_tb(err.__traceback__)
              if not Path(f.filename).is_relative_to(torch_dir) and not Path(f.filename).is_relative_to(own)]
    if not frames:
        return None
    f = frames[-1]
    return f"{f.filename}:{f.lineno} in {f.name}" + (f" (`{f.line.strip()}`)" if f.line else "")


def follow_input_devices(gm: fx.GraphModule) -> None:
    """Drop the tracing machine's device from conversions, so each op runs where its input lives.

    NOTE [baked devices]: export records `x.to(device=x.device, dtype=...)` (HF rotary embeddings, masks)
    as `aten.to.device(x, cpu, ...)` and adds `_assert_tensor_metadata(x, device=cpu)` checks. A stage
    runs on its own device (and the analysis passes on meta), so the device is dropped: `to.device`
    becomes `to.dtype`, `to.dtype_layout` and the metadata check lose their `device=`. Factory ops
    (`arange(..., device=cpu)`) are left to the meta interpreter and codegen.
    """
    aten = torch.ops.aten
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is aten.to.device:
            x, _device, *rest = node.args
            node.target, node.args = aten.to.dtype, (x, *rest)
        elif node.target in (aten.to.dtype_layout, aten._assert_tensor_metadata.default) and "device" in node.kwargs:
            node.kwargs = {k: v for k, v in node.kwargs.items() if k != "device"}
