"""NOTE [striped pipelines]: f pipelines taking 1/f of the same machines, against brute force on small problems."""

from __future__ import annotations

import time

import networkx as nx
import pytest

from hetpart.errors import HetpartError
from hetpart.partitioner import TIME_NS, WEIGHTS, Device, Link
from hetpart.partitioner.certificate import valid_plans
from hetpart.partitioner.pipeline_bounds import pipelines_lower_bound
from hetpart.partitioner.pipeline_search import plan_pipelines
from hetpart.partitioner.pipeline_stripes import stripe_devices, stripe_probe, stripe_sets, striped
from hetpart.partitioner.pipelines import fixed_pipelines, pipeline_time_ns, pipelines_violations, sub_problem
from hetpart.partitioner.problem import Plan, Problem, Training

from test_pipeline_search import brute_groups, brute_pipelines


def stripy(old_ns: int = 50) -> Problem:
    """Two machines of two devices (n0: "gpu", n1: "old", `old_ns` per op), a chain of four ops of 50 ns on a GPU
    with a 100-byte weight each; a device holds two weights, so every pipeline has two devices or more. Inside a
    machine 100,000 bytes/us, between machines 10: a gradient ring over the network costs 20 us, over a machine's
    link 2 ns; nothing crosses a stage boundary (no activations out)."""
    g = nx.path_graph(["a", "b", "c", "d"], create_using=nx.DiGraph)
    nx.set_node_attributes(g, {v: {"gpu": 50, "old": old_ns} for v in "abcd"}, TIME_NS)
    nx.set_node_attributes(g, {v: (f"w{v}",) for v in "abcd"}, WEIGHTS)
    weights = {f"w{v}": 100 for v in "abcd"}
    devices = ([Device(f"g{i}", "gpu", "n0", 250) for i in range(2)]
               + [Device(f"o{i}", "old", "n1", 250) for i in range(2)])
    return Problem(graph=g, weights=weights, devices=devices,
                   intra_node_links={"n0": Link(100_000, 0), "n1": Link(100_000, 0)}, network=Link(10, 0),
                   training=Training("1f1b", 1, {w: 0 for w in weights}))


def no_stripes(monkeypatch) -> None:
    import hetpart.partitioner.pipeline_search as search

    real = search.stripe_probe
    monkeypatch.setattr(search, "stripe_probe", lambda *a, **k: real(*a[:5], time.perf_counter() - 1.0))


def test_stripe_sets_and_devices():
    """Each (machines, f): f disjoint groups covering the machines, each with 1/f of every class of every machine;
    the machines the plan uses first, then every machine; f the common divisors >= 2, most stripes first."""
    p = stripy()
    p.devices += [Device(f"h{i}", "gpu", "n2", 250) for i in range(4)]
    p.intra_node_links["n2"] = Link(100_000, 0)
    sets = stripe_sets(p, {"h0", "h3"})
    assert sets == [(("n2",), 4), (("n2",), 2), (("n0", "n1", "n2"), 2)]
    for machines, f in sets:
        groups = stripe_devices(p, machines, f)
        names = [d for grp in groups for d in grp]
        assert len(groups) == f and len(names) == len(set(names))
        assert set(names) == {d.name for d in p.devices if d.node in machines}
        for grp in groups:
            for m in machines:
                on = [d for d in p.devices if d.node == m]
                assert sum(p.device(d).node == m for d in grp) == len(on) // f


def test_device_kinds_count_every_kind_per_machine_and_follow_the_device_list():
    """Problem.device_kinds, read by stripe_sets and by each LP of NOTE [pipelines bound]: a Counter of (type,
    capacity) over the devices (of one machine), kept right as devices are added or the list replaced."""
    from collections import Counter

    p = stripy()
    for step in range(3):
        want = Counter((d.type, d.capacity_bytes) for d in p.devices)
        assert p.device_kinds() == want
        for m in {d.node for d in p.devices}:
            assert p.device_kinds(m) == Counter((d.type, d.capacity_bytes) for d in p.devices if d.node == m)
        assert p.device_kinds("nowhere") == {}
        p.device_kinds()[("gpu", 250)] = 99  # a copy: the cache is not changed
        if step == 0:
            p.devices += [Device("h0", "gpu", "n2", 300)]
        else:
            p.devices = [d for d in p.devices if d.node != "n0"]


def test_device_types_and_allowed_types_follow_the_device_list():
    """Problem.device_types, kept per devices list (NOTE [problem caches]) and read by allowed_types once per node:
    right as devices are added or the list replaced; each call's list the caller's own."""
    from hetpart.partitioner import FORBIDDEN_TYPES

    p = stripy()
    v = next(iter(p.graph.nodes))
    for step in range(3):
        want = sorted({d.type for d in p.devices})
        assert p.device_types == want and p.allowed_types(v) == want
        p.graph.nodes[v][FORBIDDEN_TYPES] = ["gpu"]
        assert p.allowed_types(v) == [t for t in want if t != "gpu"]
        del p.graph.nodes[v][FORBIDDEN_TYPES]
        p.device_types.append("x")  # a copy: the cache is not changed
        p.allowed_types(v).append("x")
        if step == 0:
            p.devices += [Device("t0", "tpu", "n2", 300)]
        else:
            p.devices = [d for d in p.devices if d.type != "gpu"]


@pytest.mark.parametrize("old_ns", [50, 120])
def test_stripes_are_interchangeable(old_ns):
    """NOTE [striped pipelines]: stripe 0's best plan renamed to stripe 1 is stripe 1's best plan (brute force over
    every valid plan of each group), so one solve serves every stripe."""
    p, M = stripy(old_ns), 4
    groups = stripe_devices(p, ("n0", "n1"), 2)
    assert groups == [("g0", "o0"), ("g1", "o1")]
    best = []
    for grp in groups:
        sub = sub_problem(p, grp, 2)
        times = [sum(s.time_ns for s in st) + max(s.time_ns for s in st) for _, _, st in valid_plans(sub)]
        best.append(min(times))
    plan = fixed_pipelines(p, groups[:1], [2], time_limit_s=5).pipelines[0].plan
    got = striped(p, groups, plan, M)
    assert not pipelines_violations(p, got, M)
    assert [q.time_ns for q in got.pipelines] == best and best[0] == best[1]
    assert got.iteration_ns == brute_groups(p, groups, M)


def test_the_search_finds_stripes_that_brute_force_says_are_best(monkeypatch):
    """On `stripy` one pipeline of four stages takes 200 + 3 x 50 = 350 ns; two pipelines of one machine each
    would sync over the network (20 us); the two stripes {g0, o0}, {g1, o1} run two microbatches each in 200 + 50
    and sync their weights inside the machines (2 ns): 302 ns, brute force's optimum over every plan. The search's
    shapes (whole machines, pieces of one) miss them; the probe finds them, and the bound stays below."""
    p, M = stripy(), 4
    optimum = brute_pipelines(p, M)
    assert optimum == brute_groups(p, [("g0", "o0"), ("g1", "o1")], M) == 302
    plan = plan_pipelines(p, M, time_limit_s=20)
    assert not pipelines_violations(p, plan, M)
    assert plan.iteration_ns == optimum and plan.stats["stripe_taken"] == 1.0
    assert sorted(q.devices for q in plan.pipelines) == [("g0", "o0"), ("g1", "o1")]
    assert pipelines_lower_bound(p, M).bound_ns <= optimum and plan.lower_bound_ns <= optimum
    no_stripes(monkeypatch)
    without = plan_pipelines(p, M, time_limit_s=20)
    assert without.iteration_ns == 350 and without.stats["stripe_tries"] == 0


def test_stripes_slower_than_the_plan_are_not_taken():
    """With slow 'old' devices (400 ns an op) a stripe takes far longer than the plan given: the probe tries and
    keeps the plan it was given."""
    p, M = stripy(400), 4
    base = fixed_pipelines(p, [("g0", "g1", "o0", "o1")], [M], time_limit_s=5)
    calls = []

    def solve(devs, m, limit_s):  # as the search's planner: None where no plan fits
        calls.append((devs, m))
        try:
            return fixed_pipelines(p, [devs], [m], time_limit_s=limit_s).pipelines[0].plan
        except HetpartError:
            return None

    got = stripe_probe(p, base, M, solve, lambda n: 5.0, time.perf_counter() + 30)
    assert calls and got.plan is base and got.stats["stripe_taken"] == 0.0
    assert all(step is None or step > base.iteration_ns for _, _, step in got.tries)


def test_the_probe_keeps_to_its_end():
    """A probe whose time is spent solves nothing and keeps the plan."""
    p, M = stripy(), 4
    base = fixed_pipelines(p, [("g0", "g1", "o0", "o1")], [M], time_limit_s=5)

    def solve(devs, m, limit_s):
        raise AssertionError("no solve past the end")

    got = stripe_probe(p, base, M, solve, lambda n: 5.0, time.perf_counter() - 1)
    assert got.plan is base and got.tries == []


def test_uneven_shares_run_the_same_plan():
    """M not a multiple of f: the first M mod f stripes run one more microbatch on the plan solved for M // f
    (1F1B: its stages are at most M // f), each time its formula."""
    p, M = stripy(), 5
    groups = stripe_devices(p, ("n0", "n1"), 2)
    plan: Plan = fixed_pipelines(p, groups[:1], [2], time_limit_s=5).pipelines[0].plan
    got = striped(p, groups, plan, M)
    assert [q.microbatches for q in got.pipelines] == [3, 2]
    assert not pipelines_violations(p, got, M)
    assert [q.time_ns for q in got.pipelines] == [pipeline_time_ns(q.plan, q.microbatches) for q in got.pipelines]
