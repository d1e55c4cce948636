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


# NOTE [predicted step]
# measured.json's `predicted_step_time_us` is the step the plan's costs predict for the run's schedule and
# microbatches, played by `simulate` (the figure `partition` prints, report.table.simulated_step, with the
# same stage inputs, plan_report.simulation_inputs): one pipeline's stages (a virtual-stage plan's on its
# ranks, V stages each); of several data-parallel pipelines the slowest's, each at its own share of the batch,
# and in training plus the plan's gradient sync (`grad_sync_us`, not overlapped: NOTE [gradient sync]), which the
# measured step waits for too. A training step is simulated with each stage's backward; the optimizer's step is
# in the measured step only. An inference run of a plan partitioned for training plays its stages' forwards
# (`simulation_inputs` of a training plan: `forward_us`, half of each boundary's transfer), not their forward plus
# backward, which it once did. `predicted_step` says in words what the figure is, or why there is none (a
# training run of a plan partitioned for inference: its stages carry no backward to simulate). It was null in
# training for several pipelines and for virtual stages (ux21), and `run --measure` printed the measured step
# alone.
def predicted_step(plan: PlanReport, m: int, schedule: str, training: bool, virtual: int) -> tuple[float | None, str]:
    """NOTE [predicted step]: (the predicted step in us or None, what it is or why there is none); `virtual`: the
    stages on each rank (1 but for a virtual-stage plan)."""
    from hetpart.partitioner.simulate import simulate

    planned_training = all(s.backward_us is not None for s in plan.stages)  # the stages carry forward and backward
    if training and not planned_training:
        return None, ("none: the plan was partitioned for inference, so its stages carry no backward to simulate a "
                      "training step with")

    def step_us(stages: list, share: int, ranks: int | None = None) -> float:
        forward, transfer, backward = simulation_inputs(stages, planned_training)
        return simulate(forward, transfer, share, schedule, backward_ns=backward if training else None,
                        ranks=ranks).step_ns / 1000

    what = f"the {schedule} schedule simulated" + (" with each stage's backward" if training else ", forwards only")
    if plan.pipelines:
        sync = (plan.grad_sync_us or 0.0) if training else 0.0
        slowest = max(step_us(q.stages, q.microbatches) for q in plan.pipelines)
        return round(slowest + sync, 3), (f"{what}, the slowest of the {len(plan.pipelines)} pipelines at its "
                                          "share of the batch" + (", plus the plan's gradient sync (not overlapped)"
                                                                 if training else ""))
    if virtual > 1:
        ranks = len(plan.stages) // virtual
        return round(step_us(plan.stages, m, ranks), 3), f"{what} on {ranks} ranks of {virtual} stages each"
    return round(step_us(plan.stages, m), 3), what


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
    predicted, predicted_what = predicted_step(plan, m, opts.schedule, opts.mode == "training", v)
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
        "predicted_step": predicted_what,  # NOTE [predicted step]: what the figure is, or why there is none
        "timeline": timeline,
    }
