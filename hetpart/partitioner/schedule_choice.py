"""Choosing the pipeline schedule and the microbatch count: `partition --schedule auto` / `--microbatches auto`.

The candidates are (schedule, virtual stages V, microbatches M) triples; each gets a plan that respects its own
memory (the stash follows the schedule and M, the costs follow the microbatch size) and the step the simulator
plays for it (NOTE [schedule choice]). The caller lowers one Problem per M (`problem_for`) and says how a
finalist is solved (`solve_fn`). Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from hetpart.errors import HetpartError
from hetpart.partitioner.baselines import simulated_timeline
from hetpart.partitioner.dp import dp_hint
from hetpart.partitioner.infeasible import NoPlan
from hetpart.partitioner.pipelines import one_f_one_b_stage_cap
from hetpart.partitioner.problem import Plan, Problem
from hetpart.partitioner.simulate import VIRTUAL_SCHEDULES
from hetpart.partitioner.solve import solve
from hetpart.partitioner.virtual import VirtualPlan, plan_virtual

AUTO = "auto"
TRAINING_SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b", *VIRTUAL_SCHEDULES)
AUTO_VIRTUAL_STAGES: tuple[int, ...] = (2, 3, 4)  # V tried for an interleaved schedule under --schedule auto
FINALISTS = 3  # candidates fully solved (NOTE [schedule choice])

# NOTE [schedule choice]
# `--schedule auto` (training) tries GPipe, 1F1B and the interleaved schedules with V = 2, 3, 4 stages per
# device (NOTE [virtual stages plan]; V*D stages must find places to cut); `--microbatches auto` tries every
# M that divides --batch-size, up to --max-microbatches. Rules per candidate, those `run` enforces:
# 1F1B needs M >= 2 and runs at most M stages (NOTE [1F1B stages]: on D > M devices it is planned on at most
# M); an interleaved schedule needs M a multiple of its rounds max(1, M // D) and weights traced (not --meta).
# Inference runs forwards only, in one order, so only M is chosen there.
# Each M has its own Problem, lowered from the cost passes re-run at microbatch size B/M on the one exported
# graph (never re-traced); a candidate's problem is it with the candidate's schedule (the stash, NOTE
# [training memory]). Solving every candidate fully would take (#schedules x #M) times --time-limit, so:
# 1. quick: each candidate gets the plan a fast engine gives, under its own memory -- the exact DP over
#    contiguous segments of the node order (`dp_hint`) for GPipe and 1F1B, the virtual-stage DP
#    (`plan_virtual`, which is also what `partition --schedule interleaved-*` writes) for the interleaved
#    ones -- and its step simulated (`simulated_timeline`: the schedule played over the plan's stages);
#    where the DP finds none (it proves nothing: NOTE [candidate cuts] in dp.py), `solve` for the rest of
#    the candidate's share, so "no plan fits" is said only when proven.
#    The DPs share one --time-limit (wall clock: on a machine too busy to finish a DP in its share, it
#    keeps its best plan so far, or the candidate says it found none in time);
# 2. finalists: the FINALISTS candidates of least quick step are solved as `partition --schedule S
#    --microbatches M` solves them (GPipe/1F1B: `solve`, the --time-limit shared among them; an interleaved
#    one's quick plan is already its plan), and their steps simulated again;
# 3. the choice: the finalist of least simulated step (ties: the earlier candidate, GPipe first, fewer V and M).
# What this proves: the chosen plan's gap and certificate are those of ITS (schedule, M) problem (the solver
# minimises the bottleneck, not the step); among candidates the choice is the best of those solved, and a
# candidate left out at step 1 might have solved to a shorter step than its quick plan's.


@dataclass(frozen=True)
class Candidate:
    """One (schedule, V, M) to plan for: V is 1 for GPipe and 1F1B."""

    schedule: str
    microbatches: int
    virtual_stages: int = 1

    @property
    def virtual(self) -> bool:
        return self.schedule in VIRTUAL_SCHEDULES


@dataclass
class Evaluated:
    """A candidate, its plan (None: none fits, `note` says why) and the plan's simulated step."""

    candidate: Candidate
    microbatch_size: int
    step_ns: int | None = None
    bubble: float | None = None
    memory_bytes: int | None = None  # the tightest device's (highest memory / capacity)
    capacity_bytes: int | None = None
    device: str | None = None  # which device that is
    plan_from: str = ""  # "quick" (step 1) or "solved" (step 2) of NOTE [schedule choice]
    solver_status: str | None = None
    note: str = ""
    timed_out: bool = False  # no plan because its share of the time ran out (not proven: more time may find one)
    plan: Plan | None = field(default=None, repr=False)
    vplan: VirtualPlan | None = field(default=None, repr=False)
    problem: Problem | None = field(default=None, repr=False)

    @property
    def fits(self) -> bool:
        return self.step_ns is not None

    def to_json(self, chosen: bool) -> dict:
        c = self.candidate
        return {"schedule": c.schedule, "virtual_stages": c.virtual_stages if c.virtual else None,
                "microbatches": c.microbatches, "microbatch_size": self.microbatch_size,
                "step_us": None if self.step_ns is None else round(self.step_ns / 1000, 3),
                "bubble": None if self.bubble is None else round(self.bubble, 4),
                "memory_bytes": self.memory_bytes, "capacity_bytes": self.capacity_bytes, "device": self.device,
                "fits": self.fits, "plan": self.plan_from or None, "solver_status": self.solver_status,
                "note": self.note, "chosen": chosen}


@dataclass
class ScheduleChoice:
    """Every candidate evaluated, the chosen one, and what was left out (NOTE [schedule choice])."""

    evaluated: list[Evaluated]  # in candidate order
    chosen: Evaluated
    solve_time_limit_s: float  # each GPipe/1F1B finalist's
    left_out: list[str]  # (schedule, M) pairs not tried, and why
    search_s: float = 0.0

    def to_json(self, searched: dict) -> dict:
        c = self.chosen.candidate
        return {"searched": searched, "finalists": FINALISTS, "solve_time_limit_s": round(self.solve_time_limit_s, 3),
                "choice": "best simulated step of the finalists solved (NOTE [schedule choice]); the gap and "
                          "certificate are those of the chosen schedule and microbatch count",
                "chosen": {"schedule": c.schedule, "virtual_stages": c.virtual_stages if c.virtual else None,
                           "microbatches": c.microbatches},
                "candidates": [e.to_json(e is self.chosen) for e in self.evaluated], "left_out": self.left_out}


def microbatch_counts(batch_size: int, max_microbatches: int | None = None) -> list[int]:
    """Every M that divides `batch_size`, up to `max_microbatches`.

        >>> microbatch_counts(12, 6)
        [1, 2, 3, 4, 6]
    """
    top = batch_size if max_microbatches is None else min(batch_size, max_microbatches)
    return [m for m in range(1, top + 1) if batch_size % m == 0]


def candidates(schedules: tuple[str, ...], counts: list[int], virtual_stages: tuple[int, ...],
               devices: int) -> tuple[list[Candidate], list[str]]:
    """The candidates of NOTE [schedule choice]'s rules, in order, and the (schedule, M) left out with why.

        >>> found, out = candidates(("gpipe", "1f1b"), [1, 2], (2,), 4)
        >>> [(c.schedule, c.microbatches) for c in found], out
        ([('gpipe', 1), ('gpipe', 2), ('1f1b', 2)], ['1f1b M=1: 1F1B needs 2 or more microbatches'])
    """
    found: list[Candidate] = []
    left: list[str] = []
    for s in schedules:
        for m in counts:
            if s == "1f1b" and m < 2:
                left.append(f"1f1b M={m}: 1F1B needs 2 or more microbatches")
            elif s in VIRTUAL_SCHEDULES and devices < 2:
                left.append(f"{s} M={m}: virtual stages need 2 or more devices")
            elif s in VIRTUAL_SCHEDULES and m % max(1, m // devices):
                left.append(f"{s} M={m}: not a multiple of its rounds max(1, M // {devices})")
            else:
                found += [Candidate(s, m, v) for v in (virtual_stages if s in VIRTUAL_SCHEDULES else (1,))]
    return found, left


def schedule_problem(problem: Problem, cand: Candidate) -> Problem:
    """`problem` (lowered at the candidate's microbatch size) planned for the candidate's schedule and M."""
    training = problem.training
    if training is not None:
        training = dataclasses.replace(training, schedule=cand.schedule, microbatches=cand.microbatches)
    out = dataclasses.replace(problem, training=training)
    if (cap := one_f_one_b_stage_cap(problem, cand.schedule, cand.microbatches)) is not None:
        out.max_stages = cap  # as compile_model caps it
    return out


def _measured(ev: Evaluated, problem: Problem, plan: Plan, vplan: VirtualPlan | None) -> Evaluated:
    """`ev` with `plan`'s simulated step, bubble and tightest device."""
    c = ev.candidate
    timeline = simulated_timeline(vplan.problem if vplan else problem, plan, c.microbatches, c.schedule,
                                  ranks=len(vplan.devices) if vplan else None)
    if vplan is not None:
        used = list(zip(vplan.devices, vplan.device_memory_bytes(),
                        (problem.device(d).capacity_bytes for d in vplan.devices)))
    else:
        used = [(s.device, s.memory_bytes, s.capacity_bytes) for s in plan.stages]
    device, mem, cap = max(used, key=lambda u: u[1] / max(1, u[2]))
    return dataclasses.replace(ev, step_ns=timeline.step_ns, bubble=timeline.bubble_fraction, memory_bytes=mem,
                               capacity_bytes=cap, device=device, solver_status=plan.solver_status, plan=plan,
                               vplan=vplan, problem=problem, note="")


def quick(problem: Problem, cand: Candidate, microbatch_size: int, time_limit_s: float) -> Evaluated:
    """Step 1 of NOTE [schedule choice]: the candidate's fast plan and its step, or why none fits."""
    ev = Evaluated(cand, microbatch_size, plan_from="quick", problem=problem)
    try:
        if cand.virtual:
            vplan = plan_virtual(problem, cand.virtual_stages)
            return _measured(ev, problem, vplan.plan, vplan)
        t0 = time.perf_counter()
        plan = dp_hint(problem, time_limit_s=time_limit_s)
    except HetpartError as err:
        return dataclasses.replace(ev, note=str(err))
    if plan is None and time.perf_counter() - t0 >= time_limit_s:
        return dataclasses.replace(ev, note=f"the quick DP found no plan in its {time_limit_s:.3g} s (a larger "
                                            "--time-limit gives it more)", timed_out=True)
    if plan is None:
        # The DP proves nothing: it counts the largest 1F1B stash on every stage and, on large graphs, cuts
        # at candidate positions only. `solve` (CP-SAT) gets the rest of the share: a plan, or a proof.
        try:
            plan = solve(problem, time_limit_s=max(0.05, time_limit_s - (time.perf_counter() - t0)),
                         run_ideal_dp=False, check_certificate=False)
        except NoPlan as err:
            return dataclasses.replace(ev, note=str(err).splitlines()[0].removeprefix("partitioner: "))
        except HetpartError:
            return dataclasses.replace(ev, note=f"no plan found in its {time_limit_s:.3g} s (a larger "
                                                "--time-limit gives it more)", timed_out=True)
    return _measured(ev, problem, plan, None)


def choose_schedule(problem_for: Callable[[int], Problem], batch_size: int, cands: list[Candidate],
                    left_out: list[str], solve_fn: Callable[[Problem, float], Plan], time_limit_s: float,
                    finalists: int = FINALISTS) -> ScheduleChoice:
    """NOTE [schedule choice]: `problem_for(M)` is the problem lowered at microbatch size `batch_size` / M,
    `solve_fn(problem, seconds)` the solve a finalist gets. An error when no candidate has a plan that fits."""
    t0 = time.perf_counter()
    problems: dict[int, Problem] = {}
    evaluated = []
    dp_s = time_limit_s / max(1, sum(not c.virtual for c in cands))  # the quick DPs share one --time-limit
    for c in cands:
        if c.microbatches not in problems:
            problems[c.microbatches] = problem_for(c.microbatches)
        evaluated.append(quick(schedule_problem(problems[c.microbatches], c), c, batch_size // c.microbatches, dp_s))
    fitting = sorted((k for k, e in enumerate(evaluated) if e.fits), key=lambda k: (evaluated[k].step_ns, k))
    if not fitting:
        why = "; ".join(f"{_label(e.candidate)}: {e.note}" for e in evaluated[:4])
        more = "; ..." if len(evaluated) > 4 else ""
        if any(e.timed_out for e in evaluated):  # not proven: memory is not known to be the cause
            raise HetpartError(f"no schedule and microbatch count tried found a plan within --time-limit "
                               f"{time_limit_s:g} s ({why}{more}): raise --time-limit")
        raise HetpartError(f"no schedule and microbatch count tried has a plan that fits in memory ({why}{more}): "
                           "add devices with more memory, or a smaller --batch-size")
    best = fitting[:finalists]
    to_solve = [k for k in best if not evaluated[k].candidate.virtual]
    each_s = time_limit_s / max(1, len(to_solve))
    for k in to_solve:
        e = evaluated[k]
        try:
            plan = solve_fn(e.problem, each_s)
        except HetpartError as err:  # e.g. nothing found in its share of the time: the quick plan stays
            evaluated[k] = dataclasses.replace(e, note=f"the solve failed, its quick plan kept: {err}")
            continue
        evaluated[k] = dataclasses.replace(_measured(e, e.problem, plan, None), plan_from="solved")
    chosen = min(best, key=lambda k: (evaluated[k].step_ns, k))
    return ScheduleChoice(evaluated, evaluated[chosen], each_s, left_out, time.perf_counter() - t0)


def _label(c: Candidate) -> str:
    v = f" V={c.virtual_stages}" if c.virtual else ""
    return f"{c.schedule}{v} M={c.microbatches}"


def check_auto_options(schedule: str, microbatches: int | str, max_microbatches: int | None, batch_size: int | None,
                       mode: str, virtual_stages: int | None, several_pipelines: bool, strategy: str,
                       tensor_parallel: bool) -> None:
    """`--schedule auto`, `--microbatches auto` and `--max-microbatches` against the other options, before any
    trace (NOTE [schedule choice])."""
    auto_s, auto_m = schedule == AUTO, microbatches == AUTO
    if max_microbatches is not None and not auto_m:
        raise HetpartError(f"--max-microbatches {max_microbatches} caps the counts --microbatches auto tries: pass "
                           "--microbatches auto with it, or leave it out")
    if not (auto_s or auto_m):
        return
    flag = " and ".join(f for f, on in (("--schedule auto", auto_s), ("--microbatches auto", auto_m)) if on)
    if auto_s and mode != "training":
        raise HetpartError("--schedule auto chooses among training schedules; inference runs forwards only, in "
                           "GPipe's order: leave --schedule out (--microbatches auto still chooses the microbatch "
                           "count), or pass --mode training")
    if virtual_stages is not None and not auto_s and schedule not in VIRTUAL_SCHEDULES:
        raise HetpartError(f"--virtual-stages {virtual_stages} plans stages for an interleaved schedule: pass "
                           "--schedule auto or an interleaved one with it, or leave it out")
    for on, what in ((several_pipelines, "--pipelines or --parallel data"), (strategy != "optimal",
                     f"--strategy {strategy}"), (tensor_parallel, "--tensor-parallel or --max-tensor-parallel")):
        if on:
            raise HetpartError(f"{flag} plans one pipeline of the optimised kind and is not combined with {what} "
                               f"yet: leave out one of the two")
    if auto_m and batch_size is not None and not auto_s and schedule == "1f1b":
        counts = microbatch_counts(batch_size, max_microbatches)
        if max(counts) < 2:
            cap = f" up to --max-microbatches {max_microbatches}" if max_microbatches is not None else ""
            raise HetpartError(f"--microbatches auto --schedule 1f1b: --batch-size {batch_size} divides into no count "
                               f"of 2 or more microbatches{cap}, and 1F1B needs 2 or more (it runs at most M stages, "
                               "NOTE [1F1B stages]): pass a --batch-size with more divisors (8: 2, 4 or 8 "
                               "microbatches), a larger --max-microbatches, or --schedule gpipe")
