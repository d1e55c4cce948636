"""Where a pipeline's step goes, from the ranks' action timelines (NOTE [action timeline] in runtime/timeline.py).

Torch-free: `run --measure` puts the summary in measured.json, `benchmarks/handoff.py DIR` prints it.

NOTE [hand-off latency]
A hand-off is one tensor sent by rank a (stage s) and received by rank b (stage s +- 1) for one
microbatch. Matched by (step, direction, microbatch, sender, receiver, sender's stage, k-th tensor), it has three
times on the shared clock: the send's post (the sender's forward is done), the recv's post (the
receiver asked for it) and the end of the receiver's wait on it (the data is there). Its latency
is end - max(send post, recv post, start of the receiver's wait): how long the receiver waited once both
sides were ready (gloo's TCP pairs move an unbound buffer only when both have posted, a rendezvous); a
recv posted early and waited on late (interleaved schedules post their recvs ahead) costs only what is
left of the transfer when the receiver gets to it, and the wait's end says nothing of when the data came. `receiver_late_us`
= recv post - send post, where positive, is how long the data sat ready while the receiver did
something else (computed, or waited on another hand-off): a schedule that posts recvs early hides
the latency behind that time, one that posts each recv just before it is needed does not.
A rank's step splits into compute (its forward/backward actions; `module` is the generated code's
own call inside them, the rest pipelining's per-action overhead), recv waits (before the sender
posted: the sender was behind; after: the hand-off's latency), send waits, and the rest (the
schedule's own Python between actions).
The critical path walks back from the last rank's step end: along the rank's own actions while
they are back to back, and through a recv wait to its sender's post, adding the hand-off's latency;
it says what the step is made of (every rank's compute on the path, hand-off latencies, gaps).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

COMPUTE = ("F", "B", "W")


@dataclass
class Handoff:
    """One tensor's hand-off, NOTE [hand-off latency]."""

    step: int
    direction: str  # "fwd" (activations) or "bwd" (gradients)
    mb: int
    src_rank: int
    dst_rank: int
    bytes: int
    send_post_ns: int
    recv_post_ns: int
    recv_end_ns: int
    wait_start_ns: int  # when the receiver began to wait on it (a recv may be posted long before)

    @property
    def latency_us(self) -> float:
        return (self.recv_end_ns - max(self.send_post_ns, self.recv_post_ns, self.wait_start_ns)) / 1e3

    @property
    def receiver_late_us(self) -> float:
        return max(0, self.recv_post_ns - self.send_post_ns) / 1e3


@dataclass
class RankBreakdown:
    """One rank's time per step (medians over the measured steps), in us."""

    rank: int
    step_us: float
    compute_us: float
    module_us: float  # the generated module's own calls inside the forwards
    forward_us: float  # the forward actions (compute less backwards)
    recv_wait_sender_behind_us: float  # waiting before the sender had posted
    recv_wait_latency_us: float  # waiting after it had: the hand-off's latency
    send_wait_us: float
    other_us: float  # step - compute - waits: the schedule's Python between actions, head and tail included
    head_us: float  # step start to its first action (splitting the batch into microbatches)
    tail_us: float  # its last action to the step's end (the last stage: merging the outputs)
    post_us: float  # in the calls that post sends and recvs
    compute_cpu_us: float  # the compute thread's CPU time in compute
    process_cpu_us: float  # the whole process's (gloo's I/O threads too) in compute

    @property
    def overhead_us(self) -> float:
        """Pipelining's own work inside a forward action (detach, requires_grad, caches)."""
        return self.forward_us - self.module_us


@dataclass
class CriticalPath:
    """What the slowest rank's step is made of, walked back (NOTE [hand-off latency]), in us (median step)."""

    compute_us: dict[int, float]  # rank -> its compute on the path
    handoff_us: float  # hand-off latencies on the path
    handoffs: int
    gap_us: float  # the rest: schedule overhead, waits not explained by a matched hand-off
    step_us: float


@dataclass
class HandoffReport:
    ranks: list[RankBreakdown]
    handoffs: list[Handoff] = field(default_factory=list)
    critical_path: CriticalPath | None = None

    def latency_stats_us(self) -> dict[str, dict[str, float]]:
        """Median and p90 hand-off latency and receiver lateness per link and direction ("0->1 fwd")."""
        groups: dict[str, list[Handoff]] = {}
        for h in self.handoffs:
            groups.setdefault(f"{h.src_rank}->{h.dst_rank} {h.direction}", []).append(h)
        return {k: {"n": len(hs), "latency_median_us": round(statistics.median(h.latency_us for h in hs), 1),
                    "latency_p90_us": round(_p90([h.latency_us for h in hs]), 1),
                    "receiver_late_median_us": round(statistics.median(h.receiver_late_us for h in hs), 1),
                    "bytes": hs[0].bytes} for k, hs in sorted(groups.items())}

    def to_json(self) -> dict[str, Any]:
        cp = self.critical_path
        return {"ranks": [{k: round(v, 1) if isinstance(v, float) else v for k, v in vars(r).items()}
                          | {"overhead_us": round(r.overhead_us, 1)} for r in self.ranks],
                "handoff_latency": self.latency_stats_us(),
                "critical_path": None if cp is None else {
                    "step_us": round(cp.step_us, 1), "handoff_us": round(cp.handoff_us, 1), "handoffs": cp.handoffs,
                    "gap_us": round(cp.gap_us, 1), "compute_us": {str(r): round(v, 1) for r, v in cp.compute_us.items()}}}


def _p90(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=10, method="inclusive")[8] if len(xs) > 1 else xs[0]


def _steps(events: list[dict]) -> dict[int, tuple[int, int]]:
    start = {e["step"]: e["t_ns"] for e in events if e["kind"] == "step"}
    end = {e["step"]: e["t_ns"] for e in events if e["kind"] == "step_end"}
    return {s: (start[s], end[s]) for s in start if s in end}


def match_handoffs(ranks: list[list[dict]]) -> list[Handoff]:
    """Every hand-off whose send and recv are both in the timelines (NOTE [hand-off latency])."""
    sends: dict[tuple, int] = {}
    recvs: list[tuple[tuple, dict, int]] = []
    for rank, events in enumerate(ranks):
        seen: dict[tuple, int] = {}
        for e in events:
            for op in e.get("ops", ()):
                if e["kind"] == "post" and op["op"] == "send":
                    base = (e["step"], op["dir"], op["mb"], rank, op["peer"], op["stage"])
                    k = seen[("s", *base)] = seen.get(("s", *base), -1) + 1
                    sends[(*base, k)] = e["t_ns"]
                elif e["kind"] == "wait" and op["op"] == "recv" and e.get("post_ns") is not None:
                    sender_stage = op["stage"] - 1 if op["dir"] == "fwd" else op["stage"] + 1
                    base = (e["step"], op["dir"], op["mb"], op["peer"], rank, sender_stage)
                    k = seen[("r", *base)] = seen.get(("r", *base), -1) + 1
                    recvs.append(((*base, k), op, e["post_ns"], e["t1_ns"], e["t0_ns"]))
    out = []
    for key, op, post_ns, end_ns, wait_ns in recvs:
        if key in sends:
            step, direction, mb, src, dst, _, _ = key
            out.append(Handoff(step, direction, mb, src, dst, op["bytes"], sends[key], post_ns, end_ns, wait_ns))
    return out


def _rank_breakdown(rank: int, events: list[dict], handoffs: dict[tuple, Handoff], keep: set[int]) -> RankBreakdown:
    per_step: dict[int, dict[str, float]] = {}
    for step, (t0, t1) in _steps(events).items():
        if step not in keep:
            continue
        row = dict.fromkeys(("compute", "forward", "module", "behind", "latency", "send", "cpu", "proc", "post"), 0.0)
        row["step"] = (t1 - t0) / 1e3
        # the schedule's actions: not the module's call inside a forward, nor a collective (inside a TP forward, or
        # a gradient sync after the schedule, which stays in the tail as before the timeline recorded it)
        mine = [e for e in events if e["step"] == step and "t0_ns" in e and e["kind"] not in ("module", "collective")]
        row["head"] = (min((e["t0_ns"] for e in mine), default=t1) - t0) / 1e3
        row["tail"] = (t1 - max((e["t1_ns"] for e in mine), default=t1)) / 1e3
        for e in (e for e in events if e["step"] == step):
            if e["kind"] == "post":
                row["post"] += e.get("call_ns", 0) / 1e3
            if e["kind"] in COMPUTE:
                row["compute"] += (e["t1_ns"] - e["t0_ns"]) / 1e3
                row["forward"] += (e["t1_ns"] - e["t0_ns"]) / 1e3 if e["kind"] == "F" else 0.0
                row["cpu"] += e["cpu_ns"] / 1e3
                row["proc"] += e["proc_cpu_ns"] / 1e3
            elif e["kind"] == "module":
                row["module"] += (e["t1_ns"] - e["t0_ns"]) / 1e3
            elif e["kind"] == "wait":
                wait_us = (e["t1_ns"] - e["t0_ns"]) / 1e3
                ops = e.get("ops") or [{"op": "?"}]
                if ops[0]["op"] == "send":
                    row["send"] += wait_us
                    continue
                h = handoffs.get((rank, e["t1_ns"]))
                behind = 0.0 if h is None else max(0.0, (h.send_post_ns - e["t0_ns"]) / 1e3)
                row["behind"] += min(wait_us, behind)
                row["latency"] += wait_us - min(wait_us, behind)
        row["other"] = row["step"] - row["compute"] - row["behind"] - row["latency"] - row["send"]
        per_step[step] = row
    med = {k: statistics.median(r[k] for r in per_step.values()) if per_step else 0.0
           for k in ("step", "compute", "forward", "module", "behind", "latency", "send", "other", "cpu", "proc",
                     "head", "tail", "post")}
    return RankBreakdown(rank, med["step"], med["compute"], med["module"], med["forward"], med["behind"],
                         med["latency"], med["send"], med["other"], med["head"], med["tail"], med["post"], med["cpu"],
                         med["proc"])


def critical_path(ranks: list[list[dict]], handoffs: list[Handoff], step: int) -> CriticalPath:
    """Walk back from the last rank's end of `step` (NOTE [hand-off latency])."""
    by_end = {(h.dst_rank, h.recv_end_ns): h for h in handoffs if h.step == step}
    spans = {r: sorted((e for e in events if e["step"] == step and e["kind"] in (*COMPUTE, "wait")),
                       key=lambda e: e["t1_ns"]) for r, events in enumerate(ranks)}
    rank = len(ranks) - 1
    t0, t = _steps(ranks[rank])[step]
    start = min(_steps(events)[step][0] for events in ranks)
    compute = dict.fromkeys(range(len(ranks)), 0.0)
    handoff_us, count = 0.0, 0
    while t > start:
        before = [e for e in spans[rank] if e["t1_ns"] <= t]
        if not before:
            break
        e = before[-1]
        if e["kind"] in COMPUTE:
            compute[rank] += (e["t1_ns"] - e["t0_ns"]) / 1e3
            t = e["t0_ns"]
            continue
        h = by_end.get((rank, e["t1_ns"]))
        if h is not None and h.send_post_ns > e["t0_ns"]:  # blocked on the sender: the path crosses to it
            handoff_us += h.latency_us
            count += 1
            rank, t = h.src_rank, h.send_post_ns
        else:  # a wait the sender did not cause (latency alone, or a send): stay on this rank
            if h is not None:
                handoff_us += (e["t1_ns"] - e["t0_ns"]) / 1e3
                count += 1
            t = e["t0_ns"]
    end = _steps(ranks[-1])[step][1]
    total = (end - start) / 1e3
    return CriticalPath(compute, handoff_us, count, total - sum(compute.values()) - handoff_us, total)


def analyse(ranks: list[list[dict]], skip_first: bool = True) -> HandoffReport:
    """The breakdown of every rank, the hand-offs and the critical path of the median step (first step left out)."""
    handoffs = match_handoffs(ranks)
    steps = sorted(set.intersection(*(set(_steps(events)) for events in ranks))) if ranks else []
    keep = set(steps[1:] if skip_first and len(steps) > 1 else steps)
    by_end = {(h.dst_rank, h.recv_end_ns): h for h in handoffs}
    breakdown = [_rank_breakdown(r, events, by_end, keep) for r, events in enumerate(ranks)]
    paths = [critical_path(ranks, handoffs, s) for s in sorted(keep)]
    cp = None
    if paths:
        median = sorted(paths, key=lambda p: p.step_us)[len(paths) // 2]
        cp = median
    return HandoffReport(breakdown, [h for h in handoffs if h.step in keep], cp)
