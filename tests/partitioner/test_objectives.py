import pytest

from hetpart.errors import HetpartError
from hetpart.partitioner import Device, solve, verify_plan
from hetpart.partitioner.evaluate import objective_ns

from partition_cases import brute_force, chain, make_problem, random_problem


@pytest.mark.parametrize("objective", ["latency", "iteration"])
@pytest.mark.parametrize("seed", range(25))
def test_objectives_match_brute_force(seed, objective):
    p = random_problem(seed)
    want = brute_force(p, objective, microbatches=4)
    if want is None:
        with pytest.raises(HetpartError):
            solve(p, time_limit_s=5, objective=objective, microbatches=4)
        return
    plan = solve(p, time_limit_s=5, objective=objective, microbatches=4)
    verify_plan(p, plan)
    assert plan.objective == objective and plan.objective_ns == want
    assert plan.objective_ns == objective_ns(plan.stages, objective, 4)
    assert plan.lower_bound_ns <= want
    assert plan.solver_status == "OPTIMAL" and plan.gap == 0.0


def test_latency_keeps_one_stage_when_memory_allows():
    # Splitting only adds transfers to the sum of stage times.
    nodes, edges = chain(4, {"g": 10}, out=1)
    p = make_problem(nodes, edges, [Device("g0", "g", "m0", 1000), Device("g1", "g", "m0", 1000)])
    assert len(solve(p, time_limit_s=5).device_of_stage) == 2  # throughput splits
    plan = solve(p, time_limit_s=5, objective="latency")
    assert len(plan.device_of_stage) == 1 and plan.objective_ns == 40


def test_iteration_trades_fill_time_against_bottleneck():
    # 2 stages: bottleneck 21 (20 + 1 ns of transfer), sum 42 -> 42 + (M-1) * 21.
    # 1 stage: 40 -> 40 + (M-1) * 40. With M = 1 one stage wins; with M = 4 two stages win.
    nodes, edges = chain(4, {"g": 10}, out=1)
    p = make_problem(nodes, edges, [Device("g0", "g", "m0", 1000), Device("g1", "g", "m0", 1000)])
    one = solve(p, time_limit_s=5, objective="iteration", microbatches=1)
    four = solve(p, time_limit_s=5, objective="iteration", microbatches=4)
    assert (len(one.device_of_stage), one.objective_ns) == (1, 40)
    assert (len(four.device_of_stage), four.objective_ns) == (2, 42 + 3 * 21)


def test_unknown_objective_is_a_user_error():
    nodes, edges = chain(2, {"g": 10})
    p = make_problem(nodes, edges, [Device("g0", "g", "m0", 1000)])
    with pytest.raises(HetpartError, match="unknown objective 'speed'"):
        solve(p, objective="speed")
