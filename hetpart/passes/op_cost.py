"""OpCostPass ("op-cost"): time of every op on every device type of the cluster.

Roofline: `max(flops / (peak_dtype * matmul_eff), bytes / (bw * memory_eff)) + overhead`.
Views cost nothing (no kernel runs). Times are integer nanoseconds per microbatch.
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


def op_time_ns(ni: NodeInfo, dev: DeviceType, node: fx.Node | None = None) -> int:
    """Roofline time of one op on `dev`; 0 for an op that moves and computes nothing."""
    flops, nbytes = ni.flops or 0, ni.bytes_moved or 0
    if flops == 0 and nbytes == 0:
        return 0
    rate = dev.flops_per_s(peak_key(node, ni.dtype)) * dev.matmul_efficiency
    bw = dev.mem_bw_bytes_per_s * dev.memory_efficiency
    return math.ceil(max(flops / rate, nbytes / bw) * 1e9) + dev.overhead_ns


@dataclass(frozen=True)
class OpCostPass:
    name: ClassVar[str] = "op-cost"
    summary: ClassVar[str] = "roofline time of every op on every device type of the cluster"
    requires: ClassVar[tuple[str, ...]] = ("flops", "bytes_moved")
    provides: ClassVar[tuple[str, ...]] = ("cost_ns",)

    def run(self, gm: fx.GraphModule, ctx: PassContext) -> PassResult:
        for node in gm.graph.nodes:
            if node.op != "call_function":
                continue
            ni = info(node)
            if is_view(node):
                ni.cost_ns = {name: 0 for name in sorted(ctx.device_types)}
            else:
                ni.cost_ns = {name: op_time_ns(ni, dev, node) for name, dev in sorted(ctx.device_types.items())}
        return PassResult(gm, changed=False)
