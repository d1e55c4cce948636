"""A pipeline whose tensor-parallel stages have different degrees: leaders talk, followers listen.

NOTE [mixed-degree pipeline]
A plan with every stage at one degree t runs one pipeline group per TP index (a lane, NOTE
[tensor-parallel stages] in codegen/tp.py): TP rank j of stage k sends to TP rank j of stage
k+1. Where degrees differ (TP 2 on an NVLink machine beside TP 1 on a PCIe one) rank j of one
stage has no counterpart in the next, so such a plan (manifest `mesh.tp_boundaries` "leaders",
format version 3) runs one pipeline group of the stages' *leaders*, each stage's TP rank 0, and
- a leader is an ordinary PipelineStage of that group (`stage_index_to_group_rank`: stage k ->
  its leader's place), which receives its stage's input and sends its output;
- a follower (TP rank j > 0) runs a `FollowerStage`: the same stage index, stage count and
  schedule class as its leader, so torch's own schedule (GPipe, 1F1B) makes it run the same
  forwards and backwards in the same order (their TP collectives then pair up), with every
  point-to-point op of the pipeline left out (`get_*_ops` return nothing);
- the boundaries are Megatron-style operators around the stage (`TPEdges`): at the entry of a
  stage k > 0, its inputs broadcast from the leader to the TP group (the follower's receive
  buffers are never filled: the broadcast replaces them); backward the identity, since each TP
  rank's input gradient is already whole (the f operators inside the stage all-reduce it, as
  the lanes rely on); at the exit of a stage k < S-1, the identity forward (the output of a
  Megatron block is replicated after its g all-reduce, so a follower sends nothing) and, backward,
  the output gradients broadcast from the leader, who received them;
- the loss of a last stage of degree t: every rank of it computes the same loss on the same
  (replicated) outputs against the same target;
- the schedules' set-up talks too: the inference-mode vote (`_warmup_forward_vote`,
  `_warmup_backward_result`) and the shapes of a training run's boundaries
  (`_recv_meta`/`_send_meta`, the stage run once on empty tensors). A `LeaderStage` hands the
  vote's result and every received shape record on to its followers by a broadcast in the TP
  group; a follower takes them from there and sends nothing, and runs the same set-up forward
  and backward as its leader, so their collectives pair up there too.
- a weight several stages hold (a tied embedding and LM head) is summed over one weights group
  of every rank of those stages, each adding its gradient divided by its stage's degree (the
  TP ranks of a stage hold equal, whole gradients of a replicated weight), so every copy gets
  the sum of the stages' gradients; a weight split in one stage and held by another is summed
  slice by slice (NOTE [mixed-degree gradient sync] in partitioner/tp_sync.py). Data-parallel
  pipelines of several degrees run each pipeline so: NOTE [mixed-degree pipelines mesh] in codegen/tp.py.
Uniform plans keep their lanes: no broadcast hop inside the group, and their artifacts stay as
they were (version 2). The cost model charges a boundary once over the link between the two
stages' machines (NOTE [tensor-parallel costs] in passes/tp_lower.py); the broadcast inside the
machine is not charged (one latency and bytes over the machine's NVLink or PCIe per boundary).
This subclasses torch.distributed.pipelining's PipelineStage at its point-to-point and set-up
methods (torch is pinned; tests/runtime/test_tp_mixed_run.py runs it end to end).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage


class _FromLeader(torch.autograd.Function):
    """Entry of a TP stage beside stages of other degrees: the inputs broadcast from the leader; backward the
    identity (each rank's input gradient is whole: NOTE [mixed-degree pipeline])."""

    @staticmethod
    def forward(ctx, leader: int, group: Any, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = tuple(x.detach().contiguous().clone() for x in xs)
        for x in out:
            dist.broadcast(x, src=leader, group=group)
        ctx.floats = [x.is_floating_point() for x in out]
        ctx.mark_non_differentiable(*[x for x in out if not x.is_floating_point()])
        ctx.set_materialize_grads(False)
        return out

    @staticmethod
    def backward(ctx, *grads: torch.Tensor | None) -> tuple:
        return (None, None, *[g if f else None for g, f in zip(grads, ctx.floats)])


class _ToNext(torch.autograd.Function):
    """Exit of a TP stage beside stages of other degrees: the identity (the outputs are replicated); backward the
    output gradients broadcast from the leader, who received them (NOTE [mixed-degree pipeline])."""

    @staticmethod
    def forward(ctx, leader: int, group: Any, *ys: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.leader, ctx.group = leader, group
        return tuple(y.view_as(y) for y in ys)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor) -> tuple:
        out = tuple(g.contiguous().clone() for g in grads)
        for g in out:
            dist.broadcast(g, src=ctx.leader, group=ctx.group)
        return (None, None, *out)


class TPEdges(torch.nn.Module):
    """A stage of degree > 1 in a plan of mixed degrees, with its boundaries' operators (NOTE [mixed-degree
    pipeline]): `entry` (a stage after the first) broadcasts its inputs from the leader, `exit` (a stage before the
    last) broadcasts its outputs' gradients from it."""

    def __init__(self, stage: torch.nn.Module, leader: int, group: Any, entry: bool, exit: bool) -> None:
        super().__init__()
        self.stage = stage
        self.leader, self.group, self.entry, self.exit = leader, group, entry, exit

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:  # noqa: D102
        if self.entry:
            args = _FromLeader.apply(self.leader, self.group, *args)
        outputs = self.stage(*args)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        if not self.exit:
            return outputs
        floats = [i for i, o in enumerate(outputs) if o.is_floating_point()]
        passed = _ToNext.apply(self.leader, self.group, *[outputs[i] for i in floats])
        out = list(outputs)
        for i, o in zip(floats, passed):
            out[i] = o
        return tuple(out)


def _share(obj: Any, leader: int, group: Any) -> Any:
    """`obj` on the leader, broadcast to the rest of its TP group."""
    box = [obj]
    dist.broadcast_object_list(box, src=leader, group=group)
    return box[0]


class LeaderStage(PipelineStage):
    """TP rank 0 of a stage of degree > 1 (NOTE [mixed-degree pipeline]): a PipelineStage of the leaders' group
    that passes the set-up's vote result and received shape records on to its TP group."""

    def __init__(self, *args: Any, leader: int, tp_group: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._leader, self._tp_group = leader, tp_group

    def _warmup_backward_result(self, received_result: torch.Tensor | None = None) -> torch.Tensor:
        result = super()._warmup_backward_result(received_result)
        dist.broadcast(result, src=self._leader, group=self._tp_group)
        return result

    def _recv_meta(self, src_stage: int) -> Any:
        return _share(super()._recv_meta(src_stage), self._leader, self._tp_group)


class FollowerStage(PipelineStage):
    """TP rank j > 0 of a stage of degree > 1 (NOTE [mixed-degree pipeline]): the leader's stage index, count and
    schedule, no point-to-point op; its inputs, output gradients, vote result and shape records come from the
    leader inside the TP group. Its `group` is the leaders' group, which it is not a member of (rank -1): unused."""

    def __init__(self, *args: Any, leader: int, tp_group: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._leader, self._tp_group = leader, tp_group

    def _warmup_forward_vote(self, has_backward: bool, received_acc: torch.Tensor | None = None) -> torch.Tensor:
        return torch.ones(1, dtype=torch.int32, device=self.device)  # the leader votes; the result comes below

    def _warmup_backward_result(self, received_result: torch.Tensor | None = None) -> torch.Tensor:
        result = torch.zeros(1, dtype=torch.int32, device=self.device)
        dist.broadcast(result, src=self._leader, group=self._tp_group)
        return result

    def _recv_meta(self, src_stage: int) -> Any:
        return _share(None, self._leader, self._tp_group)

    def _send_meta(self, meta: Any, dst_stage: int) -> None:
        return None  # the leader sends its own, equal record

    def get_fwd_recv_ops(self, fwd_chunk_id: int) -> list:
        return []

    def get_bwd_recv_ops(self, bwd_chunk_id: int) -> list:
        return []

    def get_fwd_send_ops(self, fwd_chunk_id: int) -> list:
        return []

    def get_bwd_send_ops(self, bwd_chunk_id: int) -> list:
        return []


def mixed_stage(manifest: dict[str, Any], entry: dict[str, Any], groups: dict[str, Any],
                module: torch.nn.Module) -> tuple[torch.nn.Module, type, dict[str, Any]]:
    """For a rank of a plan of mixed degrees (NOTE [mixed-degree pipeline]): its stage module with the boundaries'
    operators, its PipelineStage class and that class's extra keywords (a stage of degree 1: the module, a plain
    PipelineStage, none)."""
    from hetpart.runtime.artifacts import rank_pipeline
    from hetpart.runtime.tp import tp_entry

    stage_tp = tp_entry(manifest, entry)
    if stage_tp is None or stage_tp["group"] is None:
        return module, PipelineStage, {}
    leader, group = stage_tp["ranks"][0], groups[stage_tp["group"]]
    last = len(rank_pipeline(manifest, entry["rank"]).stages) - 1  # of its own pipeline (NOTE [mixed-degree
    # pipelines mesh] in codegen/tp.py)
    wrapped = TPEdges(module, leader, group, entry=entry["stage"] > 0, exit=entry["stage"] < last)
    cls = LeaderStage if entry["tp"]["rank"] == 0 else FollowerStage
    return wrapped, cls, {"leader": leader, "tp_group": group}


__all__ = ["FollowerStage", "LeaderStage", "TPEdges", "mixed_stage"]
