"""Where a tensor-parallel rank's forward goes: its ops and each collective, split into skew and the collective.

Torch-free: `run --measure` puts the summary in measured.json (`timeline.collectives`),
`benchmarks/tp_stage_measured.py` prints it.

NOTE [collective skew]
The ranks of a TP group call the same collectives in the same order (NOTE [tensor-parallel stages] in
codegen/tp.py), so the k-th collective of a step on one rank of a group is the k-th on every other
(matched by step, group and k). On the shared clock (NOTE [action timeline] in runtime/timeline.py)
a collective has each rank's entry and exit. A rank's time inside it splits into
- skew: the latest entry of the group minus its own entry, where positive: it waited for a peer
  that was behind (the peer was still computing the ops before it);
- the collective itself: its exit minus the latest entry, what gloo (or NCCL) takes once every rank
  is in, which is what `costs.allreduce_ns` prices.
A forward's wall time is then its ops (thread CPU time outside the collectives, plus any wait for a
core), the collectives themselves and the skew. The skew is not noise to average away: whichever
rank is behind at each collective sets the pace, so a group of ranks whose ops' times vary runs at
the pace of the slower one segment by segment (the sum of the maxima, not the maximum of the sums).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Collective:
    """One rank's side of one collective call (NOTE [collective skew])."""

    rank: int
    step: int
    index: int  # k-th collective of this group in this rank's step
    op: str
    bytes: int
    entry_ns: int
    exit_ns: int
    latest_entry_ns: int  # the group's latest entry (its slowest rank's)
    cpu_ns: int  # this rank's thread CPU time inside the call

    @property
    def skew_us(self) -> float:
        return max(0, self.latest_entry_ns - self.entry_ns) / 1e3

    @property
    def itself_us(self) -> float:
        return max(0, self.exit_ns - max(self.latest_entry_ns, self.entry_ns)) / 1e3


@dataclass(frozen=True)
class RankCollectives:
    """A rank's forwards, per microbatch (medians over the measured steps' forwards)."""

    rank: int
    forward_us: float  # wall
    forward_cpu_us: float  # thread CPU, collectives' calls included
    collectives_per_forward: float
    ops_wall_us: float  # forward wall outside the collectives
    ops_cpu_us: float  # thread CPU outside the collectives
    skew_us: float  # summed over the forward's collectives
    itself_us: float
    itself_median_us: float  # one collective, all of this rank's

    def to_json(self) -> dict[str, Any]:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in self.__dict__.items()}


def match_collectives(ranks: list[list[dict]]) -> list[Collective]:
    """Every rank's collectives with the group's latest entry (NOTE [collective skew]); a call some rank of its
    group did not record, or recorded as another op or size (the ranks' sequences disagree there), is left out."""
    calls: dict[tuple, dict[int, dict]] = {}
    for rank, events in enumerate(ranks):
        seen: dict[tuple, int] = {}
        for e in events:
            if e.get("kind") != "collective":
                continue
            group = tuple(e["group"])
            k = seen.get((e["step"], group), 0)
            seen[(e["step"], group)] = k + 1
            calls.setdefault((e["step"], group, k), {})[rank] = e
    out = []
    for (step, group, k), by_rank in calls.items():
        if set(by_rank) != set(group) or len({(e["op"], e["bytes"]) for e in by_rank.values()}) > 1:
            continue
        latest = max(e["t0_ns"] for e in by_rank.values())
        out += [Collective(r, step, k, e["op"], e["bytes"], e["t0_ns"], e["t1_ns"], latest, e["cpu_ns"])
                for r, e in by_rank.items()]
    return out


def rank_collectives(ranks: list[list[dict]], skip_first: bool = True) -> list[RankCollectives]:
    """Per rank that ran collectives inside its forwards: a forward's ops, skew and collectives (NOTE [collective
    skew]), medians over its forwards (the first step left out with `skip_first`)."""
    matched: dict[tuple[int, int], list[Collective]] = {}
    for c in match_collectives(ranks):
        matched.setdefault((c.rank, c.step), []).append(c)
    out = []
    for rank, events in enumerate(ranks):
        per_forward = []
        for f in (e for e in events if e.get("kind") == "F" and not (skip_first and e["step"] == 0)):
            inside = [c for c in matched.get((rank, f["step"]), []) if f["t0_ns"] <= c.entry_ns <= f["t1_ns"]]
            if not inside:
                continue
            wall = f["t1_ns"] - f["t0_ns"]
            in_colls = sum(c.exit_ns - c.entry_ns for c in inside)
            cpu_colls = sum(c.cpu_ns for c in inside)
            per_forward.append((wall / 1e3, f["cpu_ns"] / 1e3, len(inside), (wall - in_colls) / 1e3,
                                (f["cpu_ns"] - cpu_colls) / 1e3, sum(c.skew_us for c in inside),
                                sum(c.itself_us for c in inside), [c.itself_us for c in inside]))
        if not per_forward:
            continue
        med = [statistics.median(x[i] for x in per_forward) for i in range(7)]
        out.append(RankCollectives(rank, *med, statistics.median(u for x in per_forward for u in x[7])))
    return out


__all__ = ["Collective", "RankCollectives", "match_collectives", "rank_collectives"]
