"""measured.json of `hetpart run --measure`: each stage's measured forward and the step, beside the plan's."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from hetpart.plan_report import PlanReport, simulation_inputs
from hetpart.runtime.collectives import rank_collectives
from hetpart.runtime.handoff import analyse


def time_stats_us(seconds: list[float]) -> dict:
    """mean, median, p10 and p90 (statistics.quantiles, inclusive) of times in seconds, in us."""
    us = [t * 1e6 for t in seconds]
    deciles = statistics.quantiles(us, n=10, method="inclusive") if len(us) > 1 else us * 9
    return {"n": len(us), "mean": round(statistics.fmean(us), 3), "median": round(statistics.median(us), 3),
            "p10": round(deciles[0], 3), "p90": round(deciles[8], 3)}


def measurement(io_dir: Path, world: int, m: int, plan: PlanReport, opts: Any, threads: int) -> dict:
    """measured.json: each stage's forward time per microbatch and the step time, next to the plan's.

    The first step warms up (and runs pipelining's shape inference); with --steps > 1
    it is left out (`opts`: the run's RunOptions; `threads`: each rank's intra-op threads). A stage's measured time is the median wall time of its forward on
    one microbatch (compute only: transfers are measured in the step time).

    NOTE [measured CPU time]: on `cpu` devices of one machine, ranks share its cores
    (cpu-4 puts 4 ranks on this 2-core VM), so a forward's wall time includes waiting
    for a core. `measured_cpu_time_us` is the rank thread's CPU time in the forward
    (`time.thread_time`; ranks run one intra-op thread unless OMP_NUM_THREADS says
    otherwise), the time its device was busy, which is what the plan predicts.

    NOTE [measured forward]: only the forward is timed, so a stage is compared with the plan's forward,
    `predicted_forward_us`: in training a stage's `compute_us` is its forward plus its backward (NOTE [training
    costs] in passes/lower.py), and `run --measure` printed the forward's CPU time over it, a ratio too small by
    as much as the backward costs (docs/benchmarks.md, "ux21"). `index` is the rank, which is the stage only where
    one pipeline runs one stage per rank.
    """
    from hetpart.partitioner.simulate import simulate

    keep = slice(1, None) if opts.steps > 1 else slice(0, 1)
    stages = []
    last_steps: list[float] = []
    v = len(plan.stages) // world if len(plan.stages) > world and not plan.pipelines else 1  # virtual stages
    timelines = []
    # Rank -> its stage and place in the stage's slot, stage-major (a TP stage's ranks, of any degree: NOTE
    # [tensor-parallel stages] in codegen/tp.py)
    place = [(s, j) for s in plan.stages for j in range(len(s.slot_devices))]
    for rank in range(world):
        data = json.loads((io_dir / f"timing{rank}.json").read_text())
        timelines.append(data.get("timeline"))
        if v > 1:  # a rank's v stages: its forward of one microbatch through all of them, summed per step
            forwards = [sum(step) / m for step in data["forward_s"][keep]]
            cpu = [sum(step) / m for step in data["forward_cpu_s"][keep]]
        else:
            forwards = [t for step in data["forward_s"][keep] for t in step[-m:]]
            cpu = [t for step in data["forward_cpu_s"][keep] for t in step[-m:]]
        planned, j = place[rank] if v == 1 and not plan.pipelines else (plan.stages[rank], 0)
        mine = plan.stages[rank::world] if v > 1 else [planned]
        stages.append({
            "index": rank,
            "device": planned.slot_devices[j],
            "measured_time_us": round(statistics.median(forwards) * 1e6, 3),
            # CPU time of the rank's thread: its own compute, without waiting for a core that
            # other ranks (or other jobs) share (NOTE [measured CPU time])
            "measured_cpu_time_us": round(statistics.median(cpu) * 1e6, 3),
            "predicted_compute_us": round(sum(s.compute_us for s in mine), 3),
            # what the measured forward is compared with: in training compute_us is forward plus backward
            # (NOTE [measured forward])
            "predicted_forward_us": round(sum(s.plan_forward_us for s in mine), 3),
            "predicted_time_us": round(sum(s.predicted_time_us for s in mine), 3),
            "forward_us": time_stats_us(forwards),  # every forward of a microbatch: its spread, not only the median
            "forward_cpu_us": time_stats_us(cpu),
        })
        if rank == world - 1:
            last_steps = data["step_s"][keep]
    predicted = None
    training = opts.mode == "training"
    # The slowest pipeline's step (one pipeline: the plan's stages, all m); in training one pipeline's schedule
    # with its backwards, where the plan has them (partitioned for training): the schedule only, not the
    # optimizer's step nor a gradient sync, which the measured step includes
    def step_us(stages: list, share: int) -> float:
        forward, transfer, backward = simulation_inputs(stages, training)
        return round(simulate(forward, transfer, share, opts.schedule, backward_ns=backward).step_ns / 1000, 3)

    if v == 1 and (not training or (not plan.pipelines and all(s.backward_us is not None for s in plan.stages))):
        predicted = max(step_us(stages, share) for stages, share in
                        ([(q.stages, q.microbatches) for q in plan.pipelines] if plan.pipelines else [(plan.stages, m)]))
    timeline = None
    if all(timelines):  # NOTE [action timeline]: every action of every rank, and where the step went
        timeline = {"clock": "time.monotonic_ns (one clock for the ranks of a machine)", "ranks": timelines,
                    "handoff": analyse(timelines, skip_first=opts.steps > 1).to_json(),
                    # a TP rank's forward: ops, skew, collectives (NOTE [collective skew] in runtime/collectives.py)
                    "collectives": [r.to_json() for r in rank_collectives(timelines, skip_first=opts.steps > 1)]}
    return {
        "format_version": 1,
        "mode": opts.mode,
        "schedule": opts.schedule,
        "microbatches": m,
        "steps_measured": len(last_steps),
        "threads_per_rank": threads,
        "stages": stages,
        "step_time_us": round(statistics.median(last_steps) * 1e6, 3),
        "step_us": time_stats_us(last_steps),
        "step_times_us": [round(t * 1e6, 3) for t in last_steps],
        "predicted_step_time_us": predicted,
        "timeline": timeline,
    }
