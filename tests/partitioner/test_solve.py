"""The strategy (NOTE [solve strategy]): SolveOptions, its switches, and SolveStats."""

import dataclasses
import json

import pytest

from hetpart.errors import HetpartError
from hetpart.partitioner import SolveOptions, SolveStats, dp_hint, solve, verify_plan

from partition_cases import brute_force, random_large, random_problem

STEPS = ("run_dp", "run_bounds", "run_ideal_dp", "run_cpsat")


def _solvable(seeds=range(20)):
    """Small random problems with a plan, and their brute-force optimum."""
    for seed in seeds:
        p = random_problem(seed)
        if (want := brute_force(p)) is not None:
            yield p, want


def test_unknown_keywords_are_a_type_error_naming_them():
    p = random_large(5, 30)
    with pytest.raises(TypeError, match="time_limt_s, wokers"):
        solve(p, time_limt_s=5, wokers=2)


@pytest.mark.parametrize("field, value", [
    ("time_limit_s", 0), ("workers", 0), ("objective", "speed"), ("microbatches", 0), ("gap", 1.0),
    ("dp_share", 0.0), ("ideal_share", 1.5), ("coarsen_above", -1), ("ideal_max", 0), ("coarse_nodes", 2.5),
])
def test_bad_options_are_refused_once_naming_the_field(field, value):
    name = field.replace("_s", "").replace("_", " ") if field == "time_limit_s" else field
    with pytest.raises(HetpartError, match=name):
        SolveOptions(**{field: value})
    with pytest.raises(HetpartError, match=name):  # the same check when the field is a keyword of solve
        solve(random_large(5, 30), **{field: value})


def test_keywords_override_the_options_given():
    p = random_large(5, 30)
    opts = SolveOptions(time_limit_s=5, run_ideal_dp=False)
    plan = solve(p, opts, run_cpsat=False)
    assert plan.stats.ideal_seconds is None and plan.stats.cpsat_seconds is None  # both switches held
    assert opts.run_cpsat  # the options given are not changed
    assert solve(p, opts).stats.cpsat_seconds is not None


@pytest.mark.parametrize("step", STEPS)
def test_each_switch_leaves_its_step_out_and_the_plan_stays_optimal(step):
    seen = 0
    for p, want in _solvable(range(0, 20, 2)):
        plan = solve(p, time_limit_s=10, **{step: False})
        verify_plan(p, plan)
        stats = plan.stats
        assert {"run_dp": stats.dp_seconds, "run_bounds": stats.bounds_seconds, "run_ideal_dp": stats.ideal_seconds,
                "run_cpsat": stats.cpsat_seconds}[step] is None
        if step == "run_dp":
            assert stats.dp_bottleneck_ns is None
        if step == "run_bounds":
            assert plan.bounds.lp_work_ns == plan.bounds.stage_sum_ns == plan.bounds.sequence_ns == 0
        if step != "run_cpsat":  # CP-SAT (or the ideal DP before it) proves the optimum without the step
            assert plan.bottleneck_ns == want and plan.solver_status == "OPTIMAL"
        else:
            assert plan.bottleneck_ns >= want and plan.lower_bound_ns <= want
        seen += 1
    assert seen >= 5


def test_with_every_step_off_there_is_no_plan_and_the_error_says_so():
    with pytest.raises(HetpartError, match="no plan found"):
        solve(random_large(5, 30), time_limit_s=1, **dict.fromkeys(STEPS, False))


def test_coarsening_switch_and_size():
    p = random_large(11, 80)
    assert not solve(p, time_limit_s=5, run_ideal_dp=False).stats.coarsened  # 80 nodes: under 1,000
    coarse = solve(p, time_limit_s=5, run_ideal_dp=False, coarsen_above=0)
    assert coarse.stats.coarsened and coarse.stats.coarse_nodes > 0
    off = solve(p, time_limit_s=5, run_ideal_dp=False, coarsen_above=0, run_coarsening=False)
    assert not off.stats.coarsened and off.stats.cpsat_seconds is not None
    for plan in (coarse, off):
        verify_plan(p, plan)


def test_stats_to_json_keeps_the_flat_keys_of_plan_json_and_the_benchmarks():
    p = random_large(3, 30)
    fine = solve(p, time_limit_s=5, run_ideal_dp=False).stats
    assert isinstance(fine, SolveStats)
    got = fine.to_json()
    assert {"dp_seconds", "bounds_seconds", "build_seconds", "cpsat_seconds", "variables", "constraints",
            "max_stages", "presolve_inclusion_off", "dp_bottleneck_ns", "solver_bound_ns"} <= set(got)
    assert all(isinstance(v, float) for v in got.values()) and json.loads(json.dumps(got)) == got
    assert got["presolve_inclusion_off"] == 0.0 and "coarsened" not in got and "cpsat_not_built" not in got
    assert [k for k in got if k.startswith("plan_from_")] == [f"plan_from_{fine.plan_from}"]
    assert got["variables"] == fine.variables > 0
    coarse = solve(p, time_limit_s=5, run_ideal_dp=False, coarsen_above=0).stats.to_json()
    assert coarse["coarsened"] == 1.0 and coarse["coarse_nodes"] > 0 and "coarse_solver_status_optimal" in coarse
    assert "cpsat_seconds" not in coarse and "coarse_cpsat_seconds" in coarse  # CP-SAT ran on the coarse problem


def test_certificate_switch():
    p, _ = next(_solvable())
    assert solve(p, time_limit_s=5, check_certificate=False).stats.certificate_seconds is None
    checked = solve(p, time_limit_s=5, check_certificate=True)
    assert checked.stats.certificate_seconds is not None and checked.certificate.checked_by == "brute_force"


def test_the_limits_reach_their_engines():
    p = random_large(3, 60)
    assert solve(p, time_limit_s=5, run_ideal_dp=False).bounds.sequence_ns > 0
    assert solve(p, time_limit_s=5, run_ideal_dp=False, sequence_max_states=1).bounds.sequence_ns == 0
    assert dp_hint(p).stats["dp_exact"] == 1.0
    assert dp_hint(p, budget=1).stats["dp_exact"] == 0.0  # SolveOptions.dp_budget: classes merged


def test_options_are_a_frozen_value():
    opts = SolveOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.gap = 0.5
    assert dataclasses.replace(opts, gap=0.5).gap == 0.5 and opts.gap == 0.0
