"""Issue 17's presolve bug in `partition`'s model (NOTE [int32 activities]) and its checked certificates."""

from __future__ import annotations

import dataclasses

from hetpart.errors import HetpartError
from hetpart.partitioner import TIME_NS, SolveOptions, solve, verify_plan

from partition_cases import brute_force, random_problem


def _slow_ops(seed: int):
    """random_problem(seed) with op times of 0.03-1.2 s: stage sums pass 2**31 ns (NOTE [int32 activities])."""
    p = random_problem(seed)
    g = p.graph.copy()
    for v in g.nodes:
        g.nodes[v][TIME_NS] = {t: ns * 30_000_000 for t, ns in g.nodes[v][TIME_NS].items()}
    return dataclasses.replace(p, graph=g)


def test_partition_cpsat_claim_is_sound_on_ops_of_seconds():
    # cpsat.py's side of NOTE [int32 activities]: presolve without its inclusion step.
    for seed in (94, 105, 115, 116):  # each claimed a bound above the optimum before
        p = _slow_ops(seed)
        plan = solve(p, time_limit_s=10, check_certificate=False, run_ideal_dp=False)
        assert plan.stats.presolve_inclusion_off
        assert plan.lower_bound_ns <= brute_force(p) <= plan.value_ns


def test_partition_claim_from_cpsat_refuted_and_downgraded():
    # The same presolve bug in `partition`'s model with the workaround taken out: CP-SAT alone
    # claims a bound above the optimum, and the check catches it.
    unsafe = SolveOptions(int32_safe_ns=2**62, run_ideal_dp=False)
    p = _slow_ops(115)
    optimum = brute_force(p)
    trusted = solve(p, unsafe, time_limit_s=10, check_certificate=False)
    assert trusted.solver_status == "OPTIMAL" and trusted.lower_bound_ns > optimum
    assert trusted.certificate.bound_source == "cpsat_objective_bound"
    checked = solve(p, unsafe, time_limit_s=10, check_certificate=True)
    verify_plan(p, checked)
    assert checked.certificate.verdict == "refuted" and checked.certificate.checked_by == "brute_force"
    assert checked.solver_status == "FEASIBLE" and checked.lower_bound_ns <= optimum == checked.value_ns


def test_partition_certificates_name_their_source_and_are_confirmed():
    for seed in range(4):
        p = random_problem(seed)
        try:
            plan = solve(p, time_limit_s=10, check_certificate=True)
        except HetpartError:
            continue  # no plan fits
        assert plan.certificate.bound_source in {"cpsat_objective_bound", "ideal_dp", "sequence", "stage_sum",
                                                 "lp_work", "single_op"}
        if plan.solver_status in ("OPTIMAL", "WITHIN_GAP"):
            assert plan.certificate.verdict == "confirmed"
            assert plan.certificate.reproved_bound >= plan.lower_bound_ns
