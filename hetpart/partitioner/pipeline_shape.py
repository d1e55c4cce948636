"""A pipeline shape's plan for the pipelines search (NOTE [pipeline shapes] in pipeline_search.py): solved on
layers or ops, in each device order (NOTE [stash order]), and why there is none (NOTE [shape misses]). Nothing
here imports torch."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from hetpart.errors import HetpartError
from hetpart.partitioner.infeasible import OutOfTime
from hetpart.partitioner.pipeline_layers import LayerProblem, solve_on_layers
from hetpart.partitioner.pipelines import pipeline_time_ns, sub_problem
from hetpart.partitioner.problem import TIME_NS, Plan, Problem
from hetpart.partitioner.solve import SolveOptions, solve

_GPIPE_STEPS = 3  # solves a GPipe shape gets to find the most microbatches it runs (`_most_gpipe`)


@dataclass(frozen=True)
class ShapeSolve:
    """A shape's solve by the search's planner: its plan, or None and why (NOTE [shape misses])."""

    plan: Plan | None
    timed_out: bool = False  # no plan: the solve's limit ran out (OutOfTime): a longer one may find a plan
    why: str = ""  # no plan: why, in the user's words ("no plan of it fits in memory", "... in the 2 s ...")


def _slow_first(problem: Problem) -> list[tuple[str, int]]:
    """NOTE [stash order]: the kinds (type, capacity) by the model's time on their type, slowest first, then by
    capacity, the largest first."""
    g = problem.graph
    total = {t: sum(g.nodes[v][TIME_NS][t] for v in g.nodes) for t in problem.device_types}
    return sorted({(d.type, d.capacity_bytes) for d in problem.devices}, key=lambda k: (-total[k[0]], -k[1]))


def stash_ordered(problem: Problem, layers: LayerProblem | None, order: list[tuple[str, int]]
                  ) -> tuple[Problem, LayerProblem | None]:
    """`problem` (and its layer problem) with the devices in NOTE [stash order]: kinds as `order` lists
    them, then the others, each in problem order."""
    rank = {kind: i for i, kind in enumerate(order)}
    key = lambda d: rank.get((d.type, d.capacity_bytes), len(rank))  # noqa: E731 (sorted is stable)
    out = dataclasses.replace(problem, devices=sorted(problem.devices, key=key))
    if layers is None:
        return out, None
    coarse = layers.coarse.problem
    return out, dataclasses.replace(layers, coarse=dataclasses.replace(
        layers.coarse, problem=dataclasses.replace(coarse, devices=sorted(coarse.devices, key=key))))


def stash_need_bytes(problem: Problem, need: int, act_bytes: int, devices: int, usable: int | None = None) -> float:
    """NOTE [pipeline shapes]'s estimate (not a bound) of the memory a pipeline of `devices` stages needs:
    `need` (one microbatch of activations) plus, under 1F1B, stage k of S stashing S - k microbatches,
    (S + 1) / 2 on average when the activations spread evenly over the stages; under GPipe, the
    `gpipe_share` microbatches it runs (NOTE [GPipe stash estimate]), on `usable` devices (default: all)."""
    t = problem.training
    if t is not None and t.schedule == "gpipe":
        return float(need + act_bytes * (gpipe_share(problem, need, act_bytes, devices, usable) - 1))
    if t is None or t.schedule != "1f1b":
        return float(need)
    stages = min(devices, t.microbatches if problem.max_stages is None else min(t.microbatches, problem.max_stages))
    return need + act_bytes * (stages - 1) / 2


# NOTE [GPipe stash estimate]
# Under GPipe every stage keeps all the microbatches its pipeline runs, so what a shape needs depends on
# its share of the batch: M x devices / usable were every pipeline of its size, but never less than the
# batch over the most pipelines the cluster's memory holds. A pipeline running m microbatches holds its
# weights and state and m microbatches of activations, `need + (m - 1) act` at least (more where stages
# replicate weights), so k pipelines running M in all need k (need - act) + M act: at most
# (capacity - M act) / (need - act) of them fit. Before, the estimate was `need` (one microbatch) under
# GPipe, so the shapes enumerated were those holding one microbatch: the 405B-shaped model at TP 8 on
# hetero-256 (8 microbatches; one pipeline at most fits: two need 1,984 GiB per rank, the slots
# hold 1,792) tried only 9-12-slot shapes, each running 2-3 microbatches, and no mix of them runs the batch
# (docs/benchmarks.md, "rows19").
def gpipe_share(problem: Problem, need: int, act_bytes: int, devices: int, usable: int | None = None) -> int:
    """NOTE [GPipe stash estimate]: the microbatches a GPipe pipeline of `devices` of the `usable` is
    estimated to run."""
    m = problem.training.microbatches if problem.training is not None else 1
    usable = max(1, usable or len(problem.devices))
    share = max(1, m * devices // usable)
    # Called per count vector by the shapes' enumeration: the devices' sum kept (NOTE [problem caches]).
    capacity = problem.kept("capacity_bytes", id(problem.devices),
                            lambda: sum(d.capacity_bytes for d in problem.devices))
    if need > act_bytes:  # the most pipelines the cluster's memory holds (NOTE [GPipe stash estimate])
        most = max(1, (capacity - m * act_bytes) // (need - act_bytes))
        share = max(share, -(-m // most))
    return min(m, share)


# NOTE [doubled GPipe shapes]
# The shapes' memory is judged by its sum (NOTE [pipeline shapes]), but a stage holds whole layers, and under
# GPipe each stashes every microbatch it runs: a pipeline twice as long holds half the layers per stage and
# room for more microbatches than the sum says. So when a shape of one kind's machines alone has a GPipe plan
# that runs fewer microbatches than its copies need for the batch (M over the copies the kind's machines hold,
# rounded up), the same kind at twice the machines is solved next, if the machines are there (and again from
# it). The 405B-shaped model on hetero-1024 at 79.18 GiB per H100 (CUDA's total, NOTE [capacity CUDA
# reports]), GPipe, 8 microbatches: a stage of two layers stashes one microbatch (80 GiB held two), so 64, 72
# and 88 H100s run one each and the 32 H100 machines hold four 64-GPU pipelines: the search's plan ran eight
# pipelines of A100-80G and H100 at one microbatch each, 16.4 s against a bound of 7.94 s; 128 H100s (one
# layer a stage) run all 8 in 8.38 s (docs/benchmarks.md, "rows405").
def doubled_shape(kinds, shape, runs: int, microbatches: int):
    """NOTE [doubled GPipe shapes]: `shape` (pipeline_search.Shape) at twice its machines when it is of one kind's
    machines alone, its plan runs `runs` microbatches, fewer than its copies need, and the machines are there;
    else None. (Under 1F1B a plan runs the whole batch: `runs` is M and nothing is doubled.)"""
    used = [(j, n) for j, n in enumerate(shape.machines) if n]
    if len(used) != 1:
        return None
    j, n = used[0]
    most = len(kinds[j].machines)
    if runs >= -(-microbatches // (most // n)) or 2 * n > most:
        return None
    return dataclasses.replace(shape, machines=tuple(2 * n if i == j else 0 for i in range(len(shape.machines))))


# NOTE [shape misses]
# A shape's solve ends without a plan in two ways, and the search tells them apart: its limit ran
# out (OutOfTime: CP-SAT found none and proved none impossible in its time, its model was not
# built, or the DP used up its share of the limit): a longer --time-limit may find one; or it
# ended in its time without one: `solve` proved none fits (NoPlan: a node larger than every
# device, the memory bounds, CP-SAT's INFEASIBLE), or the layer DP (NOTE [shapes on layers]) found
# no plan cut at layer boundaries, contiguous in some device order tried, that fits in memory.
# Only a miss of the second kind is remembered (the join probe's cache of shapes with no plan) and
# said to be memory; when every shape was tried and none timed out, the search says the cluster's
# shapes fit no plan (before, a shape whose solve timed out was counted as one that fits none).


def _solve_shape_why(problem: Problem, devices: tuple[str, ...], m: int, opts: SolveOptions, limit_s: float,
                     layers: LayerProblem | None = None,
                     ordered: list[tuple[Problem, LayerProblem | None]] | None = None) -> ShapeSolve:
    """The shape's plan for `m` microbatches, or why there is none (NOTE [shape misses]): on the layer-level
    problem when there is one (NOTE [shapes on layers]), else by `solve` on the ops; with `ordered`
    (`stash_ordered`'s), also in those device orders, the fastest kept (NOTE [stash order]).
    Without its own search-free bounds and certificate: NOTE [pipelines bound] bounds the whole plan."""
    if ordered:
        keep = set(devices)
        seen, got = [], []
        for prob, lay in [(problem, layers)] + list(ordered):
            names = [d.name for d in prob.devices if d.name in keep]
            if names in seen:
                continue  # the same order (one kind of device, say): the same plan
            seen.append(names)
            got.append(_solve_shape_why(prob, devices, m, opts, limit_s, lay))
        plans = [g.plan for g in got if g.plan is not None]
        if plans:
            return ShapeSolve(min(plans, key=lambda p: pipeline_time_ns(p, m)))
        return next((g for g in got if g.timed_out), got[0])  # a timed-out order may hold a plan
    where = " on layer boundaries" if layers is not None else ""
    sub = sub_problem(problem, devices, m) if layers is None else None
    no_fit = ShapeSolve(None, why=f"no plan of it{where} fits in memory")
    try:
        if layers is not None:
            plan = solve_on_layers(problem, layers, devices, m, opts, limit_s)
        else:
            plan = solve(sub, dataclasses.replace(
                opts, time_limit_s=max(0.05, limit_s), objective="iteration", microbatches=m, run_bounds=False,
                run_ideal_dp=False, check_certificate=False))
    except OutOfTime:
        return ShapeSolve(None, timed_out=True, why=f"no plan of it was found in the {limit_s:.2g} s it was given")
    except HetpartError:  # NoPlan, or the layer DP found no plan in its time
        return no_fit
    return ShapeSolve(plan) if plan is not None else no_fit


def _solve_shape(problem: Problem, devices: tuple[str, ...], m: int, opts: SolveOptions, limit_s: float,
                 layers: LayerProblem | None = None,
                 ordered: list[tuple[Problem, LayerProblem | None]] | None = None) -> Plan | None:
    """`_solve_shape_why`'s plan, None when there is none."""
    return _solve_shape_why(problem, devices, m, opts, limit_s, layers, ordered).plan


def _most_gpipe(problem: Problem, devs: tuple[str, ...], share: int, microbatches: int, opts: SolveOptions,
                limit_s: float, layers: LayerProblem | None, search_end: float) -> tuple[int, Plan | None]:
    """A GPipe shape that cannot run all `microbatches`: (m, its plan for m), m the most it runs found
    by bisection from `share` up (at most _GPIPE_STEPS more solves, within the search's share): a GPipe
    plan runs up to the m it was solved for (the stash), so a plan for `share` alone would cap the
    shape there (small_problem(15) in the tests: one fast device of a machine runs 3 of the 4)."""
    plan = _solve_shape(problem, devs, share, opts, limit_s, layers)
    lo, hi = share, microbatches  # lo runs (when plan is not None), hi does not
    for _ in range(_GPIPE_STEPS):
        if plan is None or hi - lo <= 1 or search_end - time.perf_counter() < 2 * limit_s:
            break
        mid = (lo + hi) // 2
        got = _solve_shape(problem, devs, mid, opts, limit_s, layers)
        lo, hi, plan = (mid, hi, got) if got is not None else (lo, mid, plan)
    return lo, plan
