"""`partition --schedule auto` / `--microbatches auto` on a traced model (NOTE [schedule choice]).

    exported graph --cost passes at B/M, lowered--> Problem per M --choose_schedule--> chosen (schedule, V, M)
                   --> the options `compile_model` then plans and writes, and plan.json's `schedule_choice`

The search itself is torch-free (`hetpart/partitioner/schedule_choice.py`); this module feeds it problems
lowered from the one exported graph and hands `compile_model` the chosen candidate's options and plan.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.fx as fx

from hetpart.devices import Cluster
from hetpart.export.layers import align_to_layers
from hetpart.export.modules import annotate_modules
from hetpart.partitioner import Plan, Problem, solve
from hetpart.partitioner.schedule_choice import (
    AUTO, AUTO_VIRTUAL_STAGES, TRAINING_SCHEDULES, ScheduleChoice, candidates, check_auto_options, choose_schedule,
    microbatch_counts,
)
from hetpart.partitioner.simulate import VIRTUAL_SCHEDULES
from hetpart.passes import group_of, lower_to_problem
from hetpart.passes.lower import TrainingSpec
from hetpart.timings import StepTimes


@dataclass(frozen=True)
class AutoSchedule:
    """The chosen candidate as `compile_model`'s options (its record in `schedule_choice`), and its plan."""

    options: Any  # CompileOptions with the chosen schedule, V and M
    choice: ScheduleChoice

    @property
    def plan(self) -> Plan | None:
        """The chosen GPipe/1F1B finalist's solved plan, for `compile_model` to write (an interleaved one is
        re-planned there by the same deterministic DP: NOTE [virtual stages plan])."""
        return None if self.choice.chosen.candidate.virtual else self.choice.chosen.plan


def chooses_schedule(opts: Any) -> bool:
    """Whether `opts` (CompileOptions) asks for the schedule or the microbatch count to be chosen."""
    return opts.schedule == AUTO or opts.microbatches == AUTO


def check_auto(opts: Any, batch_size: int | None, out: Any) -> None:
    """CompileOptions.check for auto options: theirs (`check_auto_options`), then every other option as a
    candidate's (the first schedule tried, one microbatch) would have it checked."""
    check_auto_options(opts.schedule, opts.microbatches, opts.max_microbatches, batch_size, opts.mode,
                       opts.virtual_stages, opts.pipelines is not None or opts.parallel == "data", opts.strategy,
                       opts.tensor_parallel > 1 or opts.max_tensor_parallel > 1)
    schedule = opts.schedule if opts.schedule != AUTO else VIRTUAL_SCHEDULES[0] if opts.virtual_stages else "gpipe"
    concrete = dataclasses.replace(opts, schedule=schedule, microbatches=1 if opts.microbatches == AUTO
                                   else opts.microbatches, max_microbatches=None)
    concrete.check(batch_size, out)


def choose_for_model(annotate_at: Callable[[int], fx.GraphModule], batch_size: int, cluster: Cluster, opts: Any, *,
                     on_meta: bool, times: StepTimes, echo: Callable[[str], None],
                     profiled: bool = False) -> AutoSchedule:
    """Choose the schedule and/or microbatch count (NOTE [schedule choice]); `annotate_at(size)` runs the cost
    passes over the exported graph at microbatch `size` and returns it."""
    training = opts.mode == "training"
    schedules: tuple[str, ...] = (opts.schedule,)
    left_out: list[str] = []
    if opts.schedule == AUTO:
        schedules = TRAINING_SCHEDULES
        if on_meta:  # NOTE [schedule choice]: virtual stages need the weights traced
            schedules = tuple(s for s in schedules if s not in VIRTUAL_SCHEDULES)
            left_out.append("interleaved-1f1b, interleaved-zb: the model is traced without weights (--meta), and "
                            "virtual stages of such a plan are not written yet")
    virtual = ((opts.virtual_stages,) if opts.virtual_stages else AUTO_VIRTUAL_STAGES if opts.schedule == AUTO
               else (2,))
    counts = microbatch_counts(batch_size, opts.max_microbatches) if opts.microbatches == AUTO else [opts.microbatches]
    cands, dropped = candidates(schedules, counts, virtual, len(cluster.devices))
    if profiled and len(counts) > 1:
        echo("note: --microbatches auto with --profile: a profile measured each op at the shapes it was taken at; "
             "at other microbatch sizes the ops fall back to the roofline, so the counts are costed differently")

    def problem_for(m: int) -> Problem:
        with times.step(f"schedule choice/passes M={m}"):
            gm = annotate_at(batch_size // m)
        spec = TrainingSpec("gpipe", m, opts.optimizer_bytes_per_param) if training else None
        problem = lower_to_problem(gm, cluster, spec, group_of(gm))
        annotate_modules(gm, problem)
        if opts.align == "layers":
            align_to_layers(problem)
        return problem

    def solve_fn(problem: Problem, seconds: float) -> Plan:
        return solve(problem, time_limit_s=seconds, seed=opts.seed, gap=opts.gap,
                     check_certificate=opts.check_certificate)

    with times.step("schedule choice"):
        choice = choose_schedule(problem_for, batch_size, cands, left_out + dropped, solve_fn, opts.time_limit_s)
    c = choice.chosen.candidate
    searched = {"schedule": opts.schedule, "microbatches": opts.microbatches,
                "max_microbatches": opts.max_microbatches}
    chosen = dataclasses.replace(opts, schedule=c.schedule, microbatches=c.microbatches, max_microbatches=None,
                                 virtual_stages=c.virtual_stages if c.virtual else None,
                                 schedule_choice=choice.to_json(searched))
    echo(f"schedule choice: {sum(e.fits for e in choice.evaluated)} of {len(choice.evaluated)} candidate(s) fit; "
         f"chose {c.schedule}{f' V={c.virtual_stages}' if c.virtual else ''} with {c.microbatches} microbatch(es) "
         f"in {choice.search_s:.1f} s (NOTE [schedule choice])")
    return AutoSchedule(chosen, choice)
