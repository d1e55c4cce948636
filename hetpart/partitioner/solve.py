"""The solve strategy: which engines run, in which order, with how much of the time limit.

`solve(problem, options)` is the partitioner's entry point: `_solve_unchecked` lists its
steps top to bottom (NOTE [solve strategy]), one function each below it; every knob and a
switch per step are fields of `SolveOptions`, and what each step did lands in `SolveStats`.
The engines themselves live elsewhere: dp.py (contiguous plans), bounds.py (search-free
bounds), ideals.py (the DP over ideals), cpsat.py (the exact model), coarsen.py.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field, fields

import numpy as np

from hetpart.errors import HetpartError
from hetpart.partitioner import bounds as _bounds
from hetpart.partitioner import dp as _dp
from hetpart.partitioner import ideals as _ideals
from hetpart.partitioner.bounds import Bounds, compute_bounds, objective_bound_ns
from hetpart.partitioner.certificate import check_by_default, check_plan, plan_provenance
from hetpart.partitioner.coarsen import coarsen, cut_candidates, pin_cuts
from hetpart.partitioner.costs import has_typed_memory
from hetpart.partitioner.constraints import check_constraints
from hetpart.partitioner.cpsat import LogCallback, _check_hint, solve_model, within_gap
from hetpart.partitioner.dp import Segments, contiguous_plan, dp_hint, order_tables, refine_cuts
from hetpart.partitioner.evaluate import OBJECTIVES, bottleneck_ns, evaluate, objective_ns
from hetpart.partitioner.ideals import ideal_dp
from hetpart.partitioner.infeasible import NoPlan, OutOfTime, constraints_note, infeasible_message, node_need
from hetpart.partitioner.problem import Plan, Problem, StageCost
from hetpart.partitioner.verify import plan_violations


@dataclass(frozen=True)
class SolveOptions:
    """Every knob of `solve`, validated once; `solve(problem, time_limit_s=5)` overrides a field.

    The shares are fractions of `time_limit_s` after which a step must be done; the `run_*`
    switches turn one step of NOTE [solve strategy] off (a test's way to isolate the others).
    """

    time_limit_s: float = 30.0
    gap: float = 0.0  # stop once the plan is certified within this relative gap (NOTE [gap stop] in cpsat.py)
    seed: int = 0  # CP-SAT's random seed
    workers: int = 1  # CP-SAT's search workers (1: deterministic)
    objective: str = "throughput"  # NOTE [objectives] in evaluate.py
    microbatches: int = 1  # M of the iteration objective
    check_certificate: bool | None = None  # re-prove the claim (NOTE [checked certificates]); None: the env variable
    # Time shares (NOTE [DP deadline] in dp.py, NOTE [bounds deadline] in bounds.py, NOTE [ideal DP] in ideals.py).
    dp_share: float = 0.5  # the most the DP may take
    bounds_share: float = 0.65  # when the search-free bounds must be done
    ideal_share: float = 0.8  # when the DP over ideals must be done
    # Coarsening (NOTE [coarsened solve]).
    coarsen_above: int | None = 1_000  # nodes; above, the search runs on a coarse problem (None: never)
    coarse_nodes: int = 300  # runs of the coarse problem CP-SAT sees
    # The DP (NOTE [candidate cuts] in dp.py).
    dp_exact_cuts: int = _dp.EXACT_CUTS  # up to this many nodes the DP tries every cut position
    dp_coarse_cuts: int = _dp.COARSE_CUTS  # above, the first pass tries this many candidate positions
    dp_pre_cuts_above: int = _dp.PRE_CUTS_ABOVE  # exact DPs over more positions first plan on coarse_cuts // 2
    dp_budget: int = _dp._DP_BUDGET  # matrix entries the DP may touch before it coarsens its device classes
    dp_refine_budget: int = _dp._REFINE_BUDGET  # matrix entries of one refinement pass
    # The ideal DP (NOTE [ideal DP] in ideals.py).
    ideal_max: int = _ideals.IDEAL_MAX  # ideals the DP may run over
    ideal_pairs_max: int = _ideals.PAIRS_MAX  # stages (I, J) below the known plan kept
    ideal_visit_max: int = _ideals._VISIT_MAX  # ideals enumerated at most
    ideal_visit_work: int = _ideals._VISIT_WORK  # (ideal, node) checks at most
    # The bounds (bounds.py).
    lp_max_items: int = _bounds.LP_MAX_ITEMS  # above, the LP runs on runs of nodes (NOTE [Lagrangian LP bound])
    inner_cut_max_nodes: int = _bounds.INNER_CUT_MAX_NODES  # above, no max-flows for the inner boundary bytes
    sequence_max_states: int = _bounds.SEQUENCE_MAX_STATES  # states of NOTE [sequence bound]
    stage_sum_max_multisets: int = _bounds.STAGE_SUM_MAX_MULTISETS  # above, NOTE [stage-sum bound by types]
    # The CP-SAT model.
    int32_safe_ns: int | None = None  # stage times past which presolve's inclusion goes; None: cpsat's default
    # One switch per step of NOTE [solve strategy].
    run_dp: bool = True
    run_bounds: bool = True
    run_ideal_dp: bool = True
    run_cpsat: bool = True
    run_coarsening: bool = True

    def __post_init__(self) -> None:
        if not self.time_limit_s > 0:
            raise HetpartError(
                f"partitioner: time limit must be positive, got {self.time_limit_s}; pass --time-limit > 0"
            )
        if self.workers < 1:
            raise HetpartError(f"partitioner: workers must be at least 1, got {self.workers}")
        if self.objective not in OBJECTIVES:
            raise HetpartError(
                f"partitioner: unknown objective {self.objective!r}; use one of {', '.join(OBJECTIVES)}")
        if self.microbatches < 1:
            raise HetpartError(f"partitioner: microbatches must be at least 1, got {self.microbatches}")
        if not 0.0 <= self.gap < 1.0:
            raise HetpartError(
                f"partitioner: gap must be a fraction in [0, 1), got {self.gap}; pass e.g. --gap 0.01 for 1%"
            )
        for name in ("dp_share", "bounds_share", "ideal_share"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise HetpartError(f"partitioner: {name} must be a fraction in (0, 1], got {getattr(self, name)}")
        if self.coarsen_above is not None and self.coarsen_above < 0:
            raise HetpartError(f"partitioner: coarsen_above must be at least 0 (or None: never), "
                               f"got {self.coarsen_above}")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "int" and f.name != "seed" and not (isinstance(value, int) and value >= 1):
                raise HetpartError(f"partitioner: {f.name} must be a positive integer, got {value!r}")

    @property
    def coarsens_above(self) -> int | None:
        """The node count above which the search is coarsened (None: never)."""
        return self.coarsen_above if self.run_coarsening else None


@dataclass
class SolveStats:
    """What each step of NOTE [solve strategy] did (None: the step did not run); `to_json` gives
    the flat float keys of plan.json and the benchmarks."""

    dp_seconds: float | None = None
    bounds_seconds: float | None = None
    ideal_seconds: float | None = None
    build_seconds: float | None = None  # building the CP-SAT model and hinting it
    cpsat_seconds: float | None = None
    certificate_seconds: float | None = None
    dp_bottleneck_ns: int | None = None  # the plan to beat: the DP's, or the ideal DP's when better
    solver_bound_ns: int | None = None  # CP-SAT's proven bound of the objective
    variables: int | None = None
    constraints: int | None = None
    max_stages: int | None = None  # stages the CP-SAT model may use
    presolve_inclusion_off: bool | None = None  # NOTE [int32 activities]
    cpsat_not_built: bool = False  # the model did not finish building in time
    coarsened: bool = False  # the search ran on a coarse problem (NOTE [coarsened solve])
    coarse_nodes: int | None = None
    coarse_solver_optimal: bool | None = None
    coarse_cpsat_seconds: float | None = None
    plan_from: str | None = None  # which step's plan was kept: dp, ideal_dp, hint, cpsat, coarse, refined

    def to_json(self) -> dict[str, float]:
        """Today's keys: numbers as floats, booleans as 0.0/1.0 (the flags only when set), and
        `plan_from_<step>`: 1.0."""
        out: dict[str, float] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or f.name == "plan_from" or (f.name in ("cpsat_not_built", "coarsened") and not value):
                continue
            key = "coarse_solver_status_optimal" if f.name == "coarse_solver_optimal" else f.name
            out[key] = float(value)
        if self.plan_from is not None:
            out["plan_from_" + self.plan_from] = 1.0
        return out


def solve(problem: Problem, options: SolveOptions | None = None, *, hint: Plan | None = None,
          log_callback: LogCallback | None = None, **overrides) -> Plan:
    """The plan with the least bottleneck (NOTE [stage time]), or the best found in `time_limit_s`.

    `options` (default `SolveOptions()`) with `overrides` applied: `solve(p, time_limit_s=5, gap=0.01)`.
    `objective` is one of NOTE [objectives] (evaluate.py): "throughput" (the bottleneck),
    "latency" (sum of stage times) or "iteration" (that + (microbatches - 1) x bottleneck);
    the plan's `objective_ns` and `lower_bound_ns` are in its terms.

    Starts CP-SAT from `hint`, or from the DP's plan when no hint is given; returns a plan with
    0..S-1 stages, costs recomputed by `evaluate`, and the best proven bound; NOTE [solve strategy].
    `gap` > 0 stops as soon as the plan is certified within that relative gap of optimal
    (status "WITHIN_GAP", NOTE [gap stop]); 0 proves optimality or runs out the time limit.
    Honours co-location groups and forbidden device types (constraints.py).
    Raises HetpartError when no plan fits in memory, when the groups and forbidden
    types rule out every plan (naming which and why), or none was found in time; TypeError
    naming any override that is no field of SolveOptions.
    The plan's `certificate` names its bound's source; `check_certificate` (None: the
    HETPART_CHECK_CERTIFICATE environment variable) re-proves an OPTIMAL or WITHIN_GAP
    claim by another route, NOTE [checked certificates] in certificate.py.

        >>> import networkx as nx
        >>> from hetpart.partitioner.problem import Device, Link
        >>> g = nx.path_graph(["a", "b", "c"], create_using=nx.DiGraph)
        >>> nx.set_node_attributes(g, {"a": {"gpu": 30}, "b": {"gpu": 30}, "c": {"gpu": 60}}, "time_ns")
        >>> p = Problem(graph=g, weights={}, devices=[Device("g0", "gpu", "n0", 1), Device("g1", "gpu", "n0", 1)],
        ...             intra_node_links={"n0": Link(1000, 0)}, network=Link(1000, 0))
        >>> plan = solve(p)
        >>> plan.stage_of, plan.bottleneck_ns, plan.solver_status
        ({'a': 0, 'b': 0, 'c': 1}, 60, 'OPTIMAL')
    """
    unknown = sorted(set(overrides) - {f.name for f in fields(SolveOptions)})
    if unknown:
        raise TypeError(f"solve() got unknown keyword argument(s) {', '.join(unknown)}; "
                        "the knobs are the fields of SolveOptions")
    opts = dataclasses.replace(options or SolveOptions(), **overrides) if overrides else options or SolveOptions()
    plan = _solve_unchecked(problem, opts, hint, log_callback)
    if opts.check_certificate if opts.check_certificate is not None else check_by_default():
        t_check = time.perf_counter()
        plan = check_plan(problem, plan, time_limit_s=opts.time_limit_s, coarsen_above=opts.coarsens_above)
        plan.stats.certificate_seconds = time.perf_counter() - t_check
    return plan


# NOTE [solve strategy]
# `_solve_unchecked` runs these steps in order; each is a function below, and each but the
# check and the pick has a switch in SolveOptions (`run_dp`, `run_bounds`, `run_ideal_dp`,
# `run_cpsat`, `run_coarsening`):
# 0. check: refuse a problem no plan solves (a node larger than every device, constraints
#    that contradict), in the data's terms;
# 1. dp: the best plan contiguous in the node order (dp.py), within dp_share of the time
#    limit -- the plan to beat, and CP-SAT's start;
# 2. bounds: the search-free lower bounds (bounds.py), done by bounds_share of the limit;
# 3. certify: the DP's plan within `gap` of them ends the solve (NOTE [gap stop]);
# 4. ideal DP (ideals.py, throughput only), done by ideal_share: it may beat the plan to beat
#    and prove it optimal (memory relaxed, NOTE [ideal DP]); certify again;
# 5. search: CP-SAT (cpsat.py) on the problem for the rest of the limit; above coarsen_above
#    nodes, steps 0-6 on a coarse problem instead, its plan read back and refined op by op
#    (NOTE [coarsened solve]);
# 6. pick: of the candidates (the search's plans, the plan to beat, the hint), the best that
#    `plan_violations` passes, recosted by `evaluate`, with the best bound proven; ties go to
#    the earlier candidate.
# `solve` then re-proves the claim when asked (certificate.py). Both the fine and the coarse
# problem go through these same steps: the coarse solve is this function, with coarsening off.


def _solve_unchecked(problem: Problem, opts: SolveOptions, hint: Plan | None,
                     log_callback: LogCallback | None) -> Plan:
    """NOTE [solve strategy], without the certificate check."""
    run = _Run(problem, opts, t0=time.perf_counter())
    # 0. Refuse a problem that no plan solves, saying why.
    _check_solvable(problem)
    # 1. The DP's plan: the best contiguous in the node order, the plan to beat.
    if opts.run_dp:
        _dp_step(run)
    # 2. The search-free bounds, valid for every plan.
    if opts.run_bounds:
        _bounds_step(run)
    # 3. Done when the plan to beat is already within the gap of them.
    if (plan := _certified(run)) is not None:
        return plan
    # 4. The DP over ideals: may beat that plan, and prove it optimal; certify again. (It counts one memory
    # per node: not on a problem whose memory depends on the slot type, NOTE [memory per slot type].)
    if opts.run_ideal_dp and not has_typed_memory(problem) and (plan := _ideal_step(run)) is not None:
        return plan
    # 5. The search: CP-SAT on the problem, or on its coarsening (NOTE [coarsened solve]).
    coarse = opts.coarsens_above is not None and problem.graph.number_of_nodes() > opts.coarsens_above
    found = _coarse_search(run, hint, log_callback) if coarse else _cpsat_search(run, hint, log_callback)
    # 6. The best valid candidate, finished with the best bound proven.
    return _pick(run, found)


@dataclass
class _Candidate:
    """A plan a step proposes: recosted and checked on the problem before it is kept."""

    source: str  # SolveStats.plan_from
    stage_of: dict[str, int]
    device_of_stage: list[str]


@dataclass
class _Found:
    """What the search step hands the pick."""

    candidates: list[_Candidate]  # in order of preference on ties
    solver_bound_ns: int = 0  # a bound of this problem's objective from the search (0: none)
    solver_optimal: bool = False  # the search proved its plan optimal


@dataclass
class _Run:
    """The state one solve carries from step to step."""

    problem: Problem
    opts: SolveOptions
    t0: float  # time.perf_counter() at the start: every deadline counts from here
    stats: SolveStats = field(default_factory=SolveStats)
    best: Plan | None = None  # the plan to beat (the DP's, or the ideal DP's when better)
    best_source: str = "dp"
    search: str = ""  # what searched beyond the bounds, in words (NOTE [what ran])
    bounds: Bounds = field(default_factory=lambda: Bounds(solver_ns=0, lp_work_ns=0, largest_op_ns=0,
                                                          min_devices=None, memory_feasible=True))

    def deadline(self, share: float) -> float:
        return self.t0 + share * self.opts.time_limit_s

    def value(self, stages: list[StageCost]) -> int:
        return objective_ns(stages, self.opts.objective, self.opts.microbatches)

    def lower_bound_ns(self, solver_ns: int = 0) -> int:
        """The best bound of the objective: the bounds so far, and the solver's."""
        return objective_bound_ns(self.problem, self.bounds, self.opts.objective, self.opts.microbatches,
                                  solver_ns=solver_ns)

    def keep(self, plan: Plan | None, source: str) -> None:
        """`plan` becomes the plan to beat."""
        self.best, self.best_source = plan, source
        if plan is not None:
            self.stats.dp_bottleneck_ns = plan.bottleneck_ns


def _check_solvable(problem: Problem) -> None:
    """Step 0: HetpartError when the problem is malformed, a node fits on no device, or the
    constraints contradict each other (constraints.py)."""
    problem.validate()
    largest = max(d.capacity_bytes for d in problem.devices)
    if any(node_need(problem, v) > largest for v in problem.graph.nodes):
        raise NoPlan(infeasible_message(problem))
    check_constraints(problem)


def _dp_step(run: _Run) -> None:
    """Step 1: dp.dp_hint within dp_share of the limit (NOTE [DP deadline])."""
    o = run.opts
    t = time.perf_counter()
    plan = dp_hint(run.problem, time_limit_s=o.dp_share * o.time_limit_s, exact_cuts=o.dp_exact_cuts,
                   coarse_cuts=o.dp_coarse_cuts, pre_cuts_above=o.dp_pre_cuts_above, budget=o.dp_budget,
                   refine_budget=o.dp_refine_budget)
    run.stats.dp_seconds = time.perf_counter() - t
    run.keep(plan, "dp")


def _bounds_step(run: _Run) -> None:
    """Step 2: bounds.compute_bounds, done by bounds_share of the limit (NOTE [bounds deadline])."""
    o = run.opts
    t = time.perf_counter()
    run.bounds = compute_bounds(run.problem, upper_ns=run.best.bottleneck_ns if run.best is not None else None,
                                deadline=run.deadline(o.bounds_share), lp_max_items=o.lp_max_items,
                                inner_cut_max_nodes=o.inner_cut_max_nodes, sequence_max_states=o.sequence_max_states,
                                stage_sum_max_multisets=o.stage_sum_max_multisets)
    run.stats.bounds_seconds = time.perf_counter() - t


def _certified(run: _Run, exact_bound: bool = False) -> Plan | None:
    """Steps 3 and 4: the plan to beat, finished, when it is already within the gap of the bounds
    (NOTE [gap stop]: the search could only narrow the gap); else None. With gap 0 only when
    `exact_bound` (a bound that is the optimum where it is reached, NOTE [ideal DP]) proves it optimal."""
    plan, gap = run.best, run.opts.gap
    lower = run.lower_bound_ns()
    if (gap <= 0 and not exact_bound) or plan is None or not within_gap(run.value(plan.stages), lower, gap):
        return None
    run.stats.plan_from = run.best_source
    proof = "the DP over ideals proves" if exact_bound else "the search-free bounds prove"
    run.search = (f"no search needed: {proof} the {_SOURCE_WORDS[run.best_source]} "
                  + ("optimal" if lower >= run.value(plan.stages) else f"within the gap ({gap:g})"))
    return _finished(run, plan.stage_of, plan.device_of_stage, plan.stages, lower, solver_optimal=False)


def _ideal_step(run: _Run) -> Plan | None:
    """Step 4: NOTE [ideal DP] for the throughput objective, done by ideal_share of the limit: its
    bound joins the bounds, its plan becomes the plan to beat when better; the plan finished
    when that certifies it within the gap, else None."""
    o = run.opts
    if o.objective != "throughput" or run.best is None:
        return None
    t = time.perf_counter()
    got = ideal_dp(run.problem, run.best.bottleneck_ns, deadline=run.deadline(o.ideal_share),
                   lower_ns=run.bounds.lower_bound_ns, gap=o.gap, limit=o.ideal_max, pairs_max=o.ideal_pairs_max,
                   visit_max=o.ideal_visit_max, visit_work=o.ideal_visit_work)
    run.stats.ideal_seconds = time.perf_counter() - t
    if got is None:
        return None
    run.bounds = dataclasses.replace(run.bounds, ideal_ns=got.bound_ns)
    if got.plan is not None and got.plan.bottleneck_ns < run.best.bottleneck_ns:
        run.keep(got.plan, "ideal_dp")
    return _certified(run, exact_bound=True)


def _cpsat_search(run: _Run, hint: Plan | None, log_callback: LogCallback | None, floor: float = 0.25) -> _Found:
    """Step 5 on the problem itself: CP-SAT from the hint or the plan to beat, for the rest of the limit."""
    p, o = run.problem, run.opts
    if not o.run_cpsat:
        run.search = "CP-SAT did not run (switched off)"
        return _Found(_none_found_unless(run, _starts(run, hint)))
    b = run.bounds
    # The model's cut leaves out NOTE [sequence bound]: fed to CP-SAT it changed its search for the
    # worse (zoo:llama training on a100-t4-8: proven optimal in 16 s without it, 15% gap after 30 s
    # with it). The plan reports it all the same (`_pick`).
    answer = solve_model(p, objective=o.objective, microbatches=o.microbatches,
                         bottleneck_lb_ns=max(b.lp_work_ns, b.largest_op_ns, b.stage_sum_ns),
                         external_lb_ns=run.lower_bound_ns(), hint=hint, fallback=run.best, gap=o.gap, seed=o.seed,
                         workers=o.workers, t0=run.t0, time_limit_s=o.time_limit_s, log_callback=log_callback,
                         int32_safe_ns=o.int32_safe_ns, floor=floor)
    st = run.stats
    st.build_seconds = answer.build_seconds
    if answer.status == "NOT_BUILT":
        # No time left to search: the plan to beat with the search-free bounds (NOTE [bounds deadline]).
        st.cpsat_not_built = True
        run.search = f"CP-SAT did not run: its model was not built within --time-limit {o.time_limit_s:g} s"
        if run.best is None:
            raise OutOfTime(
                f"partitioner: no plan found within {o.time_limit_s:g} s ({p.graph.number_of_nodes()} nodes, "
                f"{len(p.devices)} devices on {len({d.node for d in p.devices})} machines): the "
                "CP-SAT model did not finish building; raise --time-limit or plan on fewer machines")
        return _Found(_starts(run, None))
    st.cpsat_seconds, st.variables, st.constraints = answer.cpsat_seconds, answer.variables, answer.constraints
    st.max_stages, st.presolve_inclusion_off = answer.max_stages, answer.presolve_inclusion_off
    st.solver_bound_ns = answer.bound_ns
    if answer.status == "INFEASIBLE":
        raise NoPlan(infeasible_message(p) + constraints_note(p))
    run.search = f"CP-SAT ran ({answer.status})"
    found = []
    if answer.stage_of is not None:
        found.append(_Candidate("cpsat", answer.stage_of, answer.device_of_stage))
    found = _none_found_unless(run, found + _starts(run, hint))
    # With a gap, CP-SAT's OPTIMAL may mean "within the gap limit": then only the bound says optimal.
    return _Found(found, solver_bound_ns=answer.bound_ns, solver_optimal=answer.status == "OPTIMAL" and o.gap == 0)


def _none_found_unless(run: _Run, candidates: list[_Candidate]) -> list[_Candidate]:
    """`candidates`; HetpartError when there are none, saying whether a longer limit may find one."""
    if not candidates:
        p, o = run.problem, run.opts
        size = f"{p.graph.number_of_nodes()} nodes, {len(p.devices)} devices"
        if o.run_cpsat:
            raise OutOfTime(f"partitioner: no plan found within {o.time_limit_s:g} s ({size}): CP-SAT found "
                            "none and proved none impossible in that time; raise --time-limit")
        # Only the DP searched: a longer limit helps only where it ran out of its share of the limit.
        more = o.run_dp and (run.stats.dp_seconds or 0.0) >= o.dp_share * o.time_limit_s
        raise (OutOfTime if more else HetpartError)(
            f"partitioner: no plan found ({size}): CP-SAT is switched off (run_cpsat=False) and " + (
            "the DP found no plan contiguous in the node order" if o.run_dp else "so is the DP (run_dp=False)") + (
            f" in its share of --time-limit {o.time_limit_s:g} s; raise --time-limit" if more
            else "; a longer --time-limit does not change that: switch CP-SAT on"))
    return candidates


def _starts(run: _Run, hint: Plan | None) -> list[_Candidate]:
    """The plans the search starts from, as candidates: the plan to beat, then the hint."""
    out = []
    if run.best is not None:
        out.append(_Candidate(run.best_source, run.best.stage_of, run.best.device_of_stage))
    if hint is not None:
        out.append(_Candidate("hint", hint.stage_of, hint.device_of_stage))
    return out


# NOTE [coarsened solve]
# Above coarsen_above nodes one CP-SAT model of the whole graph stalls in presolve
# (PARTITIONING-NOTES finding 3), so the search step (NOTE [solve strategy] step 5), after
# the DP, the bounds and the ideal DP ran on the whole graph (where the graph without its free
# nodes has few ideals -- hf:llama at 7B dimensions: 1,677 nodes, 7,115 ideals -- the ideal DP
# may already prove the plan optimal):
# 1. coarsens the graph into about coarse_nodes runs of the order (coarsen.py, NOTE
#    [coarse nodes]), with the cuts of the plan to beat among the run boundaries so it is
#    a coarse plan, and solves the coarse problem by the same steps (`_solve_unchecked`,
#    coarsening off, gap 0) from it for the rest of the time limit: CP-SAT may place runs out
#    of order, which the DP cannot;
# 2. reads the coarse answer back and, when it is contiguous in the order, refines its cuts
#    op by op (dp.refine_cuts, devices fixed);
# 3. the pick recosts every candidate exactly on the original problem and keeps the best
#    valid one, the plan to beat first on ties: never worse than the DP;
# 4. with no candidate at all (no contiguous plan, no hint, no coarse plan), runs CP-SAT on the
#    problem itself for the rest of the limit, no more: the coarse plans are only some of the plans (runs
#    too coarse for the only, non-contiguous, plans: docs/benchmarks.md, "Coarsening forced on
#    pinned problems"), so "no plan" is said by that search, proven (NoPlan) or out of time (its
#    plan's bound is then CP-SAT's on the problem itself). The runs include `pin_cuts`: none is
#    pinned first and last unless a co-location group forces it.
# Bounds: the coarse CP-SAT bound is a bound of the coarse problem only (fewer plans,
# transfers rounded up), NOT of the original one, so a coarsened plan reports only the
# search-free bounds of bounds.py (LP work bound, largest op, memory) and the ideal DP's,
# which hold for every plan of the original problem; its gap is honest and usually wider than a
# fine solve's. Deterministic for a given seed and worker count as long as the coarse
# CP-SAT finishes (or stops) at the same point: the DP and refinement are.


def _coarse_search(run: _Run, hint: Plan | None, log_callback: LogCallback | None) -> _Found:
    """Step 5 above coarsen_above nodes: NOTE [coarsened solve]."""
    p, o = run.problem, run.opts
    if hint is not None:
        _check_hint(p, hint, len(p.devices))
    candidates = _starts(run, hint)
    tab = order_tables(p)
    t_eval = time.perf_counter()
    start = min(candidates, key=lambda c: run.value(evaluate(p, c.stage_of, c.device_of_stage)), default=None)
    # Reading the coarse answer back costs a few recostings and checks of the whole graph: keep time for them.
    reserve_s = 8 * (time.perf_counter() - t_eval) / max(1, len(candidates))
    cuts = np.union1d(cut_candidates(tab, o.coarse_nodes), pin_cuts(p, tab))
    if start is not None and _is_contiguous(tab.order, start.stage_of):
        cuts = np.union1d(cuts, [i for i in range(1, tab.n)
                                 if start.stage_of[tab.order[i]] != start.stage_of[tab.order[i - 1]]])
    coarse = coarsen(p, tab, cuts)
    run.stats.coarsened = True
    run.stats.coarse_nodes = coarse.problem.graph.number_of_nodes() if coarse else 0
    remaining = o.time_limit_s - (time.perf_counter() - run.t0) - reserve_s
    run.search = "the coarse CP-SAT did not run: " + (
        "no coarse problem (a co-location group spans nodes pinned first and last)" if coarse is None else
        f"no time left of --time-limit {o.time_limit_s:g} s after the DP, the bounds and the DP over ideals")
    if coarse is not None and remaining > 0.5:
        coarse_hint = None
        if start is not None and (c_stage := coarse.coarse_stage_of(start.stage_of)) is not None:
            st = evaluate(coarse.problem, c_stage, start.device_of_stage)
            coarse_hint = Plan(stage_of=c_stage, device_of_stage=start.device_of_stage, stages=st,
                               bottleneck_ns=bottleneck_ns(st), lower_bound_ns=0, solver_status="FEASIBLE",
                               solve_seconds=0.0)
        valid_lb = run.lower_bound_ns()
        progress = (lambda obj, _bound: log_callback(obj, valid_lb)) if log_callback else None
        try:
            coarse_opts = dataclasses.replace(o, time_limit_s=remaining, gap=0.0, run_coarsening=False,
                                              check_certificate=False)
            cplan = _solve_unchecked(coarse.problem, coarse_opts, coarse_hint, progress)
        except NoPlan:
            cplan = None  # the runs are too coarse to fit somewhere: keep the plan to beat
            run.search = "the coarse problem has no plan (its runs are too coarse)"
        except HetpartError:
            cplan, run.search = None, f"the coarse CP-SAT found no plan in its {remaining:.3g} s"
        if cplan is not None:
            run.search = (f"CP-SAT ran on a coarse problem of {run.stats.coarse_nodes} nodes ({cplan.solver_status}; "
                          "its bound holds for it only)")
            run.stats.coarse_solver_optimal = cplan.solver_status == "OPTIMAL"
            run.stats.coarse_cpsat_seconds = cplan.solve_seconds
            fine = coarse.fine_stage_of(cplan.stage_of)
            candidates.append(_Candidate("coarse", fine, cplan.device_of_stage))
            if _is_contiguous(tab.order, fine) and o.objective == "throughput":
                cut_pos = [0] + [i for i in range(1, tab.n) if fine[tab.order[i]] != fine[tab.order[i - 1]]] + [tab.n]
                seg = Segments(cuts=cut_pos, devices=cplan.device_of_stage, dp_ns=0, exact=True, states=0)
                refined = refine_cuts(p, tab, seg, radius=max(16, 2 * tab.n // max(1, len(cuts))))
                ref = contiguous_plan(p, tab, refined.cuts, refined.devices, run.t0, {})
                candidates.append(_Candidate("refined", ref.stage_of, ref.device_of_stage))
    if candidates:
        return _Found(candidates)
    if not run.bounds.memory_feasible:
        raise NoPlan(infeasible_message(p) + constraints_note(p))
    coarse_search = run.search  # none proven impossible: NOTE [coarsened solve] step 4
    found = _cpsat_search(run, None, log_callback, floor=0.0)  # (no quarter of the limit past it: step 4)
    run.search = f"{coarse_search}; then {run.search} on the problem itself"
    return found


def _pick(run: _Run, found: _Found) -> Plan:
    """Step 6: every candidate recosted on the problem, one that breaks a rule dropped, the best
    kept (the earlier on ties), finished with the best bound proven."""
    p, order = run.problem, run.problem.node_order()
    scored, seen = [], set()
    for i, c in enumerate(found.candidates):
        key = (tuple(c.stage_of[v] for v in order), tuple(c.device_of_stage))
        if key in seen:
            continue  # the coarse solver often hands back the DP's plan
        seen.add(key)
        st = evaluate(p, c.stage_of, c.device_of_stage)
        trial = Plan(stage_of=c.stage_of, device_of_stage=list(c.device_of_stage), stages=st,
                     bottleneck_ns=bottleneck_ns(st), lower_bound_ns=0, solver_status="FEASIBLE", solve_seconds=0.0)
        if not plan_violations(p, trial):
            scored.append((run.value(st), i, c, st))
    if not scored:
        raise HetpartError(
            f"partitioner: no valid plan found within {run.opts.time_limit_s:g} s ({p.graph.number_of_nodes()} "
            f"nodes, {len(p.devices)} devices{', coarsened' if run.stats.coarsened else ''}); raise --time-limit"
        )
    _, _, best, stages = min(scored, key=lambda s: s[:2])
    run.stats.plan_from = best.source
    run.search += f"; kept the {_SOURCE_WORDS[best.source]}"
    if run.opts.objective == "throughput":
        run.bounds = dataclasses.replace(run.bounds, solver_ns=found.solver_bound_ns)
    return _finished(run, {v: best.stage_of[v] for v in p.graph.nodes}, list(best.device_of_stage), stages,
                     run.lower_bound_ns(solver_ns=found.solver_bound_ns), found.solver_optimal)


def _finished(run: _Run, stage_of: dict[str, int], device_of_stage: list[str], stages: list[StageCost],
              proven_ns: int, solver_optimal: bool) -> Plan:
    """The plan `solve` returns: its objective value, and the proven bound capped by it (OPTIMAL
    when the solver says so or the bound reaches the value; else WITHIN_GAP when the gap is
    > 0 and the bound is within it, NOTE [gap stop]; else FEASIBLE)."""
    o = run.opts
    best = run.value(stages)
    if solver_optimal or proven_ns >= best:
        status = "OPTIMAL"
    elif o.gap > 0 and within_gap(best, proven_ns, o.gap):
        status = "WITHIN_GAP"
    else:
        status = "FEASIBLE"
    plan = Plan(
        stage_of=stage_of,
        device_of_stage=device_of_stage,
        stages=stages,
        bottleneck_ns=bottleneck_ns(stages),
        lower_bound_ns=min(proven_ns, best),
        solver_status=status,
        solve_seconds=time.perf_counter() - run.t0,
        stats=run.stats,
        bounds=dataclasses.replace(run.bounds, search=run.search),
        objective=o.objective,
        objective_ns=best,
        microbatches=o.microbatches,
    )
    return dataclasses.replace(plan, certificate=plan_provenance(plan))


# NOTE [what ran]
# "solver FEASIBLE" alone does not say whether a search ran: a large problem's coarse CP-SAT may
# get no time at all after the DP and the bounds, and its plan is then the DP's. Each step that
# ends the solve says what searched in `_Run.search`, which lands in the plan's `Bounds.search`
# (plan.json's `bounds.search`) and in the line `partition` prints after the status: the bounds
# certified the plan, CP-SAT ran for how long (on the problem or a coarse one), or did not, and why.
_SOURCE_WORDS = {"dp": "DP's plan", "ideal_dp": "plan of the DP over ideals", "hint": "hint",
                 "cpsat": "CP-SAT's plan", "coarse": "coarse plan", "refined": "refined coarse plan"}


def _is_contiguous(order: list[str], stage_of: dict[str, int]) -> bool:
    """Whether the stages are contiguous runs of `order` (stage numbers never decrease along it)."""
    stages = [stage_of[v] for v in order]
    return all(a <= b for a, b in zip(stages, stages[1:]))
