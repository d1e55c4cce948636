"""Refuse a model too big for the cluster before tracing it (NOTE [refused before the trace]).

NOTE [refused before the trace]
Tracing a 405B-parameter model takes minutes, and a plan needs every weight somewhere: each is
held by at least one stage, with its gradient and optimizer state in training
(`costs.training_state_bytes`, the formula lowering uses). So once the model is built (on meta:
no memory, seconds), its parameters alone say whether the cluster's memory can hold it at all:
the parameters' bytes (each shared one once), plus, in training, the state of every parameter that
needs a gradient. When that exceeds the sum of every device's memory, no plan fits, whatever the
partitioner does (it would say the same after the trace: activations only add to the need), and
`compile_model` stops with the numbers. The check is necessary, not sufficient: a model that
passes it may still fit nowhere (activations, one layer larger than any device), which the
partitioner then says after the trace.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from hetpart.devices import Cluster
from hetpart.errors import HetpartError
from hetpart.partitioner.costs import training_state_bytes
from hetpart.units import format_bytes


@dataclass(frozen=True)
class WeightMemory:
    """What a model's parameters need at least, over all stages (NOTE [refused before the trace])."""

    params: int  # parameters, each shared one once
    param_bytes: int
    state_bytes: int  # gradients and optimizer state (training), 0 in inference

    @property
    def total_bytes(self) -> int:
        return self.param_bytes + self.state_bytes


def weight_memory(module: nn.Module, training: bool, optimizer_bytes_per_param: int) -> WeightMemory:
    """The parameters' bytes and, in training, their gradients' and optimizer state's (meta parameters count too)."""
    params = list(module.parameters())  # each shared parameter once
    state = sum(training_state_bytes(p.numel() * p.element_size(), p.numel(), optimizer_bytes_per_param)
                for p in params if training and p.requires_grad)
    return WeightMemory(params=sum(p.numel() for p in params),
                        param_bytes=sum(p.numel() * p.element_size() for p in params), state_bytes=state)


def check_fits_cluster(module: nn.Module, cluster: Cluster, model: str, training: bool,
                       optimizer_bytes_per_param: int) -> None:
    """HetpartError, with the numbers, when the weights (and training state) exceed the cluster's memory."""
    need = weight_memory(module, training, optimizer_bytes_per_param)
    have = sum(d.mem_bytes for d in cluster.devices)
    if need.total_bytes <= have:
        return
    what = (f"{format_bytes(need.param_bytes)} of weights + {format_bytes(need.state_bytes)} of gradients and "
            f"optimizer state (--optimizer-bytes-per-param {optimizer_bytes_per_param})" if training
            else "weights only")
    raise HetpartError(
        f"{model} does not fit cluster '{cluster.name}': its {need.params / 1e9:,.3g} billion parameters need at "
        f"least {format_bytes(need.total_bytes)} ({what}), and the cluster's {len(cluster.devices)} device(s) hold "
        f"{format_bytes(have)} in all; refused before tracing. Use a cluster with more memory"
        + (", --mode inference, or a smaller --optimizer-bytes-per-param" if training else "")
        + " (or a smaller model)")
