"""Issue 19's pipelines bound fuzzed: tiny random data-parallel problems, `pipelines_lower_bound` (no deadline)
against the brute-force optimum of every plan (`brute_pipelines`: every grouping into pipelines, every stage
plan, every microbatch split). Used by test_pipeline_transfer_floor.py (seeded, a few problems) and
benchmarks/pipeline_bound_fuzz.py (by the thousand).

The problems reach what NOTE [boundary transfer floor], NOTE [pipelines memory bound], NOTE [memory bound parts]
and NOTE [pipelines bound] reason about: DAGs with skip connections and side branches (cut nodes and gaps),
multi-output nodes (1-4 tensors a boundary pays a latency each), outputs of no bytes; 2-3 device types on 1-3
machines of different sizes, one kind (type, capacity) split over machines of different links; links from
fast to slower than an op; tight and loose memory; 1F1B, GPipe and inference; 1-8 microbatches.
"""

from __future__ import annotations

import random

import networkx as nx

from hetpart.partitioner import MEM_BYTES, OUT_BYTES, OUT_TENSORS, PIN, PIN_FIRST, PIN_LAST, TIME_NS, WEIGHTS
from hetpart.partitioner import Device, Link
from hetpart.partitioner.pipeline_bounds import need_bytes, pipelines_lower_bound
from hetpart.partitioner.problem import LAYER, Problem, Training

from test_pipeline_search import brute_pipelines

SPEED = {"fast": 1.0, "mid": 0.45, "slow": 0.2}


def random_dag(rng: random.Random, n: int) -> nx.DiGraph:
    """n ops in topological order: a chain, or a skip over one op, plus random skip edges (some rejoin late)."""
    g = nx.DiGraph()
    for i in range(n):
        base = rng.randint(5, 100)
        g.add_node(f"v{i}", **{TIME_NS: {t: max(1, int(base / s * rng.uniform(0.8, 1.25))) for t, s in SPEED.items()},
                               MEM_BYTES: rng.choice([0, rng.randint(1, 40)]),
                               OUT_BYTES: rng.choice([0, rng.randint(1, 30), rng.randint(30, 400)]) if i < n - 1 else 0,
                               OUT_TENSORS: rng.choice([1, 1, 2, 3, 4]), LAYER: f"blocks.{i}"})
    for i in range(1, n):
        src = i - 1 if rng.random() < 0.7 or i < 2 else i - 2
        g.add_edge(f"v{src}", f"v{i}")
        if i >= 2 and rng.random() < 0.35:
            g.add_edge(f"v{rng.randint(0, i - 2)}", f"v{i}")
    for v in list(g.nodes):  # a node nobody reads but the last one feeds the last (one sink)
        if v != f"v{n - 1}" and g.out_degree(v) == 0:
            g.add_edge(v, f"v{n - 1}")
    return g


def random_pipelines_problem(seed: int) -> tuple[Problem, int]:
    """One problem of the fuzz and its microbatch count (see the module's docstring)."""
    rng = random.Random(seed)
    n = rng.choice([3, 4, 4, 5, 5, 6])
    g = random_dag(rng, n)
    weights = {}
    for i in range(n):
        if rng.random() < 0.85:
            w = f"w{rng.randint(0, n - 1)}" if rng.random() < 0.2 else f"w{i}"  # some weights shared
            weights[w] = rng.randint(10, 300)
            g.nodes[f"v{i}"][WEIGHTS] = tuple(sorted(set(g.nodes[f"v{i}"].get(WEIGHTS, ())) | {w}))
    if rng.random() < 0.5:
        g.nodes["v0"][PIN] = PIN_FIRST
        g.nodes[f"v{n - 1}"][PIN] = PIN_LAST
    schedule = rng.choice(["1f1b", "1f1b", "gpipe", None])
    training = Training(schedule, 1, {w: b // rng.choice([1, 2, 4]) for w, b in weights.items()}) if schedule else None
    types = rng.sample(sorted(SPEED), rng.choice([2, 3]))
    machines = rng.choice([1, 2, 2, 3, 3])
    D = rng.choice([3, 4, 4, 5, 5]) if n <= 5 else rng.choice([3, 4])
    sizes = [1] * machines
    for _ in range(D - machines):
        sizes[rng.randrange(machines)] += 1
    probe = Problem(graph=g, weights=weights, devices=[], intra_node_links={}, network=Link(1, 0), training=training)
    need = need_bytes(probe)
    tight = rng.random() < 0.5
    caps = {t: int(need * (rng.uniform(0.35, 1.1) if tight else rng.uniform(1.0, 3.0))) + 1 for t in types}
    devices = []
    for m, size in enumerate(sizes):
        for j in range(size):
            t = types[(len(devices)) % len(types)] if len(devices) < len(types) else rng.choice(types)
            cap = caps[t] if rng.random() < 0.8 else int(caps[t] * rng.uniform(0.5, 1.5)) + 1
            devices.append(Device(f"d{len(devices)}", t, f"m{m}", cap))
    link = lambda: Link(rng.choice([5, 20, 100, 1000, 20_000]), rng.choice([0, 2, 10, 50, 200]))  # noqa: E731
    intra = {f"m{m}": link() for m in range(machines)}
    network = link()
    return Problem(graph=g, weights=weights, devices=devices, intra_node_links=intra, network=network,
                   training=training), rng.randint(1, 8 if D <= 4 else 6)


def check(seed: int, alone: bool = False) -> tuple[int | None, int]:
    """(the brute-force optimum, or None when no plan fits; the bound) of problem `seed`; `alone`: NOTE [pipelines
    bound] without NOTE [pipelines memory bound] (so that the larger of the two does not hide it)."""
    p, M = random_pipelines_problem(seed)
    return brute_pipelines(p, M), pipelines_lower_bound(p, M, memory=not alone).bound_ns
