"""Re-planning data-parallel pipelines (issue 21 on issue 19's plans): a batch re-split, or a new plan.

Nothing here imports torch. `hetpart/replan.py` calls `replan_pipelines` for an old plan of several
pipelines (plan.json's `pipelines`), with the from-scratch `--parallel data` plan of the new cluster.

NOTE [re-plan pipelines]
Losing one device of one pipeline should not re-cut the others. The candidates, each costed as
the `--parallel data` planner costs a plan (`cost_pipelines`: the slowest pipeline's
sum + (m - 1) x bottleneck, plus the gradient sync; NOTE [pipelines plan]) and checked by
`pipelines_violations`:
a. the batch re-split: every old pipeline whose devices all survive keeps its stages exactly
   (its cuts and devices); each pipeline that lost a device is dropped (its survivors become
   free), repaired on its survivors, or repaired on its survivors and the free devices (new ones,
   ones no old stage ran on): the single-pipeline re-plan (NOTE [lexicographic re-plan], so its
   bytes stay low) on that sub-problem, its old devices' order given; at most one repair per
   candidate takes the free devices. What is left free may form one further pipeline (`solve`'s
   plan of them, the iteration objective, as `fixed_pipelines` solves a group). The solves share the
   re-plan's one deadline, NOTE [re-plan deadline] (each repair once had `--time-limit` of its own:
   with a quarter of it, llama-70b's repair on 48 GPUs found no plan and a whole new pipeline was
   taken, 642 GiB moved; the deadline's shares are measured against that). The microbatches are
   then split over the resulting pipelines by the planner's own split (`_split` of pipeline_outer.py:
   the least pipeline time at which they run the batch, each between its fewest microbatches, its
   stages under 1F1B, and the most its memory holds, `_most_microbatches`). When the from-scratch
   search finds no plan in time, these alone are chosen from; when none runs the batch either,
   `hetpart replan` says so (exit 2).
b. the from-scratch plan, as is and relabeled (NOTE [large re-plan]'s `relabel_stages` over every
   pipeline's stages at once: machines of one kind swap whole, devices of one type and capacity
   inside a machine swap, so every stage keeps its costs and the sync its links; re-costed anyway).
c. striped pipelines (NOTE [striped pipelines]), as is and relabeled: over every machine left, then
   over every machine left but one kind's (llama-7b on hetero-64 less l-0: the 30 s reference is 8
   stripes of six machines, l-1 idle, and the re-plan's stripes of all seven run 1.0299x its step),
   the most stripes each. A stripe
   plan that loses a machine loses every pipeline (each has a stage on it), and a 2 s search has no
   time left for its stripe probe (a stripe's limit is 1 s), so its re-splits repair all of them and
   its from-scratch plan is no stripe (llama-7b: 1.04-1.07 of the 30 s reference's step). Stripe 0
   is taken from NOTE [shape memo] when the memo holds its machine kinds and f, else solved by the
   search's planner (on layers, 0.1-0.3 s of CPU on llama-7b) and recorded there, so an event that
   returns to a cluster seen before solves none; within what is left of the limit, at least STRIPES_SHARE of
   it (NOTE [re-plan deadline]), the first whatever the time.
d. bytes-first stripes: a new stripe layout re-cuts every replica (llama-7b, spot21d: 226-371 GiB an event where
   the machine set or the stripe count changed), and the solve cuts for time alone. So stripe 0 is re-cut by
   NOTE [re-plan DP] (`bytes_first_plan`) on its group's devices, each used or skipped: first in the order the
   holdings give (`_held_stripe_order`: machines by the first node whose weight they hold; devices of machines
   holding none are the DP's free ones) under the fastest solved stripe's caps, then in each solved stripe's own
   order relabeled (`_relabeled_in`: c's relabeling taken back into the group; the one moving the fewest bytes
   first) under its caps; after every set's solves (which so keep their time), and after each set's first
   order only within the same share of the deadline. The holdings are
   those of every device (a machine holding a weight on any device counts: every stripe's stage there reads it
   there), and the caps are on the step (sum + (m - 1) x bottleneck, `pipeline_time_ns`), as --slack is on the
   iteration: floor(step x (1 + s x slack)) for s in _STRIPE_CAPS (s = 1 lands near the limit, s = 1/2 leaves
   room; s = 0, -1/2 and -1 found nothing more on llama-7b's trace, and each candidate costs CPU). The DP caps
   a bottleneck, so each step cap takes up to _STEP_TRIES DPs (`_step_capped`): the first at floor(bottleneck x
   (1 + s x slack)), each next at the bottleneck where the last plan's stages (their sum as is) meet the step
   cap; a plan with one stage more carries more fill, so its bottleneck must be lower (llama-7b, "lose l-0": 7
   stages at 10 GiB but 1.039x the step, which a bottleneck cap let through and the choice then dropped; on
   the chain of the tests, 3 stages at a bottleneck past the first cap within the step cap). Each plan found
   is costed on the problem and kept when within its step cap, moving fewer bytes (stripe 0's, between then within)
   than every solved one, and valid; per cap the fewest bytes (each candidate stripes, checks and recosts f
   pipelines: 0.1-0.3 s on llama-7b); striped and relabeled as in c ("..., bytes-first"). A relabeling that
   changes no device (c and d) is not a second candidate. The DP counts stripe 0
   only (the others' stages lie on the same machines: the same bytes between machines; within may differ); the
   choice recounts every stripe exactly (`pipelines_moves`).
e. bytes-first stripes in orders near the held one: where the machine set or the stage count changes (llama-7b
   on hetero-64, bytes21c: "lose a-1", "add a-0", 286-321 GiB), no plan in the held order is within the step
   cap (a balanced stripe is tight: its stages all sit near the bottleneck, and which device types take the
   first and last stage, which pay one boundary less, decides whether it fits), and a solved stripe's order
   shares little with where the state lies. So d's DPs also run, on the devices of the machines the fastest
   solved stripe uses (its stage count: the others idle), in the held order (the machines it lacks last) and in
   each order one machine's block move or one swap of two away from it (`_near_orders`, the fewest places moved
   first), under the fastest's caps; with the positions where a plan in that order on every device would cut
   (`_greedy_cuts`: each stage ending as late as it may, and starting as early as it may, hints only) among
   the DP's. (An order was once skipped where the forward pass found no end for a stage; review19 showed
   plans within the cap in such orders -- a late end can leave the next stage no node, and a boundary's time is
   not monotone in where it lies -- so every order runs its DPs.) These run for _NEAR_S at most, and
   only within the re-plan's deadline (NOTE [re-plan deadline]: the user's --time-limit; the first whatever the
   time, as d's first; each order a few DPs, about 5 ms each on llama-7b's stripe of 6-8 devices); kept as d's
   are.
The choice is NOTE [lexicographic re-plan]'s, over these candidates: B the least iteration of any
(the from-scratch plan's unless a re-split is faster), then among those within floor(B x (1 +
slack)) the fewest bytes between machines, then within, then the least iteration. Bytes are
replan.stage_moves over every pipeline's stages, a replicated weight taken from any surviving
holder. Nothing here is claimed optimal: the choice is the best of the candidates listed (the
tests check it against every candidate by brute force, and the split against every split); the
lower bound printed is the from-scratch plan's, which bounds every plan of the new cluster.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hetpart.errors import HetpartError
from hetpart.partitioner.costs import slot_capacity_bytes
from hetpart.partitioner.evaluate import bottleneck_ns, evaluate
from hetpart.partitioner.pipeline_outer import Candidate, _split
from hetpart.partitioner.pipelines import (
    Pipeline, PipelinesPlan, cost_pipelines, pipeline_time_ns, pipelines_violations, sub_problem,
)
from hetpart.partitioner.problem import Plan, Problem, StageCost
from hetpart.partitioner.problem import stage_weights
from hetpart.partitioner.replan import Moves, relabel_stages, stage_moves
from hetpart.partitioner.replan_idle import replan_idle_reasons
from hetpart.partitioner.replan_deadline import MIN_SOLVE_S, REPAIR_SOLVE_SHARE, Deadline, expected_solves
from hetpart.partitioner.verify import plan_violations

PIPELINES_RECORD_VERSION = 1
_UNIFORM_ABOVE = 3  # broken pipelines: above, every one gets the same option (3^B combinations otherwise)


@dataclass(frozen=True)
class OldPipeline:
    """One pipeline of the old plan, as ir/pipelines.json records it."""

    devices: tuple[str, ...]  # the devices it was planned on
    stage_of: dict[str, int]
    device_of_stage: tuple[str, ...]
    microbatches: int


def pipelines_to_json(pp: PipelinesPlan) -> dict:
    """ir/pipelines.json: each pipeline's devices, cuts (node -> stage) and stage devices."""
    return {"version": PIPELINES_RECORD_VERSION, "pipelines": [
        {"devices": list(p.devices), "microbatches": p.microbatches, "device_of_stage": list(p.plan.slot_of_stage),
         "stage_of": dict(sorted(p.plan.stage_of.items()))} for p in pp.pipelines]}


def pipelines_from_json(data: dict, where: str) -> list[OldPipeline]:
    """The old pipelines `pipelines_to_json` wrote (`where`: the file, for errors)."""
    if not isinstance(data, dict) or data.get("version") != PIPELINES_RECORD_VERSION:
        raise HetpartError(f"{where}: version {data.get('version') if isinstance(data, dict) else None}, this "
                           f"hetpart reads {PIPELINES_RECORD_VERSION}: partition again to re-plan")
    return [OldPipeline(tuple(p["devices"]), {v: int(k) for v, k in p["stage_of"].items()},
                        tuple(p["device_of_stage"]), int(p["microbatches"])) for p in data["pipelines"]]


def _stages_in_a_row(problem: Problem, pp: PipelinesPlan) -> tuple[dict[int, set[str]], list[str], list[int]]:
    """Every pipeline's stages in rank order as one row: each stage's weights, its device, and where each
    pipeline's stages start in the row (for replan.stage_moves and relabel_stages)."""
    held, devices, first = {}, [], []
    for p in pp.pipelines:
        first.append(len(devices))
        for k, ws in sorted(stage_weights(problem, p.plan.stage_of).items()):
            held[len(devices) + k] = ws
        devices += list(p.plan.slot_of_stage)
    return held, devices, first


def pipelines_moves(problem: Problem, pp: PipelinesPlan, holders: Mapping[str, tuple[str, ...]]) -> Moves:
    """What `pp` moves (replan.stage_moves over every pipeline's stages, in rank order)."""
    held, devices, _ = _stages_in_a_row(problem, pp)
    return stage_moves(problem, held, devices, holders)


@dataclass
class PipelinesCandidate:
    """One candidate of NOTE [re-plan pipelines]: its plan, how each pipeline came to be, its moves."""

    name: str
    plan: PipelinesPlan
    how: list[str]  # per pipeline: "kept", "repaired", "new", "from scratch"
    moves: Moves
    checked: bool = False  # `pipelines_violations` found none already (the choice does not check it again)

    def key(self) -> tuple[int, int, int]:
        """NOTE [lexicographic re-plan]'s order once within the limit."""
        return self.moves.between_bytes, self.moves.within_bytes, self.plan.iteration_ns


@dataclass
class PipelinesReplan:
    """The chosen candidate, the from-scratch one, every candidate, and the limit."""

    chosen: PipelinesCandidate
    scratch: PipelinesCandidate | None  # None: the from-scratch search found no plan in time
    candidates: list[PipelinesCandidate]
    slack: float
    best_ns: int  # the least iteration of any candidate
    limit_ns: int  # floor(best_ns x (1 + slack))
    seconds: float = 0.0
    left_out: list[str] = field(default_factory=list)  # NOTE [re-plan deadline]: candidates its deadline cut
    devices_idle: dict[str, str] = field(default_factory=dict)  # NOTE [re-plan idle reasons], of `chosen`

    def to_json(self) -> dict:
        """plan.json's `replan` record."""
        us = lambda ns: round(ns / 1000, 3)  # noqa: E731

        def one(c: PipelinesCandidate) -> dict:
            return {"name": c.name, "iteration_us": us(c.plan.iteration_ns),
                    "pipelines": [{"devices": list(p.plan.slot_of_stage), "microbatches": p.microbatches, "how": h}
                                  for p, h in zip(c.plan.pipelines, c.how)], **c.moves.to_json()}

        return {"kind": "pipelines", "slack": self.slack, "best_iteration_us": us(self.best_ns),
                "iteration_limit_us": us(self.limit_ns), "chosen": one(self.chosen),
                "from_scratch": None if self.scratch is None else {
                    **one(self.scratch), "lower_bound_us": us(self.scratch.plan.lower_bound_ns),
                    "gap": round(self.scratch.plan.gap, 6)},
                "candidates": [{"name": c.name, "iteration_us": us(c.plan.iteration_ns),
                                "between_machines_bytes": c.moves.between_bytes,
                                "within_machines_bytes": c.moves.within_bytes} for c in self.candidates],
                "replan_s": round(self.seconds, 3), "left_out": list(self.left_out)}


def pipeline_plan(problem: Problem, devices: Sequence[str], stage_of: dict[str, int], device_of_stage: Sequence[str],
                  microbatches: int, costs: Sequence[Sequence[int]] | None = None) -> Plan:
    """A pipeline's plan of `stage_of` on `device_of_stage`, costed by `evaluate` on its sub-problem; or, given
    `costs` (per stage: compute_ns, comm_in_ns, comm_out_ns, memory_bytes), with the costs `evaluate` gave it
    before (NOTE [shape memo]: the same problem, devices of the same types, capacities and links, the same stash)."""
    if costs is None:
        stages = evaluate(sub_problem(problem, devices, microbatches), stage_of, list(device_of_stage))
    else:
        nodes: list[list[str]] = [[] for _ in device_of_stage]
        for v in problem.graph.nodes:  # in graph order, as `evaluate` lists them
            nodes[stage_of[v]].append(v)
        slots = [problem.slot(d) for d in device_of_stage]
        stages = [StageCost(k, s.devices[0], s.type, nodes[k], c[0], c[1], c[2], c[3], slot_capacity_bytes(problem, s),
                            slot=s.name, devices=s.devices) for k, (s, c) in enumerate(zip(slots, costs))]
    plan = Plan(stage_of=dict(stage_of), slot_of_stage=list(device_of_stage), stages=stages,
                bottleneck_ns=bottleneck_ns(stages), lower_bound_ns=0, solver_status="FEASIBLE", solve_seconds=0.0,
                objective="iteration", microbatches=microbatches)
    plan.objective_ns = pipeline_time_ns(plan, microbatches)
    return plan


def _most_microbatches(problem: Problem, part: tuple, lo: int, total: int) -> int:
    """The most microbatches (lo..total) whose stash `part`'s stages hold (memory grows with them); 0: not even lo.
    Under 1F1B a stage stashes min(S - k, m) microbatches, the same for every m >= lo = S: one check."""
    def fits(m: int) -> bool:
        return not plan_violations(sub_problem(problem, part[0], m), pipeline_plan(problem, *part, m))

    if not fits(lo):
        return 0
    if problem.training is None or problem.training.schedule == "1f1b":
        return total
    a, b = lo, total
    while a < b:
        mid = (a + b + 1) // 2
        a, b = (mid, b) if fits(mid) else (a, mid - 1)
    return a


def resplit(problem: Problem, parts: Sequence[tuple], microbatches: int,
            cache: dict | None = None) -> tuple[PipelinesPlan, list[int]] | None:
    """NOTE [re-plan pipelines]: `parts` ((devices, stage_of, device_of_stage) each) fed the batch by the planner's
    split; the plan (pipelines given no microbatch left out) and the indices of `parts` kept; None: they cannot.
    `cache` keeps each part's costs between calls (the same part objects)."""
    one_f1b = problem.training is not None and problem.training.schedule == "1f1b"
    cache = {} if cache is None else cache
    cands = []
    for devices, stage_of, dos in parts:
        key = (tuple(devices), tuple(dos), id(stage_of))
        if key not in cache:
            plan = pipeline_plan(problem, devices, stage_of, dos, 1)
            lo = len(dos) if one_f1b else 1
            hi = _most_microbatches(problem, (devices, stage_of, dos), lo, microbatches) if lo <= microbatches else 0
            cache[key] = (Candidate(None, tuple(devices), plan, microbatches, lo, max(hi, lo),
                                    sum(s.time_ns for s in plan.stages), plan.bottleneck_ns), hi, stage_of)
        cands.append(cache[key][0])
    usable = [i for i, (devices, stage_of, dos) in enumerate(parts)
              if cache[(tuple(devices), tuple(dos), id(stage_of))][1] > 0]
    if not usable:
        return None
    got = _split(cands, usable, microbatches)
    if got is None:
        return None
    pipes, kept = [], []
    for i, m in zip(usable, got[1]):
        if m:
            devices, stage_of, dos = parts[i]
            plan = pipeline_plan(problem, devices, stage_of, dos, m)
            pipes.append(Pipeline(len(pipes), tuple(dos), m, plan, pipeline_time_ns(plan, m)))
            kept.append(i)
    return cost_pipelines(problem, pipes, solver_status="FEASIBLE",
                          bound_note="re-planned (NOTE [re-plan pipelines]): a batch re-split"), kept


def relabeled(problem: Problem, pp: PipelinesPlan, holders: Mapping[str, tuple[str, ...]]) -> list[tuple]:
    """`pp`'s stages relabeled for the fewest bytes (NOTE [re-plan pipelines] b): its parts, in order."""
    held, devices, first = _stages_in_a_row(problem, pp)
    new = relabel_stages(problem, held, devices, holders)
    return [(tuple(new[f:f + len(p.plan.slot_of_stage)]), p.plan.stage_of, tuple(new[f:f + len(p.plan.slot_of_stage)]))
            for f, p in zip(first, pp.pipelines)]


def relabeled_plan(problem: Problem, pp: PipelinesPlan, holders: Mapping[str, tuple[str, ...]],
                   what: str, parts: list[tuple] | None = None) -> PipelinesPlan:
    """`pp` relabeled (`relabeled`, or `parts`: its answer made already): the same stages on other devices of their
    kinds, the same shares, re-costed."""
    pipes = []
    for p, (devices, stage_of, dos) in zip(pp.pipelines, parts or relabeled(problem, pp, holders)):
        plan = pipeline_plan(problem, devices, stage_of, dos, p.microbatches)
        pipes.append(Pipeline(p.index, tuple(dos), p.microbatches, plan, pipeline_time_ns(plan, p.microbatches)))
    return cost_pipelines(problem, pipes, solver_status="FEASIBLE",
                          bound_note=f"re-planned (NOTE [re-plan pipelines]): {what}")


@dataclass
class _Solves:
    """The sub-solves of one re-plan, each once (keyed by what it solves)."""

    problem: Problem
    holders: Mapping[str, tuple[str, ...]]
    slack: float
    deadline: Deadline  # NOTE [re-plan deadline]: every solve's time comes from it
    seed: int
    expected: int  # the solves expected (`expected_solves`): each gets the time left divided by those to come
    started: int = 0
    done: dict = field(default_factory=dict)

    def _budget(self) -> float | None:
        """This solve's seconds: the time left over the solves still expected; None: too little left to start."""
        left = self.deadline.left()
        self.started += 1
        return None if left < MIN_SOLVE_S else left / max(1, self.expected - self.started + 1)

    def repair(self, old: OldPipeline, devices: tuple[str, ...]) -> tuple | None:
        """The single-pipeline re-plan of `old` on `devices` (NOTE [lexicographic re-plan]); None: no plan."""
        from hetpart.partitioner.replan import lexicographic_plan
        from hetpart.partitioner.solve import solve

        key = ("repair", old.device_of_stage, devices)
        if key not in self.done and (budget := self._budget()) is None:
            self.done[key] = None  # no time left to start it
        if key not in self.done:
            sub = sub_problem(self.problem, devices, old.microbatches)
            part = Deadline(budget)  # the solve, then its lexicographic step in what is left of this part
            try:
                scratch = solve(sub, time_limit_s=part.of_total(REPAIR_SOLVE_SHARE), seed=self.seed)
                got = lexicographic_plan(sub, scratch, self.holders, slack=self.slack, seed=self.seed,
                                         old_devices=[d for d in old.device_of_stage if d in devices], deadline=part)
                self.done[key] = (devices, got.plan.stage_of, tuple(got.plan.slot_of_stage))
            except HetpartError:
                self.done[key] = None
        return self.done[key]

    def new(self, devices: tuple[str, ...], microbatches: int) -> tuple | None:
        """`solve`'s plan of one pipeline on `devices` for `microbatches` (the iteration objective); None: none."""
        from hetpart.partitioner.solve import solve

        key = ("new", devices)
        if key not in self.done and (budget := self._budget()) is None:
            self.done[key] = None  # no time left to start it
        if key not in self.done:
            try:
                plan = solve(sub_problem(self.problem, devices, microbatches), time_limit_s=budget,
                             seed=self.seed, objective="iteration", microbatches=microbatches)
                self.done[key] = (devices, plan.stage_of, tuple(plan.slot_of_stage))
            except HetpartError:
                self.done[key] = None
        return self.done[key]


def resplit_candidates(problem: Problem, old: Sequence[OldPipeline], holders: Mapping[str, tuple[str, ...]],
                       microbatches: int, *, slack: float, deadline: Deadline, seed: int) -> list[PipelinesCandidate]:
    """NOTE [re-plan pipelines] a: every combination of dropping or repairing the broken pipelines, with or without
    a further pipeline on what is left free, re-split; every solve within `deadline` (NOTE [re-plan deadline])."""
    alive = [d.name for d in problem.devices]
    kept = [p for p in old if all(d in alive for d in p.device_of_stage)]
    broken = [p for p in old if p not in kept]
    busy = {d for p in old for d in p.device_of_stage}
    free = tuple(d for d in alive if d not in busy)
    options = ("drop", "repair", "repair+free")
    combos = (list(itertools.product(options, repeat=len(broken))) if len(broken) <= _UNIFORM_ABOVE
              else [(o,) * len(broken) for o in options])
    combos = [c for c in combos if c.count("repair+free") <= 1]
    repairable = sum(1 for p in broken if any(d in alive for d in p.device_of_stage))
    solves = _Solves(problem, holders, slack, deadline, seed, expected_solves(repairable, bool(free)))
    out, seen, costs = [], set(), {}
    index = {id(p): i for i, p in enumerate(old)}
    for combo in combos:
        parts = [(p.device_of_stage, p.stage_of, p.device_of_stage) for p in kept]
        how, names = ["kept"] * len(kept), [f"kept {index[id(p)]}" for p in kept]
        pool, ok = list(free), True
        for p, option in zip(broken, combo):
            survivors = tuple(d for d in p.device_of_stage if d in alive)
            if option == "drop" or not survivors:
                pool += survivors
                continue
            got = solves.repair(p, survivors + (tuple(pool) if option == "repair+free" else ()))
            if got is None:
                ok = False
                break
            parts.append(got)
            how.append("repaired")
            names.append(f"{index[id(p)]} repaired ({len(got[2])} stages)")
            pool = [d for d in pool if d not in got[2]] + [d for d in survivors if d not in got[2]]
        if not ok:
            continue
        pool_t = tuple(d for d in alive if d in set(pool))
        share = max(1, microbatches * len(pool_t) // max(1, len(alive)))
        extra = [None] + ([solves.new(pool_t, share)] if pool_t else [])
        for more in extra:
            tried = parts + ([more] if more is not None else [])
            if not tried or repr(tried) in seen:
                continue
            seen.add(repr(tried))
            labels = how + (["new"] if more is not None else [])
            shown = names + ([f"new ({len(more[2])} stages)"] if more is not None else [])
            got = resplit(problem, tried, microbatches, costs)
            if got is None:
                continue
            pp, used = got
            out.append(PipelinesCandidate("re-split: " + ", ".join(shown[i] for i in used), pp,
                                          [labels[i] for i in used], pipelines_moves(problem, pp, holders)))
    return out


def replan_pipelines(problem: Problem, old: Sequence[OldPipeline], holders: Mapping[str, tuple[str, ...]],
                     scratch: PipelinesPlan | None, *, slack: float = 0.02, time_limit_s: float = 30.0,
                     seed: int = 0, deadline: Deadline | None = None,
                     resplits: list[PipelinesCandidate] | None = None) -> PipelinesReplan:
    """NOTE [re-plan pipelines]: the candidates, and the lexicographic choice among them; `scratch` None: the
    from-scratch plan found none in time (the re-splits only). `resplits`: `resplit_candidates`' answer made
    already; else made here, every solve within `deadline`, or one of `time_limit_s` from now (NOTE [re-plan
    deadline])."""
    if not 0 <= slack < 1:
        raise HetpartError(f"--slack must be a fraction in [0, 1), e.g. 0.02 for 2% (got {slack})")
    start = time.perf_counter()
    microbatches = sum(p.microbatches for p in old)
    cands, first = [], None
    if scratch is not None:
        first = PipelinesCandidate("from scratch", scratch, ["from scratch"] * len(scratch.pipelines),
                                   pipelines_moves(problem, scratch, holders))
        cands.append(first)
        pp = relabeled_plan(problem, scratch, holders, "the from-scratch plan relabeled")
        cands.append(PipelinesCandidate("from scratch, relabeled", pp, ["from scratch"] * len(pp.pipelines),
                                        pipelines_moves(problem, pp, holders)))
    cands += resplits if resplits is not None else resplit_candidates(
        problem, old, holders, microbatches, slack=slack, deadline=deadline or Deadline(time_limit_s), seed=seed)
    # Each candidate is checked by `pipelines_violations` (the planner's checker) before it may be chosen: in
    # the order of the choice, the first valid one (the from-scratch plan is valid: its search checked it).
    valid: dict[int, bool] = {}

    def ok(c: PipelinesCandidate) -> bool:
        if id(c) not in valid:
            valid[id(c)] = c is first or c.checked or not pipelines_violations(problem, c.plan, microbatches)
        return valid[id(c)]

    while True:
        if not cands:
            raise HetpartError("the from-scratch plan found none, and no batch re-split of the old pipelines runs "
                               "the batch on the devices left: raise --time-limit, or add devices")
        best = min(c.plan.iteration_ns for c in cands)
        limit = math.floor(best * (1 + slack))
        chosen = min((c for c in cands if c.plan.iteration_ns <= limit), key=PipelinesCandidate.key)
        if ok(chosen) and ok(min(cands, key=lambda c: c.plan.iteration_ns)):
            break
        cands = [c for c in cands if ok(c)]  # rare: check them all, keep the valid ones
    out = PipelinesReplan(chosen, first, cands, slack, best, limit, time.perf_counter() - start)
    out.devices_idle = replan_idle_reasons(problem, out)
    return out
