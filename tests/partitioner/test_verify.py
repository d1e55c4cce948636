import dataclasses

import pytest

from hetpart.errors import HetpartError
from hetpart.partitioner import Device, PlanError, dp_hint, solve, verify_plan

from partition_cases import chain, make_problem, random_large, random_problem


def _chain_problem():
    nodes, edges = chain(4, {"g": 10}, out=10, mem=10)
    nodes["op0"]["pin"] = "first"
    nodes["op3"]["pin"] = "last"
    return make_problem(nodes, edges, [Device(f"g{i}", "g", "m0", 25) for i in range(3)])


def _broken(plan, **changes):
    return dataclasses.replace(plan, **changes)


def _violations(problem, plan) -> str:
    with pytest.raises(PlanError) as err:
        verify_plan(problem, plan)
    assert isinstance(err.value, HetpartError)
    return str(err.value)


def test_valid_plan_passes():
    p = _chain_problem()
    verify_plan(p, solve(p, time_limit_s=5))


def test_rejects_backward_edge():
    p = _chain_problem()
    plan = solve(p, time_limit_s=5)
    s = dict(plan.stage_of)
    s["op1"], s["op2"] = s["op2"], s["op1"]  # op1 -> op2 now goes backwards
    msg = _violations(p, _broken(plan, stage_of=s))
    assert "'op1' -> 'op2' goes backwards" in msg


def test_rejects_missing_node_and_unknown_node():
    p = _chain_problem()
    plan = solve(p, time_limit_s=5)
    s = dict(plan.stage_of)
    del s["op2"]
    s["ghost"] = 0
    msg = _violations(p, _broken(plan, stage_of=s))
    assert "nodes without a stage: ['op2']" in msg and "'ghost'" in msg


def test_rejects_over_memory_and_lists_all_violations():
    p = _chain_problem()
    plan = solve(p, time_limit_s=5)
    s = {v: 0 for v in plan.stage_of}  # everything in stage 0 of 2: over memory, empty stage 1, pin
    msg = _violations(p, _broken(plan, stage_of=s))
    assert "over its capacity of 25" in msg
    assert "hold no node" in msg
    assert "pinned 'last'" in msg


def test_rejects_wrong_claimed_bottleneck_and_bad_bound():
    p = _chain_problem()
    plan = solve(p, time_limit_s=5)
    assert "claims bottleneck" in _violations(p, _broken(plan, bottleneck_ns=plan.bottleneck_ns - 1))
    assert "exceeds the plan's bottleneck" in _violations(p, _broken(plan, lower_bound_ns=plan.bottleneck_ns + 1))


def test_rejects_empty_stage_and_device_used_twice():
    p = _chain_problem()
    plan = solve(p, time_limit_s=5)
    n = len(plan.device_of_stage)
    twice = _broken(plan, device_of_stage=[plan.device_of_stage[0]] * n)
    assert "used by more than one stage" in _violations(p, twice)
    extra = _broken(plan, device_of_stage=plan.device_of_stage + ["g2" if "g2" not in plan.device_of_stage else "g0"])
    msg = _violations(p, extra)
    assert f"stages [{n}] hold no node" in msg


def test_rejects_unknown_device():
    p = _chain_problem()
    plan = solve(p, time_limit_s=5)
    bad = _broken(plan, device_of_stage=["tpu9"] + plan.device_of_stage[1:])
    assert "unknown slots ['tpu9']" in _violations(p, bad)


@pytest.mark.parametrize("seed", range(10))
def test_dp_hint_passes_verifier(seed):
    p = random_problem(seed)
    plan = dp_hint(p)
    if plan is not None:
        verify_plan(p, plan)


def test_dp_hint_passes_verifier_large():
    p = random_large(1, 300)
    verify_plan(p, dp_hint(p))
