"""A pipeline schedule, played out in time: which stage does what, when.

Given per-stage compute times, per-boundary transfer times and M microbatches,
`simulate` plays GPipe or 1F1B (forward only for inference; forward and
backward for training) under the cost model of NOTE [stage time] in
`costs.py` and returns every event and the step time. The report draws its
Gantt chart from this; tests check the schedules against closed forms.

    >>> t = simulate([10, 10, 10], [0, 0], microbatches=4)
    >>> t.step_ns  # GPipe forward, equal stages, no comm: (M + S - 1) * t
    60
    >>> [(e.start_ns, e.end_ns) for e in t.events if e.stage == 1 and e.kind == "fwd"][:2]
    [(10, 20), (20, 30)]

Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hetpart.errors import HetpartError

# NOTE [schedule simulation]
# Each stage is one resource that does one thing at a time: a forward or
# backward of one microbatch, or a transfer with a neighbour. As in NOTE
# [stage time], a transfer over boundary k occupies BOTH stage k and stage k+1
# for its whole duration (sends and receives are not overlapped with compute),
# so in steady state a stage spends compute + comm_in + comm_out per microbatch.
# A transfer is a rendezvous: it starts when both stages have reached it in
# their own order (even a transfer of 0 ns synchronises them).
#
# A schedule is, per stage, the order of its compute operations: GPipe (all
# forwards, then all backwards) or 1F1B (stage k of S runs min(S-1-k, M)
# warm-up forwards, then alternates one forward and one backward, then drains
# the backwards). Each compute op is preceded by the receive of its input and
# followed by the send of its output, so between two compute ops a stage holds
# up to two transfers (the send of the previous output, the receive of the
# next input). Those two may happen in either order: the peer may need our
# send before it can produce what we receive (GPipe's last forward before the
# first gradient), or the other way round (1F1B's steady state). Fixing one
# order deadlocks one of the schedules, so the simulator plays events in time
# order: the next operation is the one that can start earliest among compute
# ops at the head of their stage and transfers both of whose stages have
# reached them (ties: gradients first, then lower stage, then microbatch).
# This is deterministic, and tests check every S <= 6, M <= 8 for deadlocks.

Kind = Literal["fwd", "bwd", "send"]
Schedule = Literal["gpipe", "1f1b"]
SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b")


@dataclass(frozen=True)
class Event:
    """One operation of the timeline.

    For `kind == "send"`, `stage` sends to `peer` (stage +1 for activations,
    -1 for gradients) and the event occupies both stages.
    """

    stage: int
    microbatch: int
    kind: Kind
    start_ns: int
    end_ns: int
    peer: int | None = None

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(frozen=True)
class Timeline:
    schedule: str
    num_stages: int
    microbatches: int
    events: list[Event]
    step_ns: int  # from the first op's start to the last op's end

    def busy_ns(self, stage: int) -> int:
        """Time `stage` spends computing or transferring."""
        return sum(e.duration_ns for e in self.events if stage in (e.stage, e.peer))

    @property
    def bubble_fraction(self) -> float:
        """Share of stage-time spent idle during the step (0 = no bubble)."""
        if self.step_ns == 0 or self.num_stages == 0:
            return 0.0
        busy = sum(self.busy_ns(k) for k in range(self.num_stages))
        return 1.0 - busy / (self.step_ns * self.num_stages)


@dataclass(frozen=True)
class _Op:
    kind: Kind
    microbatch: int
    stage: int  # the computing stage, or the sender of a transfer
    peer: int | None = None  # receiver of a transfer
    grad: bool = False  # a transfer carrying gradients (backward direction)


def _compute_order(schedule: str, stage: int, num_stages: int, m: int, training: bool) -> list[_Op]:
    fwd = [_Op("fwd", i, stage) for i in range(m)]
    if not training:
        return fwd
    bwd = [_Op("bwd", i, stage) for i in range(m)]
    if schedule == "gpipe":
        return fwd + bwd
    warmup = min(num_stages - 1 - stage, m)
    order = fwd[:warmup]
    for i in range(m - warmup):
        order += [fwd[warmup + i], bwd[i]]
    return order + bwd[m - warmup:]


def _with_transfers(compute: list[_Op], stage: int, num_stages: int) -> list[list[_Op]]:
    """Steps of one stage: [compute op] or the transfers of a gap, in any order; see NOTE [schedule simulation]."""

    def recv(op: _Op) -> _Op | None:
        if op.kind == "fwd" and stage > 0:
            return _Op("send", op.microbatch, stage - 1, stage)
        if op.kind == "bwd" and stage < num_stages - 1:
            return _Op("send", op.microbatch, stage + 1, stage, grad=True)
        return None

    def send(op: _Op) -> _Op | None:
        if op.kind == "fwd" and stage < num_stages - 1:
            return _Op("send", op.microbatch, stage, stage + 1)
        if op.kind == "bwd" and stage > 0:
            return _Op("send", op.microbatch, stage, stage - 1, grad=True)
        return None

    steps: list[list[_Op]] = []
    pending_send: _Op | None = None
    for op in compute:
        gap = [t for t in (pending_send, recv(op)) if t is not None]
        if gap:
            steps.append(gap)
        steps.append([op])
        pending_send = send(op)
    if pending_send is not None:
        steps.append([pending_send])
    return steps


def _check(name: str, values: list[int], length: int) -> None:
    if len(values) != length:
        raise HetpartError(f"simulate: {name} has {len(values)} entries, expected {length}")
    if any(not isinstance(v, int) or v < 0 for v in values):
        raise HetpartError(f"simulate: {name} must be non-negative integers (ns), got {values}")


def simulate(compute_ns: list[int], transfer_ns: list[int], microbatches: int, schedule: str = "gpipe",
             backward_ns: list[int] | None = None, grad_transfer_ns: list[int] | None = None) -> Timeline:
    """Play `schedule` for `microbatches` microbatches; see NOTE [schedule simulation].

    compute_ns[k]: forward time of stage k; transfer_ns[k]: time of boundary k
    (between stages k and k+1). With `backward_ns` the step is a training step
    (forward and backward of every microbatch); gradients cross boundary k in
    `grad_transfer_ns[k]` (default: `transfer_ns[k]`, same bytes as the activations).
    Without it, only forwards run (inference): GPipe and 1F1B are then the same.
    """
    num_stages = len(compute_ns)
    if schedule not in SCHEDULES:
        raise HetpartError(f"simulate: unknown schedule '{schedule}' (known: {', '.join(SCHEDULES)})")
    if microbatches < 1:
        raise HetpartError(f"simulate: microbatches must be >= 1, got {microbatches}")
    _check("compute_ns", compute_ns, num_stages)
    _check("transfer_ns", transfer_ns, max(0, num_stages - 1))
    training = backward_ns is not None
    if backward_ns is not None:
        _check("backward_ns", backward_ns, num_stages)
    grad_ns = grad_transfer_ns if grad_transfer_ns is not None else transfer_ns
    _check("grad_transfer_ns", grad_ns, max(0, num_stages - 1))

    def duration(op: _Op) -> int:
        if op.kind == "fwd":
            return compute_ns[op.stage]
        if op.kind == "bwd":
            return backward_ns[op.stage]  # type: ignore[index]
        boundary = min(op.stage, op.peer)  # type: ignore[type-var]
        return grad_ns[boundary] if op.grad else transfer_ns[boundary]

    steps = [_with_transfers(_compute_order(schedule, k, num_stages, microbatches, training), k, num_stages)
             for k in range(num_stages)]
    position = [0] * num_stages  # index of each stage's current step
    current = [list(s[0]) if s else [] for s in steps]  # what is left of it
    free_ns = [0] * num_stages
    events: list[Event] = []
    while any(current):
        best: tuple | None = None
        for k in range(num_stages):
            for op in current[k]:
                if op.kind == "send" and (op.stage != k or op not in current[op.peer]):  # type: ignore[index]
                    continue  # seen from the sender's side only, once both sides have reached it
                stages = [k] if op.kind != "send" else [k, op.peer]
                key = (max(free_ns[s] for s in stages), not op.grad, k, op.microbatch, op.kind)
                if best is None or key < best[0]:
                    best = (key, op, stages)
        if best is None:
            stuck = {k: current[k] for k in range(num_stages) if current[k]}
            raise AssertionError(f"simulate: schedule {schedule} deadlocked at {stuck}")  # a bug, not user input
        (start, *_), op, stages = best
        end = start + duration(op)
        for s in stages:
            free_ns[s] = end
            current[s].remove(op)
            if not current[s]:
                position[s] += 1
                current[s] = list(steps[s][position[s]]) if position[s] < len(steps[s]) else []
        events.append(Event(op.stage, op.microbatch, op.kind, start, end, op.peer))
    events.sort(key=lambda e: (e.start_ns, e.stage, e.end_ns, e.kind, e.microbatch))
    step = max((e.end_ns for e in events), default=0)
    return Timeline(schedule, num_stages, microbatches, events, step)
