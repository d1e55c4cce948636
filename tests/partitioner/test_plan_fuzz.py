"""planfuzz, seeded and small: the certificates of `--parallel data` plans against brute force (plan_fuzz.py), on
the deadline paths too. benchmarks/plan_fuzz.py runs the same by the hundred (docs/benchmarks.md, "planfuzz")."""

from __future__ import annotations

from dataclasses import replace

from hetpart.partitioner.pipeline_baselines import pipeline_baselines
from hetpart.partitioner.pipeline_search import plan_pipelines
from hetpart.partitioner.pipelines import cost_pipelines

from plan_fuzz import Tally, check_plan, fuzz_one, fuzz_problem
from test_pipeline_search import brute_pipelines

SEEDS = [*range(8), 41]  # 41: its sync parts are searched (0-7 prune them all at once), so a deadline cuts them
# (33 did before NOTE [sync topology floor]: its parts' charges and fewer cells put its draw at the search's end)


def test_no_false_claim_on_any_path():
    """Every seeded problem through the bound's deadline cuts, the search under tiny and short limits, a
    --strategy baseline and a re-plan: no false claim, and the deadline paths were taken (so they were checked)."""
    tally = Tally()
    for seed in SEEDS:
        fuzz_one(seed, tally, limits=(0.001, 0.05, 0.3))
    assert tally.unsound == []
    for path in ("bound bound-cut-pipelines", "bound bound-cut-sync", "bound bound-cut-memory",
                 "search search-failed", "search baseline-taken", "strategy", "replan", "replan replan-from-memo"):
        assert tally.paths[path] > 0, (path, dict(tally.paths))


def test_the_checks_catch_a_false_certificate():
    """The checks are not vacuous: a plan whose printed step, bound or status is off is reported (problem 6:
    megatron's plan is slower than the optimum; on problem 4 it is the optimum since base19's baselines)."""
    p, M, _ = fuzz_problem(6)
    opt = brute_pipelines(p, M)
    plan = plan_pipelines(p, M, time_limit_s=5)
    assert check_plan(p, M, plan, opt, 0.0) == []
    assert any("re-costing" in x for x in check_plan(p, M, replace(plan, iteration_ns=plan.iteration_ns + 1), opt, 0))
    assert any("bound" in x for x in check_plan(p, M, replace(plan, lower_bound_ns=opt + 1), opt, 0.0))
    assert any("WITHIN_GAP" in x for x in check_plan(p, M, replace(plan, solver_status="WITHIN_GAP"), opt, 0.0))
    assert any("idle" in x for x in check_plan(p, M, replace(plan, devices_idle={}), opt, 0.0)) == bool(
        plan.devices_idle)
    slower = [b.plan for b in pipeline_baselines(p, M, time_limit_s=5) if b.plan and b.plan.iteration_ns > opt][0]
    claimed = cost_pipelines(p, slower.pipelines, solver_status="OPTIMAL", lower_bound_ns=slower.iteration_ns)
    assert any("OPTIMAL" in x for x in check_plan(p, M, claimed, opt, 0.0))


def test_a_plan_at_the_bound_reads_optimal():
    """planfuzz problem 3 (inference, outputs of no bytes, 4 microbatches): the search's plan, 314 ns, is the
    brute-force optimum and the bound reaches it. The bound was floored after its float margin (313 ns), so no
    `--parallel data` plan could read OPTIMAL (0 of planfuzz's first 300); as whole ns it is its ceiling."""
    p, M, gen = fuzz_problem(3)
    assert gen == "tight"
    opt = brute_pipelines(p, M)
    plan = plan_pipelines(p, M, time_limit_s=10)
    assert check_plan(p, M, plan, opt, 0.0) == []
    assert plan.iteration_ns == opt == plan.lower_bound_ns == 314 and plan.solver_status == "OPTIMAL"


def test_a_join_onto_another_machine_of_the_kind_is_not_quoted_as_one():
    """NOTE [join probe]: machines of a kind are interchangeable, so a joined plan that runs on the added machine
    and leaves another of its kind out adds nothing (review19: seeds 30 and 110 at 0.3 s quoted "adding one mid
    machine to pipeline 0 gives 813 ns (+0.0%)" for the same one-machine pipeline moved; at 1 and 3 s too, so
    3 s: a loaded machine still reaches the probe)."""
    from plan_fuzz import run_search

    for seed in (30, 110):
        p, M, _ = fuzz_problem(seed)
        bad, paths, _ = run_search(p, M, brute_pipelines(p, M), 3.0, 0.0, seed)
        assert bad == [] and "join-quoted" in paths, (seed, bad)
