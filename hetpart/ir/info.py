"""`NodeInfo`: the one typed annotation every pass reads and writes.

It lives under `node.meta["hetpart"]`; code goes through `info(node)` and never
touches `node.meta` keys of its own.

    >>> import torch.fx as fx
    >>> g = fx.Graph(); x = g.placeholder("x")
    >>> info(x).flops = 10
    >>> info(x).flops
    10
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch
import torch.fx as fx

META_KEY = "hetpart"
# torch dtype -> the short name `NodeInfo.dtype` and the manifest record (a rank maps it back: runtime/worker.py).
DTYPE_NAMES = {
    torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
    torch.bool: "b8", torch.complex64: "c64",
}


@dataclass
class NodeInfo:
    """What the passes know about one FX node. `None` / empty means "not computed yet"."""

    # shape pass
    is_tensor: bool | None = None  # False for SymInts, tuples, None outputs
    shape: tuple[str, ...] | None = None  # symbolic, e.g. ("s0", "64", "128")
    dtype: str | None = None  # short name (DTYPE_NAMES), e.g. "f32"; "tuple" or "scalar" for non-tensors
    out_bytes: int | None = None  # bytes of the output at microbatch size (0 for non-tensors)
    # flops pass
    flops: int | None = None  # at microbatch size
    bytes_moved: int | None = None  # memory traffic of the op at microbatch size (0 for views)
    needs_grad: bool | None = None  # training only: the output needs a gradient (computed from a trainable weight)
    bwd_flops: int | None = None  # training only: FLOPs of the gradients this op's backward computes
    bwd_bytes_moved: int | None = None  # training only: memory traffic of that backward
    # memory pass
    param_bytes: int | None = None  # bytes of the weight a get_attr node reads
    weight: str | None = None  # canonical name of that weight (tied weights share one)
    act_bytes: int | None = None  # activation memory the node's output needs in its stage
    # op-cost pass
    cost_ns: dict[str, int] = field(default_factory=dict)  # device type -> time at microbatch size
    bwd_cost_ns: dict[str, int] = field(default_factory=dict)  # training only: backward time per device type
    # tensor-parallel pass (--tensor-parallel): degree -> this node's part in a stage of that degree, e.g.
    # "split:2" (its output split on dim 2), "shard:0" (a weight split on dim 0), "allreduce" (a row linear's
    # partial sum); what the dump after that pass shows (NOTE [tensor-parallel sharding] in passes/tensor_parallel.py)
    tp: dict[int, str] = field(default_factory=dict)
    # partition
    stage: int | None = None


def info(node: fx.Node) -> NodeInfo:
    """The node's annotation, created empty on first use."""
    found = node.meta.get(META_KEY)
    if found is None:
        found = node.meta[META_KEY] = NodeInfo()
    return found


def has_field(node: fx.Node, name: str) -> bool:
    """Whether a pass has filled `name` on this node (used by PassManager's requires check)."""
    found = node.meta.get(META_KEY)
    if found is None:
        return False
    value = getattr(found, name)
    return value is not None and value != {}


FIELD_NAMES = frozenset(f.name for f in fields(NodeInfo))
