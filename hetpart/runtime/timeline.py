"""A rank's timeline of schedule actions, on the clock all ranks of a machine share (`run --measure`).

NOTE [action timeline]
`hetpart run --measure` records, per rank, every action torch.distributed.pipelining's schedule
takes: each forward / backward (`forward_one_chunk`, `backward_one_chunk`,
`backward_weight_one_chunk`, with the generated module's own call inside it), each send and recv
when it is posted (`_batch_p2p`: the call's start, and its duration, with its peer, microbatch, stage and bytes), and each wait on one
(`_wait_batch_p2p`, per work, start and end). Times are `time.monotonic_ns()`, which on Linux is
one system-wide clock, so the ranks of one machine can be laid side by side: a recv's end matched
with its sender's post is the hand-off latency (runtime/handoff.py reads them). Beside the wall
clock each compute action carries the thread's CPU time (`time.thread_time_ns`) and the process's
(`time.process_time_ns`, which includes gloo's I/O threads). Every collective the rank calls through
torch.distributed (`all_reduce`, `all_gather`: a TP stage's g, f and gathers, NOTE [tensor-parallel
stages] in codegen/tp.py; training's gradient sums) is an event too, with its start, end, thread CPU
time, bytes and group's ranks, so the ranks of a group can be matched call by call (NOTE [collective
skew] in runtime/collectives.py). The hooks patch the pipelining module's globals, torch.distributed's
two collectives and the rank's stage objects for the run's steps only, and cost ~2 us per action.
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Iterator
from typing import Any

import torch.distributed as dist
from torch.distributed.pipelining import schedules as pipelining_schedules


class Timeline:
    """The events of one rank: plain dicts (they go to JSON as they are)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.step = -1
        self._labels: dict[int, dict[str, Any]] = {}  # id(P2POp) -> its microbatch, stage and direction
        self._works: dict[int, dict[str, Any]] = {}  # id(Work) -> the post event it came from
        self._module_t0 = 0

    def add(self, **event: Any) -> dict[str, Any]:
        event["step"] = self.step
        self.events.append(event)
        return event

    def label_ops(self, ops: list, direction: str, op: str, stage: int, mb: int) -> list:
        for p in ops:
            self._labels[id(p)] = {"dir": direction, "op": op, "stage": stage, "mb": mb, "peer": p.peer,
                                   "bytes": p.tensor.numel() * p.tensor.element_size()}
        return ops

    def posted(self, ops: list, works: list, start_ns: int) -> None:
        now = time.monotonic_ns()
        labels = [self._labels.pop(id(p), {"dir": "?", "op": "?", "stage": -1, "mb": -1, "peer": p.peer,
                                          "bytes": 0}) for p in ops]
        # One work per op (gloo, and the homogeneous batches `_batch_p2p` issues one by one); a coalesced
        # batch gives fewer: each of its works stands for all its ops.
        for k, work in enumerate(works):
            mine = [labels[k]] if len(works) == len(labels) else labels
            # the call's time once, on its first work (one call posts every op of the batch)
            # t_ns: when the call began (gloo may move the data inside it: the receiver can have it before the
            # sender's call returns); call_ns: how long the call took
            post = self.add(kind="post", t_ns=start_ns, call_ns=now - start_ns if k == 0 else 0, ops=mine)
            self._works[id(work)] = post

    def waited(self, work: Any, start_ns: int, end_ns: int) -> None:
        post = self._works.pop(id(work), None)
        self.add(kind="wait", t0_ns=start_ns, t1_ns=end_ns, ops=post["ops"] if post else [],
                 post_ns=post["t_ns"] if post else None)


def _collective_hook(timeline: Timeline, name: str, nbytes: Any) -> Any:
    """torch.distributed's `name`, recording each call (NOTE [action timeline]); `nbytes(arguments)`: the bytes of
    its tensors, from the call's arguments by name. An `async_op=True` call's time is its posting only."""
    original = getattr(dist, name)
    signature = inspect.signature(original)
    groups: dict[int, list[int]] = {}

    def timed(*args: Any, **kwargs: Any) -> Any:
        arguments = signature.bind(*args, **kwargs).arguments
        group = arguments.get("group")
        key = id(group)
        if key not in groups:
            # global ranks, as measured.json's timelines are indexed
            groups[key] = dist.get_process_group_ranks(group if group is not None else dist.group.WORLD)
        t0, cpu0 = time.monotonic_ns(), time.thread_time_ns()
        try:
            return original(*args, **kwargs)
        finally:
            timeline.add(kind="collective", op=name, t0_ns=t0, t1_ns=time.monotonic_ns(),
                         cpu_ns=time.thread_time_ns() - cpu0, bytes=nbytes(arguments), group=groups[key])

    return original, timed


def _compute_hook(timeline: Timeline, stage: Any, name: str, kind: str) -> None:
    method = getattr(stage, name)

    def timed(chunk: int, *args: Any, **kwargs: Any) -> Any:
        t0, cpu0, proc0 = time.monotonic_ns(), time.thread_time_ns(), time.process_time_ns()
        try:
            return method(chunk, *args, **kwargs)
        finally:
            timeline.add(kind=kind, stage=stage.stage_index, mb=chunk, t0_ns=t0, t1_ns=time.monotonic_ns(),
                         cpu_ns=time.thread_time_ns() - cpu0, proc_cpu_ns=time.process_time_ns() - proc0)

    setattr(stage, name, timed)


def _ops_hook(timeline: Timeline, stage: Any, name: str, direction: str, op: str) -> None:
    method = getattr(stage, name)

    def labelled(chunk: int, *args: Any, **kwargs: Any) -> list:
        return timeline.label_ops(method(chunk, *args, **kwargs), direction, op, stage.stage_index, chunk)

    setattr(stage, name, labelled)


def _module_hook(timeline: Timeline, stage: Any) -> tuple[Any, Any]:
    """The generated module's own call inside a forward: what is left of `F` is pipelining's overhead."""
    module = stage.submod

    def pre(_m: Any, _args: Any) -> None:
        timeline._module_t0 = time.monotonic_ns()

    def post(_m: Any, _args: Any, _out: Any) -> None:
        timeline.add(kind="module", stage=stage.stage_index, t0_ns=timeline._module_t0, t1_ns=time.monotonic_ns())

    return module.register_forward_pre_hook(pre), module.register_forward_hook(post)


def schedule_stages(schedule: Any) -> list[Any]:
    """The PipelineStages a pipelining schedule runs (one, or a rank's several)."""
    return list(getattr(schedule, "_stages", None) or [schedule._stage])


@contextlib.contextmanager
def recording(stages: list[Any]) -> Iterator[Timeline]:
    """Record the actions of `stages` (this rank's PipelineStages) while the block runs (NOTE [action timeline])."""
    timeline = Timeline()
    original_batch, original_wait = pipelining_schedules._batch_p2p, pipelining_schedules._wait_batch_p2p

    def batch_p2p(p2p_ops: list[dist.P2POp], desc: str | None = None) -> list[dist.Work]:
        t0 = time.monotonic_ns()
        works = original_batch(p2p_ops, desc=desc)
        timeline.posted(p2p_ops, works, t0)
        return works

    def wait_batch_p2p(work: list[dist.Work]) -> None:
        for w in work:
            t0 = time.monotonic_ns()
            w.wait()
            timeline.waited(w, t0, time.monotonic_ns())

    handles = []
    saved = [(s, dict(s.__dict__)) for s in stages]
    for s in stages:
        _compute_hook(timeline, s, "forward_one_chunk", "F")
        _compute_hook(timeline, s, "backward_one_chunk", "B")
        _compute_hook(timeline, s, "backward_weight_one_chunk", "W")
        _ops_hook(timeline, s, "get_fwd_recv_ops", "fwd", "recv")
        _ops_hook(timeline, s, "get_fwd_send_ops", "fwd", "send")
        _ops_hook(timeline, s, "get_bwd_recv_ops", "bwd", "recv")
        _ops_hook(timeline, s, "get_bwd_send_ops", "bwd", "send")
        handles += _module_hook(timeline, s)
    pipelining_schedules._batch_p2p, pipelining_schedules._wait_batch_p2p = batch_p2p, wait_batch_p2p
    size = lambda t: t.numel() * t.element_size()  # noqa: E731
    collectives = {"all_reduce": _collective_hook(timeline, "all_reduce", lambda a: size(a["tensor"])),
                   "all_gather": _collective_hook(timeline, "all_gather",
                                                  lambda a: size(a["tensor"]) * len(a["tensor_list"]))}
    for name, (_, timed) in collectives.items():
        setattr(dist, name, timed)
    try:
        yield timeline
    finally:
        pipelining_schedules._batch_p2p, pipelining_schedules._wait_batch_p2p = original_batch, original_wait
        for name, (original, _) in collectives.items():
            setattr(dist, name, original)
        for h in handles:
            h.remove()
        for s, before in saved:
            for name in ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk", "get_fwd_recv_ops",
                         "get_fwd_send_ops", "get_bwd_recv_ops", "get_bwd_send_ops"):
                if name not in before:
                    s.__dict__.pop(name, None)
