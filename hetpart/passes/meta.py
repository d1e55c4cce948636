"""Run a graph on meta tensors at concrete (microbatch) shapes: no memory, no time.

The shape, flops and op-cost passes need concrete values for each node; this
interpreter produces them, once per graph (`meta_run`, NOTE [one meta run]).
Ops that can take a device (factory ops, whose `device=` the frontend dropped:
NOTE [baked devices]) create on the meta device.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch.utils.flop_counter import FlopCounterMode

META = torch.device("meta")


def _hint(d: int | torch.SymInt) -> int:
    """The example value behind a traced dimension."""
    return int(d.node.hint) if isinstance(d, torch.SymInt) else int(d)


def concrete_input_shapes(gm: fx.GraphModule, batch_size: int) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """Each placeholder's shape with the dynamic batch dim (dim 0) set to `batch_size`."""
    shapes = []
    for node in gm.graph.find_nodes(op="placeholder"):
        val = node.meta["val"]
        dims = tuple(batch_size if i == 0 and isinstance(d, torch.SymInt) else _hint(d) for i, d in enumerate(val.shape))
        shapes.append((dims, val.dtype))
    return shapes


def _takes_device(target: object) -> bool:
    return isinstance(target, torch._ops.OpOverload) and any(a.name == "device" for a in target._schema.arguments)


# NOTE [scalars from tensors on meta]: `x.max().item()` (HF XLM checks `assert lengths.max().item()
# <= slen`) exports to `aten.item`, which has no value on a meta tensor. The interpreter takes the
# scalar export traced instead (`node.meta["val"]`): a number, a symbolic size with an example value
# (its hint), or an unbacked symbol (`u0`, data-dependent), which stands in as 0 moved into the range
# export proved for it. The runtime assertions export adds on such scalars (`_assert_scalar(u0 <= s1)`)
# are skipped on meta: they check data the analysis does not have. (The partitioned stages do not
# carry them either: a stage keeps the ops whose values it uses, and an assertion has no users.)
_TRACED_SCALARS = (torch.ops.aten.item.default, torch.ops.aten._local_scalar_dense.default)


def traced_scalar(node: fx.Node) -> int | float | bool:
    """A Python number for a scalar-from-tensor node (NOTE [scalars from tensors on meta])."""
    val = node.meta.get("val")
    if isinstance(val, (int, float, bool)):
        return val
    if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        kind = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}[type(val)]
        if val.node.hint is not None:
            return kind(val.node.hint)
        bounds = val.node.shape_env.var_to_range.get(val.node.expr)
        value = 0
        if bounds is not None and bounds.lower.is_number and bounds.lower > 0:
            value = bounds.lower
        if bounds is not None and bounds.upper.is_number and bounds.upper < value:
            value = bounds.upper
        return kind(value)
    raise RuntimeError(f"'{node.name}' ({node.target}) has no traced value to stand in for it on meta")


class MetaInterpreter(fx.Interpreter):
    """`fx.Interpreter` over meta tensors; `on_node(node, fn)` may wrap each op call."""

    def __init__(self, gm: fx.GraphModule, on_node: Callable[[fx.Node, Callable[[], Any]], Any] | None = None):
        super().__init__(gm, garbage_collect_values=True)
        self.on_node = on_node

    def get_attr(self, target, args, kwargs):
        value = super().get_attr(target, args, kwargs)
        if isinstance(value, torch.Tensor):
            return torch.empty_like(value, device=META)
        return value

    def call_function(self, target, args, kwargs):
        if target in _TRACED_SCALARS:  # NOTE [scalars from tensors on meta]
            return traced_scalar(self.current_node)
        if target is torch.ops.aten._assert_scalar.default:
            return None
        if _takes_device(target):
            kwargs = {**kwargs, "device": META}
        call = lambda: super(MetaInterpreter, self).call_function(target, args, kwargs)  # noqa: E731
        return call() if self.on_node is None else self.on_node(self.current_node, call)

    def run_node(self, n: fx.Node) -> Any:
        self.current_node = n
        return super().run_node(n)


def run_on_meta(gm: fx.GraphModule, batch_size: int, on_node=None) -> dict[fx.Node, Any]:
    """The value of every node at `batch_size`, as meta tensors (or Python scalars)."""
    values: dict[fx.Node, Any] = {}
    interp = MetaInterpreter(gm, on_node)
    original = interp.run_node

    def record(n: fx.Node) -> Any:
        out = original(n)
        values[n] = out
        return out

    interp.run_node = record  # type: ignore[method-assign]
    args = [torch.empty(shape, dtype=dtype, device=META) for shape, dtype in concrete_input_shapes(gm, batch_size)]
    with torch.no_grad():
        interp.run(*args)
    return values


# NOTE [one meta run]: the shape, flops and op-cost passes all read each node's value at the
# microbatch size. The graph runs on meta tensors once, counting each op's FLOPs with
# `FlopCounterMode` on the way, and the run is kept in the pass context (`ctx.meta_runs`) for
# the next pass to read. It stays valid while no pass changes the graph: the PassManager
# drops it after a pass that reports `changed`, and a run is kept for one GraphModule and
# microbatch size only.
@dataclass(frozen=True)
class MetaRun:
    """One run of a graph on meta tensors: every node's value and the FLOPs FlopCounterMode counted per op."""
    gm: fx.GraphModule
    batch_size: int
    values: dict[fx.Node, Any]
    counted_flops: dict[fx.Node, int]


def meta_run(gm: fx.GraphModule, batch_size: int, cache: dict | None = None) -> MetaRun:
    """`gm` run on meta tensors at `batch_size`, FLOPs counted; the run kept in `cache` (NOTE [one meta run])."""
    key = (id(gm), batch_size)
    found = cache.get(key) if cache is not None else None
    if found is not None and found.gm is gm:
        return found
    counted: dict[fx.Node, int] = {}

    def count(node: fx.Node, call: Callable[[], Any]) -> Any:
        with FlopCounterMode(display=False) as counter:
            out = call()
        counted[node] = counter.get_total_flops()
        return out

    run = MetaRun(gm, batch_size, run_on_meta(gm, batch_size, on_node=count), counted)
    if cache is not None:
        cache[key] = run
    return run
