"""OpCostPass ("op-cost"): time of every op on every device type of the cluster.

Roofline: `max(flops / (peak_dtype * matmul_eff), bytes / (bw * memory_eff)) + overhead`,
or the measured time where a profile of the device type has the op (`profiler/table.py`).
Views cost nothing in the roofline (no kernel runs). Times are integer nanoseconds per
microbatch. In training, `bwd_cost_ns` is each op's backward, from NOTE [backward formulas].
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.fx as fx

from hetpart.devices.catalog import DeviceType
from hetpart.ir import NodeInfo, info
from hetpart.passes.flops import is_view
from hetpart.passes.manager import PassContext, PassResult
from hetpart.passes.meta import meta_run
from hetpart.profiler.table import backward_key, op_key, profiled

# FX dtype short names -> the catalog's peak-rate keys.
PEAK_KEY = {"f32": "fp32", "f16": "fp16", "bf16": "bf16", "f64": "fp32"}

# NOTE [fp32 convolutions use TF32]
# PyTorch runs fp32 matmuls in full fp32 by default (torch.backends.cuda.matmul.allow_tf32
# is False) but lets cuDNN run fp32 convolutions in TF32 (torch.backends.cudnn.allow_tf32
# is True). So an fp32 convolution gets the device's tf32 rate where it has one.
_CONVOLUTIONS = {torch.ops.aten.convolution.default, torch.ops.aten.conv1d.default,
                 torch.ops.aten.conv2d.default, torch.ops.aten.conv3d.default}


def peak_key(node: fx.Node | None, dtype: str | None) -> str:
    key = PEAK_KEY.get(dtype or "f32", "fp32")
    if key == "fp32" and node is not None and node.target in _CONVOLUTIONS:
        return "tf32"
    return key


def roofline_ns(flops: int, nbytes: int, dev: DeviceType, rate_key: str) -> int:
    """`max(flops / (peak * matmul_eff), bytes / (bw * memory_eff)) + overhead`; 0 when there is no work."""
    if flops == 0 and nbytes == 0:
        return 0
    rate = dev.flops_per_s(rate_key) * dev.matmul_efficiency
    bw = dev.mem_bw_bytes_per_s * dev.memory_efficiency
    return math.ceil(max(flops / rate, nbytes / bw) * 1e9) + dev.overhead_ns


def op_time_ns(ni: NodeInfo, dev: DeviceType, node: fx.Node | None = None) -> int:
    """Roofline time of one op's forward on `dev`; 0 for an op that moves and computes nothing."""
    return roofline_ns(ni.flops or 0, ni.bytes_moved or 0, dev, peak_key(node, ni.dtype))


def backward_time_ns(ni: NodeInfo, dev: DeviceType, node: fx.Node | None = None) -> int:
    """Roofline time of one op's backward (NOTE [backward formulas] in flops.py) on `dev`."""
    return roofline_ns(ni.bwd_flops or 0, ni.bwd_bytes_moved or 0, dev, peak_key(node, ni.dtype))


@dataclass(frozen=True)
class OpCostPass:
    name: ClassVar[str] = "op-cost"
    summary: ClassVar[str] = "roofline time of every op on every device type of the cluster"
    requires: ClassVar[tuple[str, ...]] = ("flops", "bytes_moved")
    provides: ClassVar[tuple[str, ...]] = ("cost_ns",)

    def run(self, gm: fx.GraphModule, ctx: PassContext) -> PassResult:
        # Measured times where a profile of the device type has the op (NOTE [profile keys]).
        profiles = {t: p for t, p in ctx.profiles.items() if t in ctx.device_types}
        values = meta_run(gm, ctx.microbatch_size, ctx.meta_runs).values if profiles else {}  # NOTE [one meta run]
        training = ctx.mode == "training"
        needs = {n for n in gm.graph.nodes if info(n).needs_grad}
        for node in gm.graph.nodes:
            if node.op != "call_function":
                continue
            ni = info(node)
            key = op_key(node, values) if profiles and profiled(node) else None
            costs = {}
            for name, dev in sorted(ctx.device_types.items()):
                measured = profiles[name].forward_ns.get(key) if name in profiles and key is not None else None
                if measured is not None:
                    costs[name] = measured
                else:
                    costs[name] = 0 if is_view(node) else op_time_ns(ni, dev, node)
            ni.cost_ns = costs
            if training:
                bkey = backward_key(node, values, needs) if key is not None and ni.needs_grad else None
                ni.bwd_cost_ns = {}
                for name, dev in sorted(ctx.device_types.items()):
                    measured = profiles[name].backward_ns.get(bkey) if name in profiles and bkey else None
                    ni.bwd_cost_ns[name] = (measured if measured is not None
                                            else 0 if is_view(node) else backward_time_ns(ni, dev, node))
        return PassResult(gm, changed=False)
