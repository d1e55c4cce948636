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

Kind = Literal["fwd", "bwd", "bwd_input", "bwd_weight", "send"]
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
             backward_ns: list[int] | None = None, grad_transfer_ns: list[int] | None = None,
             ranks: int | None = None) -> Timeline:
    """Play `schedule` for `microbatches` microbatches; see NOTE [schedule simulation].

    compute_ns[k]: forward time of stage k; transfer_ns[k]: time of boundary k
    (between stages k and k+1). With `backward_ns` the step is a training step
    (forward and backward of every microbatch); gradients cross boundary k in
    `grad_transfer_ns[k]` (default: `transfer_ns[k]`, same bytes as the activations).
    Without it, only forwards run (inference): GPipe and 1F1B are then the same.
    A virtual-stage schedule (NOTE [virtual-stage schedules]) runs the stages on `ranks` ranks
    (default: one each), its backwards split by NOTE [backward split].
    """
    num_stages = len(compute_ns)
    if schedule in VIRTUAL_SCHEDULES:
        from hetpart.partitioner.costs import backward_split_ns  # (costs.py imports this module)

        split = None if backward_ns is None else [backward_split_ns(b) for b in backward_ns]
        return simulate_ranks(compute_ns, transfer_ns, microbatches, schedule, ranks or num_stages,
                              None if split is None else [i for i, _ in split],
                              None if split is None else [w for _, w in split], grad_transfer_ns)
    if schedule not in SCHEDULES:
        raise HetpartError(f"simulate: unknown schedule '{schedule}' (known: {', '.join(SCHEDULES + VIRTUAL_SCHEDULES)})")
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


# --- Schedules with several stages per rank (virtual stages, issue 23).

# NOTE [virtual-stage schedules]
# Interleaved 1F1B (Narayanan et al. 2021) and interleaved zero bubble (ZB1P, Qi et al. 2024) run
# S = v*D stages on D ranks, stage k on rank k mod D, so each rank holds v non-adjacent stages.
# `rank_orders` gives each rank's compute actions in the order torch.distributed.pipelining's
# `ScheduleInterleaved1F1B` / `ScheduleInterleavedZeroBubble` run them (their `pipeline_order`
# with the idle slots dropped: tests compare the two for small D, v, M): with R = max(1, M // D)
# rounds of P = M / R microbatches, rank r runs W_r = min((v-1)P + f(D-1-r), vM) warm-up forwards
# (f = 2 for 1F1B, 1 for zero bubble), then alternates one forward and one backward, then drains
# the backwards; forward number i runs local stage (i // P) mod v, backward number i local stage
# v-1-((i-W_r) // P) mod v. Zero bubble splits each backward into the input gradient "I" (sent
# to the previous stage at once) and the weight gradient "W" (local, deferred): after its first
# r steady-state backwards, rank r runs one W after each I, in the I's order, and the rest last.
# `simulate_ranks` plays those orders with each RANK as the resource (a rank does one thing at a
# time) and, as in NOTE [stage time], transfers not overlapped with compute: a value sent from
# rank a to rank b costs its transfer time on a right after the op that made it (the send) and on
# b before the op that needs it, once both are there (the receive, which waits for the sender's
# op). Sends are not a rendezvous here (torch posts them asynchronously in these schedules), so
# the per-rank orders, which respect every dependency, cannot deadlock. Two stages of one rank
# (never adjacent when D >= 2) pass nothing to each other.
VIRTUAL_SCHEDULES: tuple[str, ...] = ("interleaved-1f1b", "interleaved-zb")


@dataclass(frozen=True)
class Action:
    """One compute action of a rank: F (forward), B (full backward), I (input grad) or W (weight grad)."""

    stage: int
    kind: Literal["F", "B", "I", "W"]
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"  # torch's `_Action` spelling: "2F0"


def _rank_order(schedule: str, rank: int, ranks: int, local: int, m: int) -> list[Action]:
    rounds = max(1, m // ranks)
    per_round = m // rounds
    zb = schedule == "interleaved-zb"
    warmup = min((local - 1) * per_round + (1 if zb else 2) * (ranks - 1 - rank), m * local)
    total = m * local
    fwd_mb: dict[int, int] = {}
    bwd_mb: dict[int, int] = {}
    w_mb: dict[int, int] = {}
    bwd_stages: list[int] = []
    out: list[Action] = []

    def take(counter: dict[int, int], stage: int) -> int:
        counter[stage] = counter.get(stage, 0) + 1
        return counter[stage] - 1

    def fwd_stage(i: int) -> int:
        return (i // per_round) % local * ranks + rank

    def bwd_stage(i: int) -> int:
        return (local - 1 - ((i - warmup) // per_round) % local) * ranks + rank

    def weight() -> None:
        s = bwd_stages[sum(w_mb.values())]
        out.append(Action(s, "W", take(w_mb, s)))

    for i in range(warmup + total):  # warm-up forwards, steady state (one F, one B), cool-down backwards
        if i < total:
            s = fwd_stage(i)
            out.append(Action(s, "F", take(fwd_mb, s)))
        if i >= warmup:
            s = bwd_stage(i)
            out.append(Action(s, "I" if zb else "B", take(bwd_mb, s)))
            bwd_stages.append(s)
            if zb and i - warmup >= rank:
                weight()
    while zb and sum(w_mb.values()) < len(bwd_stages):
        weight()
    return out


def rank_orders(schedule: str, ranks: int, virtual_stages: int, microbatches: int,
                training: bool = True) -> list[list[Action]]:
    """Each rank's compute actions under `schedule` (NOTE [virtual-stage schedules]); inference: forwards only.

        >>> [" ".join(map(str, o)) for o in rank_orders("interleaved-1f1b", 2, 2, 2)]
        ['0F0 0F1 2F0 2F1 2B0 2B1 0B0 0B1', '1F0 1F1 3F0 3B0 3F1 3B1 1B0 1B1']
    """
    if schedule not in VIRTUAL_SCHEDULES:
        raise HetpartError(f"simulate: unknown schedule '{schedule}' (known: {', '.join(VIRTUAL_SCHEDULES)})")
    if ranks < 1 or virtual_stages < 1 or microbatches < 1:
        raise HetpartError(f"simulate: ranks, virtual stages and microbatches must be >= 1, got "
                           f"{ranks}, {virtual_stages}, {microbatches}")
    if microbatches % max(1, microbatches // ranks):
        raise HetpartError(f"{schedule} needs microbatches that are a multiple of their rounds "
                           f"(max(1, M // ranks) = {max(1, microbatches // ranks)}), got {microbatches}")
    orders = [_rank_order(schedule, r, ranks, virtual_stages, microbatches) for r in range(ranks)]
    if not training:
        orders = [[a for a in o if a.kind == "F"] for o in orders]
    return orders


def stage_stash(schedule: str, ranks: int, virtual_stages: int, microbatches: int) -> list[int]:
    """Per stage, the most microbatches whose activations it holds at once: forwards whose backward (zero
    bubble: weight gradient) has not run yet, along its rank's order (NOTE [virtual-stage schedules]).

        >>> stage_stash("interleaved-1f1b", 2, 2, 4)
        [4, 3, 2, 1]
    """
    held = [0] * (ranks * virtual_stages)
    most = [0] * (ranks * virtual_stages)
    for order in rank_orders(schedule, ranks, virtual_stages, microbatches):
        for a in order:
            held[a.stage] += 1 if a.kind == "F" else -1 if a.kind in "BW" else 0
            most[a.stage] = max(most[a.stage], held[a.stage])
    return most


def simulate_ranks(forward_ns: list[int], transfer_ns: list[int], microbatches: int, schedule: str, ranks: int,
                   input_grad_ns: list[int] | None = None, weight_grad_ns: list[int] | None = None,
                   grad_transfer_ns: list[int] | None = None) -> Timeline:
    """Play a virtual-stage `schedule` of S = len(forward_ns) stages on `ranks` ranks (stage k on rank k mod
    ranks) for `microbatches`; see NOTE [virtual-stage schedules]. Training when `input_grad_ns` is given:
    a full backward ("B", 1F1B) costs input_grad_ns + weight_grad_ns, zero bubble runs them apart.
    Events' `stage` is the stage; `peer` of a send is the receiving stage. Inference: forwards only.

        >>> simulate_ranks([10] * 4, [0] * 3, 2, "interleaved-1f1b", 2).step_ns  # rank 0: 0F0 0F1 2F0 2F1
        50
    """
    num_stages = len(forward_ns)
    if ranks < 1 or num_stages % ranks:
        raise HetpartError(f"simulate: {num_stages} stages do not split into {ranks} ranks of equal count")
    _check("forward_ns", forward_ns, num_stages)
    _check("transfer_ns", transfer_ns, max(0, num_stages - 1))
    training = input_grad_ns is not None
    wgrad = weight_grad_ns if weight_grad_ns is not None else [0] * num_stages
    grad_ns = grad_transfer_ns if grad_transfer_ns is not None else transfer_ns
    if input_grad_ns is not None:
        _check("input_grad_ns", input_grad_ns, num_stages)
        _check("weight_grad_ns", wgrad, num_stages)
    _check("grad_transfer_ns", grad_ns, max(0, num_stages - 1))
    orders = rank_orders(schedule, ranks, num_stages // ranks, microbatches, training)
    cost = {"F": forward_ns, "I": input_grad_ns, "W": wgrad}
    free = [0] * ranks
    done: dict[tuple[int, str, int], int] = {}  # (stage, F|G, microbatch) -> when its output was sent
    events: list[Event] = []
    heads = [0] * ranks
    while any(h < len(o) for h, o in zip(heads, orders)):
        progressed = False
        for r in range(ranks):
            while heads[r] < len(orders[r]):
                a = orders[r][heads[r]]
                grad = a.kind in "BI"
                src = (a.stage - 1, "F", a.microbatch) if a.kind == "F" else (a.stage + 1, "G", a.microbatch)
                needs = a.kind in "FBI" and 0 <= src[0] < num_stages
                if a.kind in "BI" and src[0] == num_stages:  # the last stage's backward needs its own forward
                    needs, src = True, (a.stage, "F", a.microbatch)
                if needs and src not in done:
                    break  # wait for the producer (another rank's, or this rank's later position: never)
                start = free[r]
                if needs and src[0] != a.stage and src[0] % ranks != r:  # a receive from another rank
                    xfer = grad_ns[a.stage] if grad else transfer_ns[a.stage - 1]
                    start = max(start, done[src])
                    events.append(Event(src[0], a.microbatch, "send", start, start + xfer, a.stage))
                    start += xfer
                if a.kind == "B":
                    length = input_grad_ns[a.stage] + wgrad[a.stage]  # type: ignore[index]
                else:
                    length = cost[a.kind][a.stage]  # type: ignore[index]
                kind = {"F": "fwd", "B": "bwd", "I": "bwd_input", "W": "bwd_weight"}[a.kind]
                events.append(Event(a.stage, a.microbatch, kind, start, start + length))  # type: ignore[arg-type]
                end = start + length
                out_stage = a.stage + 1 if a.kind == "F" else a.stage - 1
                if a.kind in "FBI" and 0 <= out_stage < num_stages and out_stage % ranks != r:
                    end += transfer_ns[a.stage] if a.kind == "F" else grad_ns[out_stage]  # the send
                if a.kind != "W":
                    done[(a.stage, "F" if a.kind == "F" else "G", a.microbatch)] = start + length
                free[r] = end
                heads[r] += 1
                progressed = True
        if not progressed:
            raise AssertionError(f"simulate_ranks: {schedule} deadlocked at {[o[h:h + 1] for h, o in zip(heads, orders)]}")
    events.sort(key=lambda e: (e.start_ns, e.stage, e.end_ns, e.kind, e.microbatch))
    return Timeline(schedule, num_stages, microbatches, events, max(free, default=0))
