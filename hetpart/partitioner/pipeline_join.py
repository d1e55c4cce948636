"""The join probe of the pipelines search (NOTE [join probe]): idle machines given to the answer's
pipelines, one kind at a time, the batch split again, kept when the step drops. Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from hetpart.partitioner.pipeline_outer import Candidate, OuterAnswer, _split, candidate, realize
from hetpart.partitioner.pipeline_shape import ShapeSolve
from hetpart.partitioner.pipelines import PipelinesPlan, _devices_of, cost_pipelines
from hetpart.partitioner.problem import Problem

# NOTE [join probe]
# The outer program (NOTE [outer program]) mixes the shapes the search solved, and the search
# ranks shapes by memory and rate and stops at its share of the limit, so the answer's shape with
# one more machine of an idle kind may never have been solved; and a machine too slow for a
# pipeline of its own may still help as a stage of a fast one (a last stage off the bottleneck).
# After the outer program and the refinement (NOTE [op-level refinement]), in what is left of the
# time limit, the probe takes each whole-machine candidate the answer runs and each machine kind
# with an idle machine, and gives one such machine to each of the candidate's copies (as many
# copies as there are idle machines of the kind):
# - the joined shape (its count vector plus one machine of the kind) is the search's own solved
#   candidate when it has one, else solved now by the same planner (`_solve_shape`, the search's
#   cache of shapes extended with it), for the microbatches each copy runs;
# - the batch is split again over every pipeline for the least pipeline time (`_split`, lo/hi of
#   each candidate kept), the pipelines realized on real machines (`realize`) and costed by
#   `cost_pipelines`: the true step, gradient sync included, by the formulas every plan is costed by.
# The try with the lowest step is taken when it is below the plan's, and the probe starts again
# from it (one idle machine fewer) until no try helps, no machine is idle or the limit is reached.
# The last round's tries are made against the plan kept: NOTE [idle reasons] quotes them (llama-70b
# on hetero-64: "adding one l4-24g machine to pipeline 0 gives 9,628 ms (+54.1%)"; a joined plan
# that runs on no more machines of the kind than the plan "adds nothing" (machines of a kind are interchangeable:
# it may run on the added one and leave another out); a split that gives a joined pipeline no microbatches -- its
# fewest take longer than the others need for the whole batch -- quotes no step: the plan it costs is not a
# join, and "gives X" would price a plan without the machine, as the plan fuzz found). The bound is untouched (it covers
# every plan); the gap and status are computed from the plan kept. Stats: join_tries (joins
# costed), join_solves (shapes solved for them), join_taken, join_seconds, join_finished (1 when
# the last round tried every join before the limit).


@dataclass
class JoinTry:
    """One join of NOTE [join probe]: a machine of `kind` given to `copies` pipelines of candidate `base`."""

    kind: int  # the machine kind joined
    base: int  # the candidate (index in the search's candidates) whose pipelines get the machine
    pipelines: tuple[int, ...]  # those pipelines' indices in the plan tried against
    step_ns: int | None  # the joined plan's step (`cost_pipelines`), None when there is none
    why: str = ""  # why there is none (its shape fits no plan in memory, or the batch does not split)
    left_out: bool = False  # the joined shape's plan runs no stage on the added machine

    @property
    def copies(self) -> int:
        return len(self.pipelines)


@dataclass
class JoinPlanner:
    """Where the probe gets a joined shape's candidate: the search's own (its cache of solved shapes), else one
    solved now by the search's planner within the search's time for one shape (NOTE [join probe])."""

    devices: Callable[[object], tuple[str, ...]]  # a shape's canonical devices (pipeline_search.shape_devices)
    solve: Callable[[tuple[str, ...], int, float], ShapeSolve]  # devices, microbatches, seconds per device order
    limit_s: Callable[[int], float]  # the search's seconds for one device order of a shape of so many devices
    orders: int  # device orders each solve runs (NOTE [stash order]): what is left is shared among them
    no_plan: dict = field(default_factory=dict)  # shapes with no plan, not for time: why (NOTE [shape misses])
    # The seconds a solve of so many devices (every order) is expected to take, from the search's own solves: a
    # joined shape expected past `end` is not begun (its DP's fixed work overran the probe by 8.6 s on llama-70b
    # x hetero-64 under load; docs/benchmarks.md, "search19").
    expect_s: Callable[[int], float] = lambda n: 0.0
    solved: list = field(default_factory=list)  # the shapes solved here

    def candidate(self, problem: Problem, cands: list[Candidate], shape, m: int, microbatches: int,
                  end: float) -> tuple[Candidate | None, bool, str]:
        """`shape`'s candidate for pipelines of about `m` microbatches, whether it was solved now, and why none."""
        own = [c for c in cands if c.shape == shape]
        if own:
            return min(own, key=lambda c: c.sum_ns + (max(m, c.lo) - 1) * c.bottleneck_ns), False, ""
        if shape in self.no_plan:
            return None, False, self.no_plan[shape]
        devs = self.devices(shape)
        sched = problem.training.schedule if problem.training is not None else None
        m_ref = min(microbatches, max(m, len(devs))) if sched == "1f1b" else microbatches  # as the search does
        left = max(0.0, end - time.perf_counter())
        if self.expect_s(len(devs)) > left:  # a timed-out miss: not remembered, as NOTE [shape misses] says
            return None, False, (f"not solved: a shape of {len(devs)} devices takes about "
                                 f"{self.expect_s(len(devs)):.2g} s, {left:.2g} s were left")
        limit_s = min(left / self.orders, self.limit_s(len(devs)))
        self.solved.append(shape)
        solved = self.solve(devs, m_ref, limit_s)
        if solved.plan is None and sched == "gpipe" and m < microbatches and time.perf_counter() + limit_s < end:
            # GPipe: its share's stash may fit where the batch's did not
            m_ref, solved = m, self.solve(devs, m, limit_s)
        plan = solved.plan
        got = candidate(problem, shape, devs, plan, m_ref, microbatches)
        if got is not None:
            return got, True, ""
        if plan is not None:
            return None, True, (f"its plan's {len(plan.stages)} stages need as many microbatches under 1F1B, more than "
                                f"the batch's {microbatches}")
        if not solved.timed_out:  # NOTE [shape misses]: a timed-out shape is solved again when time allows
            self.no_plan[shape] = solved.why
        return None, True, solved.why


@dataclass
class JoinResult:
    """What the probe kept and the last round's tries, made against `plan`."""

    answer: OuterAnswer
    plan: PipelinesPlan
    tries: list[JoinTry] = field(default_factory=list)
    untried: set[int] = field(default_factory=set)  # kinds with idle machines the limit left untried (last round)
    solved: list = field(default_factory=list)  # the joined shapes solved by the probe (not the search's own)
    stats: dict[str, float] = field(default_factory=dict)


def free_machines(kinds, cands: list[Candidate], answer: OuterAnswer) -> list[int]:
    """Machines of each kind the answer's pipelines leave idle (whole-machine pipelines and piece patterns)."""
    free = [len(k.machines) for k in kinds]
    for i, n in enumerate(answer.copies):
        if n and cands[i].piece_kind < 0:
            free = [f - n * m for f, m in zip(free, cands[i].shape.machines)]  # type: ignore[attr-defined]
    for j, used in answer.patterns.items():
        free[j] -= sum(machines for _, machines in used)
    return free


def _indices(cands: list[Candidate], answer: OuterAnswer) -> dict[int, tuple[int, ...]]:
    """Whole-machine candidate -> its pipelines' indices in `realize`'s order (whole machines first)."""
    out, at = {}, 0
    for i, c in enumerate(cands):
        n = answer.copies[i] if i < len(answer.copies) else 0
        if c.piece_kind < 0 and n:
            out[i] = tuple(range(at, at + n))
            at += n
    return out


def join_probe(problem: Problem, kinds, cands: list[Candidate], answer: OuterAnswer, plan: PipelinesPlan,
               microbatches: int, planner: JoinPlanner, end: float, shape_devices, class_devices) -> JoinResult:
    """NOTE [join probe] from `answer` (whose realized plan is `plan`) until `end` (a perf_counter value); the joined
    shapes' candidates from `planner`, those it solves appended to `cands`."""
    t0 = time.perf_counter()
    stats = {"join_tries": 0.0, "join_solves": 0.0, "join_taken": 0.0}
    out = JoinResult(answer=answer, plan=plan)
    while True:
        free = free_machines(kinds, cands, out.answer)
        index = _indices(cands, out.answer)
        tries: list[JoinTry] = []
        untried: set[int] = set()
        found: list[tuple[PipelinesPlan, OuterAnswer]] = []
        for i, pipes in index.items():
            for j, idle in enumerate(free):
                if idle <= 0:
                    continue
                if time.perf_counter() >= end:
                    untried.add(j)
                    continue
                c = cands[i]
                shape = dataclasses.replace(c.shape, machines=tuple(  # type: ignore[type-var]
                    n + (k == j) for k, n in enumerate(c.shape.machines)))  # type: ignore[attr-defined]
                copies = min(len(pipes), idle)
                each = max(1, out.answer.microbatches[i] // len(pipes))
                joined, solved, why = planner.candidate(problem, cands, shape, each, microbatches, end)
                stats["join_solves"] += solved
                stats["join_tries"] += 1
                if joined is None:
                    tries.append(JoinTry(j, i, pipes[:copies], None, why))
                    continue
                k = next((x for x, o in enumerate(cands) if o is joined), len(cands))
                if k == len(cands):  # solved now: the search's cache of shapes grows by it
                    cands.append(joined)
                trial = _joined_answer(cands, out.answer, i, k, copies, microbatches)
                if trial is None:
                    tries.append(JoinTry(j, i, pipes[:copies], None,
                                         f"the {microbatches} microbatches do not split over the pipelines"))
                    continue
                had = out.answer.copies[k] if k < len(out.answer.copies) else 0
                if trial.copies[k] < had + copies:  # the split runs nothing on a joined pipeline: no join
                    tries.append(JoinTry(j, i, pipes[:copies], None, "the batch's least-time split gives the joined "
                                         f"pipeline no microbatches: its fewest ({joined.lo}) take longer than the "
                                         "others take for the whole batch"))
                    continue
                got = cost_pipelines(problem, realize(problem, kinds, cands, trial, shape_devices, class_devices),
                                     solver_status="FEASIBLE")
                # Machines of a kind are interchangeable: the joined plan may run on the added machine and leave
                # another of its kind out, so count the kind's busy machines (review19), not the added one's.
                kind = set(kinds[j].machines)
                left_out = _busy_machines(problem, got, kind) <= _busy_machines(problem, out.plan, kind)
                tries.append(JoinTry(j, i, pipes[:copies], got.iteration_ns, left_out=left_out))
                found.append((got, trial))
        out.tries, out.untried = tries, untried
        better = min(found, key=lambda ga: ga[0].iteration_ns, default=None)
        if better is None or better[0].iteration_ns >= out.plan.iteration_ns:
            break
        out.plan, out.answer = better
        stats["join_taken"] += 1
    stats["join_seconds"] = time.perf_counter() - t0
    stats["join_finished"] = float(not out.untried)
    out.stats, out.solved = stats, list(planner.solved)
    return out


def _busy_machines(problem: Problem, plan: PipelinesPlan, machines: set[str]) -> int:
    """How many of `machines` run a stage of `plan`."""
    return len({problem.device(d).node for q in plan.pipelines for st in q.plan.stages for d in _devices_of(st)}
               & machines)


def _joined_answer(cands: list[Candidate], answer: OuterAnswer, base: int, joined: int, copies: int,
                   microbatches: int) -> OuterAnswer | None:
    """`answer` with `copies` pipelines of candidate `base` replaced by `joined`'s and the batch split again
    over every pipeline (`_split`: the least pipeline time); None when no split runs the batch."""
    pad = len(cands) - len(answer.copies)
    count = answer.copies + [0] * pad
    count[base] -= copies
    count[joined] += copies
    chosen = [i for i, n in enumerate(count) for _ in range(n)]
    got = _split(cands, chosen, microbatches)
    if got is None:
        return None
    copies_of, micro = [0] * len(cands), [0] * len(cands)
    for i, share in zip(chosen, got[1]):
        if share:  # a pipeline the split gives nothing runs nothing (its machines idle)
            copies_of[i] += 1
            micro[i] += share
    return dataclasses.replace(answer, copies=copies_of, microbatches=micro, optimal=False)
