"""NOTE [sync topology floor] against brute force: every plan of two or more pipelines of a small chain model on
several single-type machines pays the floor (sync plus the least machine-crossing transfers of its pipelines), the
pipelines bound with it stays at most the brute-force optimum, and charging the network's speed whether or not the
rings stay on a machine (a wrong floor) exceeds some plan.
"""

from __future__ import annotations

import dataclasses
import itertools
import random

import networkx as nx
from test_pipeline_search import _compositions, _partitions, brute_pipelines

from hetpart.partitioner import MEM_BYTES, OUT_BYTES, PIN, PIN_FIRST, PIN_LAST, TIME_NS, WEIGHTS, Device, Link
from hetpart.partitioner import pipeline_bounds, pipeline_sync_topology
from hetpart.partitioner.certificate import valid_plans
from hetpart.partitioner.pipeline_bounds import _read_weight_bytes, need_bytes, pipelines_lower_bound
from hetpart.partitioner.pipeline_sync_topology import sync_topology, topology_sync_ns
from hetpart.partitioner.pipelines import Pipeline, grad_sync_ns, sub_problem
from hetpart.partitioner.problem import LAYER, Plan, Problem, Training

SPEED = {"fast": 1.0, "slow": 0.4}


def machines_problem(seed: int) -> tuple[Problem, int]:
    """A chain of 4 ops (a weight each, Adam-like state), 1F1B, 2-4 microbatches, on 5 devices over 3 single-type
    machines (2, 2, 1 devices): a machine holds one pipeline's model, rarely two copies of it, and the network
    is 5-20x slower than the machines' links."""
    rng = random.Random(seed)
    g = nx.DiGraph()
    weights = {}
    for i in range(4):
        weights[f"w{i}"] = rng.randint(40, 160)
        base = rng.randint(100, 400)
        g.add_node(f"v{i}", **{TIME_NS: {t: int(base / s) for t, s in SPEED.items()}, MEM_BYTES: rng.randint(5, 20),
                              OUT_BYTES: rng.randint(20, 120) if i < 3 else 0, WEIGHTS: (f"w{i}",),
                              PIN: PIN_FIRST if i == 0 else PIN_LAST if i == 3 else None, LAYER: f"blocks.{i}"})
        if i:
            g.add_edge(f"v{i - 1}", f"v{i}")
    held = 2 * sum(weights.values())
    machines = [("m0", 2), ("m1", 2), ("m2", 1)]
    devices = []
    for m, count in machines:
        t = rng.choice(sorted(SPEED))
        for j in range(count):
            cap = int(held * rng.uniform(0.5, 1.1)) + 20
            devices.append(Device(f"{m}d{j}", t, m, cap))
    fast = rng.choice([1_000, 2_000])
    p = Problem(graph=g, weights=weights, devices=devices, intra_node_links={m: Link(fast, 2) for m, _ in machines},
                network=Link(fast // rng.choice([5, 10, 20]), rng.randint(5, 30)),
                training=Training("1f1b", 1, dict(weights)))
    return p, rng.choice([2, 3, 4])


def every_plan(problem: Problem, M: int):
    """Every plan of two or more pipelines (every grouping of every device subset, every valid stage plan per
    group, every microbatch split) as its list of `Pipeline`s."""
    names = [d.name for d in problem.devices]
    cache: dict[tuple[tuple[str, ...], int], list[Plan]] = {}

    def plans(group: tuple[str, ...], m: int) -> list[Plan]:
        if (group, m) not in cache:
            cache[group, m] = [Plan(stage_of=s, device_of_stage=d, stages=st, bottleneck_ns=max(x.time_ns for x in st),
                                    lower_bound_ns=0, solver_status="FEASIBLE", solve_seconds=0.0)
                               for s, d, st in valid_plans(sub_problem(problem, group, m))]
        return cache[group, m]

    for r in range(2, len(names) + 1):
        for subset in itertools.combinations(names, r):
            for part in _partitions(list(subset)):
                if not 2 <= len(part) <= M:
                    continue
                groups = [tuple(x) for x in part]
                for split in _compositions(M, len(groups)):
                    options = [plans(gr, m) for gr, m in zip(groups, split)]
                    for combo in itertools.product(*options):
                        yield [Pipeline(i, gr, m, plan, 0) for i, (gr, m, plan) in enumerate(zip(groups, split, combo))]


def _floor(p: Problem, pipes: list[Pipeline], cheap_less: int = 0) -> tuple[int, int]:
    """(what the plan pays of the floor: its sync plus its pipelines' least transfers, the floor at its own k and
    smallest pipeline); `cheap_less`: a wrong floor counting that many fewer cheap boundaries."""
    topo = sync_topology(p, _read_weight_bytes(p), need_bytes(p))
    if topo is not None and cheap_less:
        topo = dataclasses.replace(topo, sides=[(c - cheap_less, net, fast) for c, net, fast in topo.sides])
    sizes = [len(q.plan.stages) for q in pipes]
    transfers = min(sum(s.time_ns - s.compute_ns for s in q.plan.stages) for q in pipes)
    paid = grad_sync_ns(p, pipes)[0] + transfers
    return paid, topology_sync_ns(topo, min(sizes), len(pipes), min(sizes), 0)


SEEDS = range(10)


def test_every_plan_pays_the_floor_and_the_network_in_both_cases_does_not_hold():
    """Each plan of >= 2 pipelines pays at least the floor at its own k and smallest pipeline; the floor lies above
    sigma on some; charging the network's speed in both cases (local rings too) exceeds some plan's payment, and so
    does counting one cheap boundary fewer than (3) allows (the first and last gaps' -2 is as far as it goes)."""
    real = pipeline_sync_topology._sync_ns
    above_sigma = caught = plans = fewer = 0
    for seed in SEEDS:
        p, M = machines_problem(seed)
        for pipes in every_plan(p, M):
            plans += 1
            paid, floor = _floor(p, pipes)
            assert paid >= floor, (seed, paid, floor, [q.devices for q in pipes])
            sizes = [len(q.plan.stages) for q in pipes]
            sigma = pipeline_bounds.sync_floor_ns(p, min(sizes), len(pipes))
            above_sigma += floor > sigma
            fewer += paid < _floor(p, pipes, cheap_less=1)[1]
            try:  # negative control: every ring at the network's speed, as if no weight could stay local
                pipeline_sync_topology._sync_ns = lambda topo, local, smallest, k: real(topo, 0.0, smallest, k)
                caught += paid < _floor(p, pipes)[1]
            finally:
                pipeline_sync_topology._sync_ns = real
    assert plans > 1000
    assert above_sigma > 1000 and caught > 100 and fewer > 10, (plans, above_sigma, caught, fewer)
    # measured: 2412 plans, 2412 above sigma, 372 caught, 36 with one cheap boundary fewer


def test_the_bound_with_the_floor_stays_at_most_the_optimum_and_rises():
    """NOTE [pipelines bound] (memory bound left out, so nothing hides it) with the floor is at most the brute-force
    optimum on every seed and above the same bound without it on some (measured: 7 of the 10). The network-speed
    variant is caught per plan above; in the bound it passed no optimum on seeds 0-39 (the least part there is
    one whose rings cross the network anyway), so this test does not ask it to."""
    raised = 0
    for seed in SEEDS:
        p, M = machines_problem(seed)
        opt = brute_pipelines(p, M)
        if opt is None:
            continue
        got = pipelines_lower_bound(p, M, memory=False).bound_ns
        assert got <= opt, (seed, got, opt)
        try:
            pipeline_bounds.TOPOLOGY = False
            raised += got > pipelines_lower_bound(p, M, memory=False).bound_ns
        finally:
            pipeline_bounds.TOPOLOGY = True
    assert raised >= 3, raised


def _exact_topology_ns(topo, smallest: int, k: int, least_size: int) -> int:
    """NOTE [sync topology floor]'s least over L in exact arithmetic (Fractions): the machines each L needs
    counted without rounding."""
    import math
    from fractions import Fraction as F

    from hetpart.partitioner.pipeline_sync_topology import _sync_ns

    w, extra = topo.weight_bytes, F(k - 1) * F(topo.held_per_byte)
    least = math.ceil(max(1, least_size) / topo.machine_devices)
    tops = [F(0)] if k > topo.machine_devices else [
        F(0), F(w), *((F(c) - topo.need) / extra for c in topo.machine_caps[1:])]
    best = math.inf
    for L in tops:
        L = min(F(w), max(F(0), L))
        q = next((i for i, c in enumerate(topo.machine_caps) if c >= topo.need + extra * L), None)
        if q is not None:
            best = min(best, topo.crossing_ns(max(least, q), least_size) + _sync_ns(topo, float(L), smallest, k))
    return int(best)


def test_the_floor_is_never_above_its_exact_least():
    """review19: a part's L at a machine's capacity, put back through floats, could land an ulp above it and be
    charged one machine more than that L needs (about 0.5% of these draws before the fix)."""
    import random

    from hetpart.partitioner.pipeline_sync_topology import SyncTopology, topology_sync_ns

    rng = random.Random(0)
    above = 0
    for _ in range(20_000):
        k, f = rng.randint(2, 8), rng.choice([3.0, 4.0, 5.0, 7.0, 2.5])
        caps = sorted((rng.randint(10**10, 10**12) for _ in range(rng.randint(2, 5))), reverse=True)
        prefix = [0]
        for c in caps:
            prefix.append(prefix[-1] + c)
        W = rng.randint(10**9, 10**12)
        topo = SyncTopology(weight_bytes=W, largest_weight=W // 50, latency_ns=1000, net_bw=25_000,
                            fast_bw=450_000, need=rng.randint(10**9, caps[0]), held_per_byte=f, machine_devices=8,
                            machine_caps=prefix, sides=[(2, 2_000_000, 100_000)])
        above += topology_sync_ns(topo, 16, k, 8, 0) > _exact_topology_ns(topo, 16, k, 8)
    assert above == 0
