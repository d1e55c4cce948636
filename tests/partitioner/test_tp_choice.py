"""NOTE [tensor-parallel degree choice]: the degree kept and its bound, against brute force on small problems."""

from hetpart.partitioner import solve
from hetpart.partitioner.certificate import brute_force
from hetpart.partitioner.tp_choice import choose_degree
from tests.partitioner.partition_cases import random_problem


def test_the_least_bound_over_degrees_bounds_the_best_plan_of_their_union():
    checked = optimal = 0
    for seed in range(40):
        # Two "degrees": two problems over the same kind of cluster, as lowering gives one per degree.
        problems = {1: random_problem(seed), 2: random_problem(seed + 1000)}
        best = [v for v in (brute_force(p) for p in problems.values()) if v is not None]
        if not best:
            continue
        choice = choose_degree(problems, lambda p: solve(p, time_limit_s=5, seed=0))
        assert choice.plan.lower_bound_ns <= min(best), seed  # a valid bound of the union
        assert choice.plan.value_ns >= min(best)
        values = {r.degree: r.value_ns for r in choice.results if r.value_ns is not None}
        assert choice.plan.value_ns == min(values.values()) and values[choice.degree] == choice.plan.value_ns
        if choice.plan.solver_status == "OPTIMAL":
            assert choice.plan.value_ns == min(best), seed
            optimal += 1
        checked += 1
    assert checked >= 30 and optimal >= 20  # the check ran, and mostly on proven answers


def test_a_degree_proven_optimal_alone_is_not_optimal_over_the_union():
    import dataclasses

    p = random_problem(0)
    plan = solve(p, time_limit_s=5)
    answers = iter([dataclasses.replace(plan, bottleneck_ns=100, objective_ns=100, lower_bound_ns=60, solver_status="FEASIBLE"),
                    dataclasses.replace(plan, bottleneck_ns=90, objective_ns=90, lower_bound_ns=90, solver_status="OPTIMAL"), None])
    choice = choose_degree({1: p, 2: p, 4: p}, lambda q: next(answers))  # solved in degree order
    assert choice.degree == 2 and choice.plan.lower_bound_ns == 60 and choice.plan.solver_status == "FEASIBLE"
    assert [(r.degree, r.value_ns) for r in choice.results] == [(1, 100), (2, 90), (4, None)]
