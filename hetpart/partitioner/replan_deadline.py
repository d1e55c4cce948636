"""One deadline for a whole re-plan: the from-scratch reference, every repair, the lexicographic steps.

Nothing here imports torch. `hetpart replan` and benchmarks/spot_trace.py re-plan through `replan_one` (a
pipeline of single-device or tensor-parallel stages) and `replan_pipelines_within` (data-parallel pipelines).

NOTE [re-plan deadline]
`--time-limit T` of `hetpart replan` is the whole re-plan's time, not each solve's: one `Deadline` (T
from the re-plan's start) that every step draws its time from, each step taking a share of what is
left when it starts, so the re-plan ends at about T plus what no solver limit covers (reading the
analysis, the large re-plan's DPs and relabeling, re-costing candidates: NOTE [large re-plan]). The
shares:
- one pipeline: the from-scratch reference `solve` gets REFERENCE_SHARE of T; the lexicographic
  steps (NOTE [lexicographic re-plan]) what is left, half each for CP-SAT's two steps; a large
  problem's candidates are DPs without a limit (their time is the fixed part);
- data-parallel pipelines (NOTE [re-plan pipelines]): the re-splits first, their solves within
  RESPLIT_SHARE of T: each repair (its sub-problem's `solve`, then its lexicographic step,
  REPAIR_SOLVE_SHARE and the rest of its part) and each further pipeline's `solve` gets the time left
  of that share divided by the solves still expected (two per broken pipeline with survivors, alone
  and with the free devices, and one further pipeline); a solve that would start with less than
  MIN_SOLVE_S left is not run (its candidates are not made: those printed are those made, and the
  from-scratch plan is always among them when it found one). Then the reference
  `plan_with_baselines`: PIPELINES_SEARCH_SHARE of T for its search, PIPELINES_BASELINE_SHARE for its
  baselines (megatron and metis: the one-pipeline baseline is left out, `single_up_to=0`), each capped
  by what is left of T. The re-splits go first because the reference overruns its limits (its bound and
  idle reasons are not under them); run first, it left the repairs nothing, and the 7B's returning
  machines got no pipeline of their own. Last, the stripes (NOTE [re-plan pipelines] c) get what is left
  of T, at least STRIPES_SHARE of it (the first whatever the time): after the search, whose stripe probe
  then seeds none of theirs twice. The shares sum to T, so a re-plan whose steps keep their limits ends
  at about T. Measured (bytes21b, llama-7b on hetero-64 less a machine, T = 2 s, idle machine): the
  re-plan took 4.4-6.0 s, because (1) the shares summed to 1.25 T (the stripes had 0.25 T of their own
  beside the others' T) and (2) the one-pipeline baseline's `solve` on all 56 GPUs took 1.4 s at its
  0.3 s limit (its bounds, DP hint and coarse search are outside CP-SAT's limit): 1.1 s over for a
  baseline the search already covers (its shapes include one pipeline on every device). What is still
  outside every limit: the search's own overrun (about 0.4 s at 0.7 s), a repair's, and checking,
  striping and relabeling each candidate (0.2-0.8 s). So the stripes check the clock between candidates
  (replan5s: a profile of one event found 4.8 s of stripe work in a 0.5 s share, none of it under a limit):
  past their deadline, after the first stripe plan's candidates (as is and relabeled), no further solved
  stripe plan is striped, checked or relabeled, and with less than MIN_SOLVE_S left no bytes-first DP is
  begun but the first set's in the held order (made candidates whatever the time: every bytes-first stripe
  chosen on llama-7b's trace was the first set's, and with them cut too the trace moved 2.38x fewer bytes
  than re-sharding, against 2.83x);
  what was cut is listed in the re-plan's `left_out` (plan.json's `replan.left_out`, the plan's bound note
  and `hetpart replan`'s output), so a plan chosen without them says so.
Before this, each of these solves had T of its own, so a data-parallel re-plan of a broken 70B
pipeline took the reference (about 1.5 T) plus up to four repairs of T each and their lexicographic
steps (11.8 s at T = 2 s). What the shared deadline costs is a shorter reference and shorter repairs:
docs/benchmarks.md ("Issue 21: one deadline per re-plan") measures it on the trace.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hetpart.errors import HetpartError
from hetpart.partitioner.problem import Problem

REFERENCE_SHARE = 0.6  # one pipeline: the from-scratch solve's share of T
RESPLIT_SHARE = 0.4  # data-parallel pipelines: the re-splits' solves (repairs, a further pipeline), first
PIPELINES_SEARCH_SHARE = 0.3  # ... then the from-scratch search's share of T
PIPELINES_BASELINE_SHARE = 0.1  # ... and its baselines'
REPAIR_SOLVE_SHARE = 0.6  # a repair's part: its sub-problem's solve, the rest its lexicographic step
MIN_SOLVE_S = 0.1  # below this a solve is not started
STRIPES_SHARE = 0.2  # data-parallel pipelines: the stripes' solves (NOTE [re-plan pipelines] c), the rest of T


@dataclass
class Deadline:
    """NOTE [re-plan deadline]: `total_s` from `start`; each step takes a share of what is left."""

    total_s: float
    start: float = field(default_factory=lambda: time.perf_counter())

    def left(self) -> float:
        """Seconds left (0 once it has passed)."""
        return max(0.0, self.start + self.total_s - time.perf_counter())

    def share(self, fraction: float) -> float:
        """`fraction` of the time left, at least MIN_SOLVE_S (a solver's shortest useful limit)."""
        return max(MIN_SOLVE_S, fraction * self.left())

    def of_total(self, fraction: float) -> float:
        """`fraction` of the whole, capped by what is left, at least MIN_SOLVE_S."""
        return max(MIN_SOLVE_S, min(fraction * self.total_s, self.left()))


def replan_one(problem: Problem, holders, *, slack: float, time_limit_s: float, seed: int,
               old_devices: list[str] | None = None):
    """The from-scratch plan of `problem` and NOTE [lexicographic re-plan]'s choice, within one deadline of
    `time_limit_s` (NOTE [re-plan deadline]); the Replan. `holders`: weight -> old devices, or Holdings."""
    from hetpart.partitioner.replan import lexicographic_plan
    from hetpart.partitioner.solve import solve

    deadline = Deadline(time_limit_s)
    scratch = solve(problem, time_limit_s=deadline.of_total(REFERENCE_SHARE), seed=seed)
    return lexicographic_plan(problem, scratch, holders, slack=slack, seed=seed, old_devices=old_devices,
                              deadline=deadline)


def replan_pipelines_within(problem: Problem, old: Sequence, holders: Mapping[str, tuple[str, ...]],
                            microbatches: int, *, slack: float, time_limit_s: float, seed: int,
                            echo=None, memo=None):
    """The from-scratch `--parallel data` plan and NOTE [re-plan pipelines]'s choice within one deadline of
    `time_limit_s` (NOTE [re-plan deadline]): (the PipelinesReplan, the reference's seconds). `memo`: the solved
    shapes the from-scratch search starts from (NOTE [shape memo]), extended with its own."""
    from hetpart.partitioner.infeasible import check_holds_model
    from hetpart.partitioner.pipeline_search import plan_with_baselines
    from hetpart.partitioner.replan_pipelines import replan_pipelines, resplit_candidates
    from hetpart.partitioner.replan_stripes import stripe_candidates
    from hetpart.partitioner.solve import SolveOptions

    check_holds_model(problem)  # the search's own refusal, before any candidate is tried (no time helps)
    deadline = Deadline(time_limit_s)
    resplits = resplit_candidates(problem, old, holders, microbatches, slack=slack, seed=seed,
                                  deadline=Deadline(RESPLIT_SHARE * time_limit_s))
    reference_start = time.perf_counter()
    try:
        scratch, _ = plan_with_baselines(
            problem, microbatches, SolveOptions(time_limit_s=deadline.of_total(PIPELINES_SEARCH_SHARE), seed=seed),
            baseline_limit_s=deadline.of_total(PIPELINES_BASELINE_SHARE), memo=memo, single_up_to=0)
    except HetpartError as err:  # the re-splits may still run the batch (NOTE [re-plan pipelines])
        if echo is not None:
            echo(f"note: the from-scratch --parallel data plan: {str(err).splitlines()[0]}; the batch re-splits only")
        scratch = None
    reference_s = time.perf_counter() - reference_start
    left_out: list[str] = []
    stripes = stripe_candidates(problem, holders, microbatches,
                                deadline=Deadline(max(deadline.left(), STRIPES_SHARE * time_limit_s)),
                                seed=seed, memo=memo, slack=slack, left_out=left_out)
    result = replan_pipelines(problem, old, holders, scratch, slack=slack, seed=seed, resplits=resplits + stripes)
    result.left_out = left_out
    return result, reference_s


def expected_solves(broken: int, free: bool) -> int:
    """NOTE [re-plan deadline]: the re-split solves one re-plan expects: two per broken pipeline with survivors
    (one when no device is free), and one further pipeline."""
    return broken * (2 if free else 1) + 1


__all__ = ["Deadline", "MIN_SOLVE_S", "expected_solves", "replan_one", "replan_pipelines_within"]
