"""The bounds on large clusters: per device type where the multisets or states are too many
(NOTE [stage-sum bound by types], NOTE [sequence bound by types]), checked against the exact
bounds and brute force on small problems; bounds past their deadline reported as left out
(NOTE [bounds deadline]), and what searched (NOTE [what ran])."""

import random
import time

import pytest

from hetpart.partitioner import Device, Link, solve
from hetpart.partitioner import bounds as bounds_module
from hetpart.partitioner import cpsat
from hetpart.partitioner.bounds import compute_bounds, left_out, sequence_bound_ns
from hetpart.partitioner.certificate import _plan_count, brute_force
from hetpart.partitioner.problem import PIN_FIRST, PIN_LAST, Training
from hetpart.partitioner.solve import SolveOptions

from partition_cases import make_problem

SEEDS = range(40)


def _problem(seed: int):
    """3 or 4 devices of 2 or 3 types over 2 machines (one type on both), 2..5 nodes, memory that
    binds now and then, sometimes training; every machine its own link."""
    rng = random.Random(seed)
    n = rng.randint(2, 5)
    names = [f"n{i}" for i in range(n)]
    types = ["a", "b", "c"][: rng.randint(2, 3)]
    weights = {"w0": rng.randint(1, 8), "w1": rng.randint(1, 8)}
    nodes = {v: {"time": {t: rng.randint(1, 40) for t in types}, "mem": rng.randint(0, 6),
                 "out": rng.choice([0, 10, 100, 1000, 5000]),
                 "weights": [w for w in sorted(weights) if rng.random() < 0.3]} for v in names}
    if rng.random() < 0.4:
        nodes[names[0]]["pin"] = PIN_FIRST
    if rng.random() < 0.4:
        nodes[names[-1]]["pin"] = PIN_LAST
    edges = [(u, v) for i, u in enumerate(names) for v in names[i + 1:] if rng.random() < 0.5]
    cap = lambda: rng.choice([12, 20, 40, 1000])  # noqa: E731
    devices = [Device("d0", "a", "m0", cap()), Device("d1", "a", "m1", cap()), Device("d2", types[1], "m1", cap())]
    if rng.random() < 0.5:
        devices.append(Device("d3", types[-1], rng.choice(["m0", "m1"]), cap()))
    p = make_problem(nodes, edges, devices, weights=weights, network=Link(rng.choice([10, 100, 1000]),
                                                                           rng.choice([0, 20, 200])),
                     max_stages=rng.choice([None, None, 2]))
    p.intra_node_links = {"m0": Link(rng.choice([100, 10_000]), rng.choice([0, 5])),
                          "m1": Link(rng.choice([300, 3000]), rng.choice([0, 50]))}
    if rng.random() < 0.3:
        p.training = Training(rng.choice(["gpipe", "1f1b"]), rng.randint(1, 3), {w: rng.randint(0, 9) for w in weights})
    return p


@pytest.mark.parametrize("seed", SEEDS)
def test_the_bounds_by_types_are_valid_and_at_most_the_exact_ones(seed):
    p = _problem(seed)
    if _plan_count(p) > 20_000:
        pytest.skip("too many plans to enumerate")
    optimum = brute_force(p)
    exact = compute_bounds(p)
    # No multiset is few enough: the stage-sum bound runs per (types used, stage count).
    typed = compute_bounds(p, stage_sum_max_multisets=0)
    assert "stage_sum" in typed.by_types and "stage_sum" not in exact.by_types
    assert typed.stage_sum_ns <= exact.stage_sum_ns
    # Too many (type, machine) states: the sequence bound runs on types, relaxed links.
    states = 2 ** len(set(d.type for d in p.devices))
    seq = compute_bounds(p, sequence_max_states=states)
    assert seq.by_types == ("sequence",) or seq.skipped == ("sequence",)
    if optimum is None:
        return
    for b in (exact, typed, seq):
        assert b.stage_sum_ns <= optimum and b.sequence_ns <= optimum and b.lower_bound_ns <= optimum, b
    assert sequence_bound_ns(p) <= optimum


def test_the_cases_above_cover_what_the_bounds_by_types_relax():
    """Only as good as the cases: types on two machines, binding memory, nonzero bounds by types."""
    spread, binding, positive, checked = 0, 0, 0, 0
    for seed in SEEDS:
        p = _problem(seed)
        if _plan_count(p) > 20_000 or brute_force(p) is None:
            continue
        checked += 1
        spread += len({d.node for d in p.devices if d.type == "a"}) == 2
        binding += min(d.capacity_bytes for d in p.devices) < 40
        positive += compute_bounds(p, stage_sum_max_multisets=0, sequence_max_states=8).lower_bound_ns > 0
    assert checked >= 25 and spread == checked and binding >= 10 and positive >= checked - 2


def test_past_the_deadline_the_sequence_bound_and_the_model_build_no_tables(monkeypatch):
    # The sequence bound's knapsack tables and the CP-SAT model's cost tables take seconds on thousands of
    # nodes (docs/benchmarks.md, "solvelimit"): past the deadline neither is built, the bound left out.
    built = []
    for module, name in ((bounds_module, "_cap_tables"), (cpsat, "node_time_ns")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _real=real, _name=name, **k: built.append(_name) or _real(*a, **k))
    p = _problem(3)
    late = compute_bounds(p, deadline=time.perf_counter() - 1)
    assert "sequence" in late.unfinished and late.sequence_ns == 0 and "_cap_tables" not in built
    answer = cpsat.solve_model(p, objective="throughput", microbatches=1, bottleneck_lb_ns=0, external_lb_ns=0,
                               hint=None, fallback=None, gap=0.0, seed=0, workers=1, t0=time.perf_counter() - 10,
                               time_limit_s=1)
    assert answer.status == "NOT_BUILT" and built == []
    assert compute_bounds(p).unfinished == () and "_cap_tables" in built  # (the counting sees the calls)


def test_a_bound_past_its_deadline_is_left_out_and_named():
    p = _problem(3)
    # bounds_share 1e-9 of the limit: past the bounds' deadline before they start (no sleeps).
    late = solve(p, SolveOptions(time_limit_s=5, bounds_share=1e-9))
    assert set(late.bounds.unfinished) == {"stage_sum", "sequence"} and late.bounds.stage_sum_ns == 0
    words = left_out(late.bounds.to_json())
    assert "stage_sum left out (not finished by its deadline)" in words and "sequence left out" in words
    on_time = solve(p, SolveOptions(time_limit_s=5))
    assert on_time.bounds.unfinished == () and left_out(on_time.bounds.to_json()) == ""
    assert late.lower_bound_ns <= on_time.lower_bound_ns
    typed = solve(p, SolveOptions(time_limit_s=5, stage_sum_max_multisets=1, sequence_max_states=8))
    assert typed.bounds.to_json()["by_types"] == ["stage_sum", "sequence"]
    assert left_out(typed.bounds.to_json()) == "stage_sum run per device type (weaker); sequence run per device type (weaker)"


def test_the_plan_says_what_searched():
    p = _problem(5)
    off = solve(p, SolveOptions(time_limit_s=5, run_cpsat=False, run_ideal_dp=False))
    assert off.bounds.search == "CP-SAT did not run (switched off); kept the DP's plan"
    ran = solve(p, SolveOptions(time_limit_s=5, run_ideal_dp=False))
    assert ran.bounds.search.startswith("CP-SAT ran (") or ran.bounds.search.startswith("no search needed")
    coarse = solve(p, SolveOptions(time_limit_s=5, coarsen_above=1, coarse_nodes=2, run_ideal_dp=False))
    assert "coarse" in coarse.bounds.search and coarse.bounds.to_json()["search"] == coarse.bounds.search


def test_the_sequence_bound_by_types_takes_the_best_link_of_a_type_pair():
    # Type a on two machines: two a-stages on m0 talk over its fast link, across machines over the
    # slow network. The best plan uses the fast link, so a bound that costed a->a at the slow one
    # would exceed it.
    nodes = {f"n{i}": {"time": {"a": 30, "b": 30}, "out": 300} for i in range(4)}
    nodes["n0"]["pin"], nodes["n3"]["pin"] = PIN_FIRST, PIN_LAST  # every boundary carries a value
    edges = [(f"n{i}", f"n{i + 1}") for i in range(3)]
    devices = [Device("d0", "a", "m0", 10**6), Device("d1", "a", "m0", 10**6), Device("d2", "a", "m1", 10**6),
               Device("d3", "b", "m1", 10**6)]
    p = make_problem(nodes, edges, devices, network=Link(10, 100))
    p.intra_node_links = {"m0": Link(100_000, 0), "m1": Link(20, 0)}
    optimum = brute_force(p)
    typed = compute_bounds(p, sequence_max_states=4)
    assert typed.by_types == ("sequence",)
    assert 0 < typed.sequence_ns <= optimum
