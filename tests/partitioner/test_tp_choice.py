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


def test_the_bound_taken_from_another_degree_brings_its_bounds_and_certificate():
    # NOTE [bound over a union]: degree 2's plan is kept, degree 1's bound is the plan's: so are its bounds and
    # certificate (cert20: they were degree 2's, stating 90 beside a plan bound of 60), and the union names both.
    import dataclasses

    from hetpart.partitioner.problem import Certificate

    p = random_problem(0)
    plan = solve(p, time_limit_s=5)
    one = dataclasses.replace(plan, bottleneck_ns=100, objective_ns=100, lower_bound_ns=60, solver_status="FEASIBLE",
                              bounds=dataclasses.replace(plan.bounds, solver_ns=60), certificate=Certificate("one", ""))
    two = dataclasses.replace(plan, bottleneck_ns=90, objective_ns=90, lower_bound_ns=90, solver_status="OPTIMAL",
                              bounds=dataclasses.replace(plan.bounds, solver_ns=90), certificate=Certificate("two", ""))
    answers = iter([one, two])
    choice = choose_degree({1: p, 2: p}, lambda q: next(answers))
    assert choice.degree == 2 and choice.plan.bound_problem == "TP 1"
    assert choice.plan.certificate.bound_source == "one" and choice.plan.bounds.solver_ns == 60
    assert [(b.problem, b.bound_ns, b.certificate.bound_source) for b in choice.plan.union] == [
        ("TP 1", 60, "one"), ("TP 2", 90, "two")]
    answers = iter([dataclasses.replace(one, lower_bound_ns=90), two])  # a tie: the plan's own problem's
    choice = choose_degree({1: p, 2: p}, lambda q: next(answers))
    assert choice.plan.bound_problem == "TP 2" and choice.plan.certificate.bound_source == "two"


# --- NOTE [mixed tensor-parallel degrees]: a degree per machine, against brute force over every assignment.

import dataclasses as _dc
import itertools
import random

from hetpart.partitioner.costs import stage_activation_bytes, stage_memory_bytes
from hetpart.partitioner.evaluate import evaluate
from hetpart.partitioner.problem import COLOCATE, MEM_BYTES, TIME_NS, WEIGHTS, Device, Link, Training
from hetpart.partitioner.tp_choice import TPSlot, choose_mixed, mixed_problem
from tests.partitioner.partition_cases import make_problem


def degree_problems(seed: int):
    """Degree 1: 2 machines of 2 devices (types a, b); degree 2: one group per machine, its own times and a
    smaller memory (half of some nodes' and weights'), sometimes a co-located region; sometimes training."""
    rng = random.Random(seed)
    n = rng.randint(2, 5)
    names = [f"n{i}" for i in range(n)]
    weights = {"w0": rng.randint(2, 12), "w1": rng.randint(2, 12)}
    nodes = {v: {"time": {"a": rng.randint(5, 60), "b": rng.randint(5, 60)}, "mem": rng.randint(0, 8),
                 "out": rng.choice([0, 10, 100, 1000]), "weights": [w for w in sorted(weights) if rng.random() < 0.4]}
             for v in names}
    edges = [(u, v) for i, u in enumerate(names) for v in names[i + 1:] if rng.random() < 0.5]
    cap = lambda: rng.choice([14, 24, 40, 1000])  # noqa: E731
    caps = [cap(), cap()]
    devices = [Device("d0", "a", "m0", caps[0]), Device("d1", "a", "m0", caps[0]),
               Device("d2", "b", "m1", caps[1]), Device("d3", "b", "m1", caps[1])]
    p1 = make_problem(nodes, edges, devices, weights=weights, intra=Link(rng.choice([100, 1000]), 5),
                      network=Link(rng.choice([10, 100]), 50), max_stages=rng.choice([None, None, 3]))
    if rng.random() < 0.5:
        p1.training = Training(rng.choice(["gpipe", "1f1b"]), 2, {w: 2 * b for w, b in weights.items()})
    g2 = p1.graph.copy()
    for v, a in g2.nodes(data=True):
        # TP pays on m0's fast link (a), less on m1's (b): the best plan is often mixed
        a[TIME_NS] = {"a/tp2": a[TIME_NS]["a"] // 2 + rng.randint(0, 10),
                      "b/tp2": a[TIME_NS]["b"] + rng.randint(-5, 20)}
        a[MEM_BYTES] = a[MEM_BYTES] // 2 if rng.random() < 0.6 else a[MEM_BYTES]
    if n >= 3 and rng.random() < 0.5:
        for v in names[1:3]:
            g2.nodes[v][COLOCATE] = "region"
    split = {w for w in weights if rng.random() < 0.7}
    half = lambda d: {w: -(-b // 2) if w in split else b for w, b in d.items()}  # noqa: E731
    train2 = _dc.replace(p1.training, state_bytes=half(p1.training.state_bytes)) if p1.training else None
    p2 = _dc.replace(p1, graph=g2, weights=half(weights), training=train2,
                     devices=[Device("d0+d1", "a/tp2", "m0", caps[0]), Device("d2+d3", "b/tp2", "m1", caps[1])])
    slots = {1: [TPSlot(d.name, (d.name,), d.node, d.type, 1) for d in devices],
             2: [TPSlot("d0+d1", ("d0", "d1"), "m0", "a", 2), TPSlot("d2+d3", ("d2", "d3"), "m1", "b", 2)]}
    return {1: p1, 2: p2}, slots


def brute_mixed(problems, slots):
    """The least plan value over the uniform degrees and every degree per machine (each its own problem)."""
    values = [brute_force(p) for p in problems.values()]
    places = sorted({s.place for ss in slots.values() for s in ss})
    for degrees in itertools.product(sorted(problems), repeat=len(places)):
        of = dict(zip(places, degrees))
        values.append(brute_force(mixed_problem(problems, [s for ss in slots.values() for s in ss
                                                           if of[s.place] == s.degree])))
    return min((v for v in values if v is not None), default=None)


def test_mixed_degrees_bound_and_plan_against_brute_force_over_every_assignment():
    checked = optimal = strictly_mixed = 0
    for seed in range(40):
        problems, slots = degree_problems(seed)
        best = brute_mixed(problems, slots)
        if best is None:
            continue
        uniform = min((v for v in map(brute_force, problems.values()) if v is not None), default=None)
        choice = choose_mixed(problems, slots, lambda p, hint=None: solve(p, time_limit_s=5, seed=0, hint=hint))
        assert choice.plan.lower_bound_ns <= best <= choice.plan.value_ns, seed  # a valid bound; a real plan
        assert choice.plan.solver_status != "OPTIMAL" or choice.plan.value_ns == best, seed
        optimal += choice.plan.solver_status == "OPTIMAL"
        if uniform is None or best < uniform:  # only a mixed plan is optimal: the choice found one
            assert choice.is_mixed, seed
            strictly_mixed += choice.plan.value_ns == best
        checked += 1
    assert checked >= 28 and optimal >= 18 and strictly_mixed >= 4, (checked, optimal, strictly_mixed)


def test_a_mixed_problem_charges_each_stage_its_own_degrees_memory_and_time():
    for seed in range(20):
        problems, slots = degree_problems(seed)
        chosen = [slots[1][2], slots[1][3], slots[2][0]]  # m1's single devices, m0's TP-2 group
        mixed = mixed_problem(problems, chosen)
        nodes = list(mixed.graph.nodes)
        for k in range(1, len(nodes)):  # every split of the order into two stages, on each order of two slots
            stage_of = {v: int(i >= k) for i, v in enumerate(nodes)}
            for pair in (("d0+d1", "d2"), ("d3", "d0+d1")):
                for s in evaluate(mixed, stage_of, list(pair)):
                    own = problems[2 if "+" in s.device else 1]
                    held = {w: 1 for v in s.nodes for w in own.graph.nodes[v][WEIGHTS]}
                    assert s.memory_bytes == stage_memory_bytes(own, stage_activation_bytes(own, s.nodes), held,
                                                                s.index, 2), seed
                    key = own.device(s.device).type
                    assert s.compute_ns == sum(own.graph.nodes[v][TIME_NS][key] for v in s.nodes)


def test_each_engine_alone_plans_a_mixed_problem_with_each_slots_own_memory():
    # CP-SAT alone is exact on these; a model that took the type-free (least) memory would plan what
    # evaluate rejects, one that took the whole memory a worse plan. The DP alone: a valid plan, never better.
    from hetpart.partitioner.coarsen import coarsen
    from hetpart.partitioner.dp import order_tables

    checked = 0
    for seed in range(40):
        problems, slots = degree_problems(seed)
        mixed = mixed_problem(problems, [slots[1][2], slots[1][3], slots[2][0]])
        best = brute_force(mixed)
        if best is None:
            continue
        cpsat = solve(mixed, time_limit_s=5, run_dp=False, run_ideal_dp=False, run_coarsening=False)
        assert cpsat.value_ns == best, seed
        dp = solve(mixed, time_limit_s=5, run_cpsat=False, run_bounds=False)
        assert dp.value_ns >= best, seed
        coarse = coarsen(mixed, order_tables(mixed), [0, 1, mixed.graph.number_of_nodes()]).problem
        whole = evaluate(mixed, {v: 0 for v in mixed.graph.nodes}, ["d0+d1"])[0].memory_bytes
        assert evaluate(coarse, {v: 0 for v in coarse.graph.nodes}, ["d0+d1"])[0].memory_bytes == whole, seed
        checked += 1
    assert checked >= 25
