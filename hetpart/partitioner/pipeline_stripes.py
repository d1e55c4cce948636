"""Striped pipelines (NOTE [striped pipelines]): f pipelines that each take 1/f of the same machines, tried
after the search of pipeline_search.py. Nothing here imports torch.
"""

from __future__ import annotations

import time
import types
from collections.abc import Sequence
from dataclasses import dataclass, field
from math import gcd
from typing import Callable

from hetpart.partitioner.pipeline_bounds import need_bytes
from hetpart.partitioner.pipeline_outer import renamed
from hetpart.partitioner.pipelines import PipelinesPlan, cost_pipelines, pipelines_violations
from hetpart.partitioner.problem import Plan, Problem

_SEEDS_AT_LEAST = 4  # memo stripes tried whatever the time (each a recost of f pipelines, ~0.1 s on llama-7b)

# NOTE [striped pipelines]
# A shape (NOTE [pipeline shapes]) is whole machines or a piece of one machine, so f pipelines that each take
# 1/f of every device class of the same machines are not among them. In training they can win: when the f
# stripes run the same plan, stripe j's stage k sits on the same machine as every other stripe's stage k, so
# each weight's f holders share a machine and its gradient all-reduce runs over that machine's link (NVLink)
# rather than the network (NOTE [gradient sync]); the price is that each pipeline's own boundaries cross
# machines, paid per microbatch in its stage times. Llama-7b on hetero-64 (docs/benchmarks.md, "gap7b"): 8
# stripes of the six 40-80 GB machines, one GPU of each per pipeline and 8 microbatches each, take 658.1 ms
# (642.8 + 15.3 ms of sync) where the search's two 24-GPU pipelines took 747.5 (their rings cross the network:
# 44.6 ms of sync, and 32 microbatches each pay a longer fill). The stripes of a machine set U are
# interchangeable (stripe j's device of class c on machine u maps to stripe 0's device of the same class on the
# same machine: same type, capacity, link and machine boundaries), so one stripe is solved (`solve(devices, m,
# limit_s)`, the search's planner) and renamed to the others (`renamed`, which recosts each on its devices),
# each given M // f microbatches and the first M mod f one more (1F1B: a plan solved for M // f has at most that
# many stages, so runs one more; GPipe: solved for the larger share, whose stash bounds the smaller's). Tried: U
# = the machines the best plan so far runs stages on, and U = every machine; f = each common divisor >= 2 of the
# class counts of U's machines, most stripes first; a stripe whose memory cannot hold the model, or with more
# devices than the plan's longest pipeline (a heuristic: a longer fill; llama-70b on hetero-1024 spent 6 s on an
# 80-device stripe), is not solved, and each solve gets the search's per-shape limit, skipped when that is more
# than the probe has left (llama-70b on hetero-64 spent 5.9 s of its 45 on six tries). The whole plan is costed
# by `cost_pipelines` (the exact sync), checked by `pipelines_violations`, and kept only when its step is lower.
# The bound is untouched: NOTE [pipelines bound] holds for every partition of the devices, stripes included.
# A re-plan's probe first takes the stripes NOTE [shape memo] kept (stripe 0's plan, keyed by the machines'
# kinds and f; a 2 s re-plan has no time left to solve one: its limit_s is at least 1 s), then solves the sets
# the memo lacks as above; each solved stripe goes into the memo.


@dataclass
class StripeResult:
    """The best plan after the probe (the one it was given when no stripes beat it), and what it tried."""

    plan: PipelinesPlan
    tries: list[tuple[int, int, int | None]] = field(default_factory=list)  # (machines, stripes, step ns or None)
    # (machines, stripes, stripe 0's devices, its plan, its microbatches) of each stripe solved (NOTE [shape memo])
    solved: list[tuple[tuple[str, ...], int, tuple[str, ...], Plan, int]] = field(default_factory=list)
    stats: dict[str, float] = field(default_factory=dict)


def stripe_sets(problem: Problem, used: set[str]) -> list[tuple[tuple[str, ...], int]]:
    """(machines U, stripes f) to try (NOTE [striped pipelines]): U the machines of `used` devices and every
    machine; f each common divisor >= 2 of the class counts of U's machines, the most stripes first."""
    classes = {m: problem.device_kinds(m) for m in dict.fromkeys(d.node for d in problem.devices)}
    on = tuple(sorted({problem.device(d).node for d in used}))
    out: list[tuple[tuple[str, ...], int]] = []
    for machines in (on, tuple(sorted(classes))):
        if not machines:
            continue
        common = 0
        for m in machines:
            for n in classes[m].values():
                common = gcd(common, n)
        for f in range(common, 1, -1):
            if common % f == 0 and (machines, f) not in out:
                out.append((machines, f))
    return out


def stripe_devices(problem: Problem, machines: tuple[str, ...], stripes: int) -> list[tuple[str, ...]]:
    """The `stripes` device groups of NOTE [striped pipelines]: group j takes the j-th 1/f of each class of
    each machine (in problem order)."""
    per: dict[tuple[str, tuple[str, int]], list[str]] = {}
    for d in problem.devices:
        if d.node in machines:
            per.setdefault((d.node, (d.type, d.capacity_bytes)), []).append(d.name)
    groups: list[list[str]] = [[] for _ in range(stripes)]
    for (_, _), names in sorted(per.items(), key=lambda kv: (machines.index(kv[0][0]), kv[0][1])):
        n = len(names) // stripes
        for j in range(stripes):
            groups[j] += names[j * n:(j + 1) * n]
    return [tuple(g) for g in groups]


def stripe_microbatches(problem: Problem, microbatches: int, stripes: int) -> int:
    """The microbatches one stripe is solved for (NOTE [striped pipelines]: 1F1B the smaller share, GPipe the
    larger)."""
    gpipe = problem.training is not None and problem.training.schedule == "gpipe"
    return -(-microbatches // stripes) if gpipe else microbatches // stripes


def striped(problem: Problem, groups: list[tuple[str, ...]], plan: Plan, microbatches: int) -> PipelinesPlan:
    """`plan` (of `groups[0]`) run by every group, the batch split as evenly as it goes (NOTE [striped
    pipelines]), costed by `cost_pipelines`."""
    f = len(groups)
    c = types.SimpleNamespace(devices=groups[0], plan=plan)
    shares = [microbatches // f + (j < microbatches % f) for j in range(f)]
    pipes = [renamed(problem, c, g, m, j) for j, (g, m) in enumerate(zip(groups, shares))]  # type: ignore[arg-type]
    return cost_pipelines(problem, pipes, solver_status="FEASIBLE")


def stripe_probe(problem: Problem, best: PipelinesPlan, microbatches: int,
                 solve: Callable[[tuple[str, ...], int, float], Plan | None], limit_s: Callable[[int], float],
                 end: float, need: int | None = None,
                 seeds: Sequence[tuple[tuple[str, ...], int, Plan]] = ()) -> StripeResult:
    """NOTE [striped pipelines] from `best` until `end` (a perf_counter value): each (U, f) of `seeds` (stripe 0's
    plan given: NOTE [shape memo]; the first _SEEDS_AT_LEAST whatever the time), then each of `stripe_sets` not
    seeded whose stripe has the memory to hold the model (`need`: `need_bytes`, which the search has) and no more
    devices than `best`'s longest pipeline, one stripe solved by `solve(devices, microbatches, limit_s)` within
    `limit_s(devices)`; the fastest valid plan of stripes kept when its step is below `best`'s."""
    t0 = time.perf_counter()
    out = StripeResult(plan=best)
    need = need_bytes(problem) if need is None else need
    longest = max(len(p.devices) for p in best.pipelines)
    used = best.used_devices
    done: set[tuple[tuple[str, ...], int]] = set()
    for i, (machines, f, plan) in enumerate(seeds):
        if i >= _SEEDS_AT_LEAST and time.perf_counter() > end:
            break
        done.add((machines, f))
        got = striped(problem, stripe_devices(problem, machines, f), plan, microbatches)
        ok = not pipelines_violations(problem, got, microbatches)
        out.tries.append((len(machines), f, got.iteration_ns if ok else None))
        if ok and got.iteration_ns < out.plan.iteration_ns:
            out.plan = got
    seeded = len(out.tries)
    for machines, f in stripe_sets(problem, used):
        left = end - time.perf_counter()
        if left <= 0 or microbatches < f or (machines, f) in done:
            continue
        groups = stripe_devices(problem, machines, f)
        if len(groups[0]) > longest:
            continue  # longer than any pipeline of the plan: a longer fill (llama-70b on hetero-1024: 6 s, no gain)
        if sum(problem.device(d).capacity_bytes for d in groups[0]) < need:
            continue  # NOTE [pipelines bound] (f): no plan of it holds the model (llama-70b: 6 or 12 GPUs)
        if limit_s(len(groups[0])) > left:
            continue  # its solve would overrun the probe's time (a stripe of every 1,024-GPU machine: 128 devices)
        m = stripe_microbatches(problem, microbatches, f)
        plan = solve(groups[0], m, limit_s(len(groups[0])))
        if plan is None:
            out.tries.append((len(machines), f, None))
            continue
        out.solved.append((machines, f, groups[0], plan, m))
        got = striped(problem, groups, plan, microbatches)
        if pipelines_violations(problem, got, microbatches):
            out.tries.append((len(machines), f, None))
            continue
        out.tries.append((len(machines), f, got.iteration_ns))
        if got.iteration_ns < out.plan.iteration_ns:
            out.plan = got
    out.stats = {"stripe_tries": float(len(out.tries)), "stripe_taken": float(out.plan is not best),
                 "stripes_from_memo": float(seeded),
                 "stripe_seconds": time.perf_counter() - t0}
    return out
