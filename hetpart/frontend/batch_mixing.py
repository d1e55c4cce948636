"""Ops that mix samples across the batch dimension, which microbatching changes.

NOTE [batch mixing]: a pipeline runs the model on microbatches of --batch-size /
--microbatches samples, so it computes what the model computes only if every sample's
outputs depend on that sample alone. An op that reads across dim 0 (in-batch negatives
`x @ x.T`, a mean over the batch, batch norm in training mode, a softmax over dim 0, the
first sample `x[0]`) gives other results on a microbatch: the plan would run and `run
--verify` FAIL. The traced graph says where: the batch is a symbol of export's dynamic
shapes (the free symbols of dim 0 of the model's inputs, less those of any later input dim,
the sequence length), and an op mixes the batch where
- its inputs carry the batch and its result does not (a reduction, contraction or index
  over dim 0; ops that read only their input's shape, `new_zeros`, are not counted),
- its result carries the batch in two dims and no input does (`x @ x.T`: [B, B]),
- it normalizes, scans, sorts or shifts along a dim that carries the batch (softmax,
  cumsum, sort, topk, flip, roll),
- it is batch norm in training mode.
Each is a warning, not an error: a model may mean it (a contrastive loss over the whole
batch), and a microbatch of its own size then needs --microbatches 1. Reads that keep the
batch's size but shift samples (`x[1:] - x[:-1]`) are not found.

    >>> import torch
    >>> from hetpart.frontend.export import export_model
    >>> class InBatch(torch.nn.Module):
    ...     def forward(self, x):
    ...         return torch.softmax(x @ x.T, dim=-1)
    >>> for m in batch_mixing(export_model(InBatch(), (torch.randn(4, 8),))):
    ...     print(m.op, "-", m.why)
    aten.matmul.default - its result has the batch in 2 dimensions (a sample meets every other)
    aten.softmax.int - it runs along dim 1, which carries the batch
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx

# Ops that read only their input's shape, dtype or device, not its values.
_SHAPE_ONLY = frozenset({"new_empty", "new_zeros", "new_ones", "new_full", "empty_like", "zeros_like", "ones_like",
                         "full_like", "rand_like", "randn_like", "randint_like", "sym_size", "sym_numel", "sym_stride",
                         "_assert_tensor_metadata", "_assert_scalar", "sym_constrain_range_for_size"})
# Ops that combine the elements along their `dim` (or `dims`): a batch there mixes samples.
_ALONG_DIM = frozenset({"softmax", "_softmax", "log_softmax", "_log_softmax", "cumsum", "cumprod", "cummax", "cummin",
                        "logcumsumexp", "sort", "argsort", "topk", "flip", "roll", "kthvalue", "median", "mode",
                        "_safe_softmax"})


@dataclass(frozen=True)
class BatchMixing:
    """One op that mixes samples (NOTE [batch mixing])."""

    node: str  # the FX node's name
    op: str  # `aten.mm.default`
    why: str
    where: str | None = None  # the model's source line, where known (`model.py:12 in forward`)

    def describe(self) -> str:
        return f"{self.op} ({self.node}{f' at {self.where}' if self.where else ''}): {self.why}"


def _op_name(node: fx.Node) -> str:
    target = node.target
    return str(target) if isinstance(target, torch._ops.OpOverload) else getattr(target, "__name__", str(target))


def _base_name(node: fx.Node) -> str:
    """The op's schema name: `_softmax` for `aten._softmax.default`."""
    target = node.target
    name = target._schema.name.split("::")[-1] if isinstance(target, torch._ops.OpOverload) else str(target)
    return name


def _tensors(val: object) -> list[torch.Tensor]:
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (tuple, list)):
        return [t for v in val for t in _tensors(v)]
    return []


def batch_symbols(gm: fx.GraphModule) -> set:
    """The symbols of the batch: dim 0 of the model's inputs, less the symbols of their later dims."""
    batch, other = set(), set()
    for node in gm.graph.nodes:
        if node.op != "placeholder" or not isinstance(node.meta.get("val"), torch.Tensor):
            continue
        shape = node.meta["val"].shape
        for i, d in enumerate(shape):
            syms = d.node.expr.free_symbols if isinstance(d, torch.SymInt) else set()
            (batch if i == 0 else other).update(syms)
    return batch - other


def _batch_dims(t: torch.Tensor, batch: set) -> list[int]:
    return [i for i, d in enumerate(t.shape) if isinstance(d, torch.SymInt) and d.node.expr.free_symbols & batch]


def _argument(node: fx.Node, name: str) -> object:
    """The value of the op's schema argument `name` in this call (its default where not passed)."""
    schema = node.target._schema  # type: ignore[union-attr]
    for i, arg in enumerate(schema.arguments):
        if arg.name == name:
            if i < len(node.args):
                return node.args[i]
            return node.kwargs.get(name, arg.default_value if arg.has_default_value() else None)
    return None


def _why(node: fx.Node, batch: set) -> str | None:
    name = _base_name(node)
    if name in _SHAPE_ONLY:
        return None
    ins = [t for a in node.all_input_nodes for t in _tensors(a.meta.get("val"))]
    outs = _tensors(node.meta.get("val"))
    if not ins or not outs:
        return None
    in_dims = [_batch_dims(t, batch) for t in ins]
    out_dims = [_batch_dims(t, batch) for t in outs]
    if "batch_norm" in name and (_argument(node, "training") is True or "with_update" in name):
        return "batch norm in training mode normalizes with the statistics of the whole batch"
    if any(in_dims) and not any(out_dims):
        return "its inputs carry the batch and its result does not (it reduces, contracts or indexes dim 0)"
    if max(len(d) for d in out_dims) >= 2 and max(len(d) for d in in_dims) < 2:
        return f"its result has the batch in {max(len(d) for d in out_dims)} dimensions (a sample meets every other)"
    if name in _ALONG_DIM and in_dims[0]:
        dims = _argument(node, "dim")
        dims = _argument(node, "dims") if dims is None else dims
        rank = ins[0].dim()
        along = [d % rank for d in (dims if isinstance(dims, (list, tuple)) else [dims]) if isinstance(d, int)]
        hit = sorted(set(along) & set(in_dims[0]))
        if hit:
            return f"it runs along dim {hit[0]}, which carries the batch"
    return None


def batch_mixing(gm: fx.GraphModule) -> list[BatchMixing]:
    """The ops of an exported graph that mix samples across the batch (NOTE [batch mixing])."""
    batch = batch_symbols(gm)
    if not batch:
        return []
    found = []
    for node in gm.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            why = _why(node, batch)
            if why is not None:
                found.append(BatchMixing(node.name, _op_name(node), why))
    return found
