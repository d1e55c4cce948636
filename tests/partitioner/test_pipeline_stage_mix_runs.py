"""NOTE [stage mix runs] (pipeline_mix_bound.py) checked against brute force on chains of layers (each a matmul-like
op much faster on the fast type between memory-bound ones only a little faster) over machines of one device type:
every valid stage plan pays each run line (its stage sum at least alpha_mix(beta) - b beta . n - K), and the
pipelines bound with the rows stays at or below the brute-force optimum of every plan of data-parallel pipelines
(`brute_pipelines`) and rises above the bound without them. Negative control: with the types on one machine (runs
then cross no network) a plan breaks the line of one run's slack."""

from __future__ import annotations

import dataclasses
import functools
import random

import networkx as nx
import numpy as np
import pytest

import hetpart.partitioner.pipeline_bounds as bounds
from hetpart.partitioner import MEM_BYTES, OUT_BYTES, TIME_NS, WEIGHTS, Device, Link
from hetpart.partitioner.certificate import valid_plans
from hetpart.partitioner.pipeline_bounds import need_bytes, pipelines_lower_bound
from hetpart.partitioner.pipeline_mix_bound import run_floor, run_slack, stage_mix
from hetpart.partitioner.pipelines import sub_problem
from hetpart.partitioner.problem import LAYER, Problem, Training

from test_pipeline_search import brute_pipelines

pytestmark = pytest.mark.xdist_group("test_pipeline_stage_mix_runs")  # the optima are cached per module
# The op kinds of a layer: (base ns on the fast type, the fast type's speed-up over "slow", over "mid").
KINDS = {"matmul": (40, 6.0, 3.0), "norm": (12, 1.5, 1.2), "act": (8, 1.8, 1.3)}
SEEDS = (0, 1, 2, 3, 9, 10, 14, 18)  # of 0-19, the rows raised the bound on these (and on 7 and 11: slower)


def chain_problem(seed: int, one_machine: bool = False) -> tuple[Problem, int]:
    """3-4 layers of 2-3 ops in a chain, 8 bytes on every boundary; 1-2 fast devices on one machine and 1-3 slow
    ones on another (`one_machine`: all on one machine with a fast link); 1F1B training or inference; and M."""
    rng = random.Random(seed)
    layers, kinds = rng.choice([3, 4]), ["norm", "matmul", "act"][:rng.choice([2, 3])]
    g = nx.DiGraph()
    nodes: list[str] = []
    for layer in range(layers):
        for kind in kinds:
            base, fast_slow, fast_mid = KINDS[kind]
            v = f"l{layer}_{kind}"
            g.add_node(v, **{TIME_NS: {"fast": base, "mid": int(base * fast_mid), "slow": int(base * fast_slow)},
                             MEM_BYTES: 4, OUT_BYTES: 8, LAYER: f"blocks.{layer}",
                             WEIGHTS: (f"w{layer}",) if kind == "matmul" else ()})
            if nodes:
                g.add_edge(nodes[-1], v)
            nodes.append(v)
    g.nodes[nodes[-1]][OUT_BYTES] = 0
    weights = {f"w{layer}": 20 for layer in range(layers)}
    training = Training("1f1b", 1, dict(weights)) if rng.random() < 0.7 else None
    slow = rng.choice(["slow", "mid"])
    n_fast, n_slow = rng.choice([(1, 2), (2, 2), (1, 3), (2, 1)])
    probe = Problem(graph=g, weights=weights, devices=[], intra_node_links={}, network=Link(1, 0), training=training)
    cap = 3 * need_bytes(probe)
    devices = ([Device(f"f{i}", "fast", "mf", cap) for i in range(n_fast)]
               + [Device(f"s{i}", slow, "ms", cap) for i in range(n_slow)])
    network = Link(rng.choice([30, 60, 120]), 0)
    problem = Problem(graph=g, weights=weights, devices=devices,
                      intra_node_links={"mf": Link(1000, 0), "ms": Link(1000, 0)}, network=network, training=training)
    if one_machine:
        problem = dataclasses.replace(problem, devices=[dataclasses.replace(d, node="m0") for d in devices],
                                      intra_node_links={"m0": Link(100_000, 0)})
    return problem, rng.randint(2, 6)


def alternating_problem() -> Problem:
    """matmul, act, matmul, act, matmul on 3 fast and 2 slow devices of one machine, nothing crossing a boundary:
    the plan fast, slow, fast, slow, fast runs the acts on the slow devices (as fast as on the fast ones), two runs
    of the slow type at no transfer."""
    g = nx.DiGraph()
    names = ["mm0", "act0", "mm1", "act1", "mm2"]
    for v in names:
        g.add_node(v, **{TIME_NS: {"fast": 10, "slow": 60 if v.startswith("mm") else 10}, MEM_BYTES: 1})
    nx.add_path(g, names)
    devices = [Device(f"f{i}", "fast", "m0", 10**6) for i in range(3)] + [Device(f"s{i}", "slow", "m0", 10**6)
                                                                         for i in range(2)]
    return Problem(graph=g, weights={}, devices=devices, intra_node_links={"m0": Link(1000, 0)}, network=Link(1, 0))


@functools.cache
def _optimum(seed: int) -> int | None:
    """The brute-force optimum of `chain_problem(seed)` (None: no valid plan); a pure function of the seed."""
    return brute_pipelines(*chain_problem(seed))


def _lines(problem: Problem, types: tuple[str, ...]) -> list[tuple[dict[str, float], float]]:
    """Lines of alpha_mix's Z over `types` (`cut_at` at a few capacities, and beta = 0)."""
    mix = stage_mix(problem)
    sums = mix.sums(types)
    model = np.array([mix.model_ns[t] for t in types])
    out = [({}, float(model.min()))]
    for c in ((0.3, 0.3), (1, 0.2), (0.1, 2), (0.5, 1), (0.05, 0.6), (0.2, 0.05)):
        got = sums.cut_at(model * np.array(c[:len(types)]))
        if got is not None:
            out.append(({t: float(b) for t, b in zip(types, got[0]) if b > 0}, float(got[1])))
    return out


def _run_line_breaks(problem: Problem, k_of) -> tuple[int, int]:
    """(lines checked, lines broken) over every valid single-pipeline plan of `problem` (inference, 1 microbatch):
    stage sum >= alpha_mix(beta) - b beta . n - K, K = k_of(delta, beta) (b the slowest stage, n stages per type)."""
    p = dataclasses.replace(problem, training=None)
    mix = stage_mix(p)
    types = tuple(sorted({d.type for d in p.devices}))
    lines = _lines(p, types)
    delta = {t: float(mix.delta[t]) for t in types}
    checked = broken = 0
    for _, devs, stages in valid_plans(sub_problem(p, [d.name for d in p.devices], 1)):
        n: dict[str, int] = {}
        for d in devs:
            n[p.device(d).type] = n.get(p.device(d).type, 0) + 1
        total, b = sum(s.time_ns for s in stages), max(s.time_ns for s in stages)
        for beta, alpha in lines:
            k = k_of(delta, beta)
            if k is None:
                continue
            checked += 1
            broken += total < alpha - b * sum(beta.get(t, 0.0) * m for t, m in n.items()) - k - 1e-6
    return checked, broken


def test_run_floor_only_where_every_machine_holds_one_type():
    p, _ = chain_problem(0)
    floor = run_floor(p)
    assert floor is not None and floor.sides  # 8 bytes on every boundary: C(beta) - 2 = 0 at beta = 8
    assert min(cheap for cheap, _ in floor.sides) == 0
    assert run_floor(chain_problem(0, one_machine=True)[0]) is None
    assert run_slack({"fast": 0.0, "slow": 5.0}, {"slow": 1.0}, floor) == 10.0  # (1 + 0) x (1 + 1) x 5
    assert run_slack({"fast": 0.0, "slow": 1e9}, {}, floor) is None  # c above two network sides: no row


def test_every_plan_pays_each_run_line():
    checked = 0
    for seed in SEEDS:
        p, _ = chain_problem(seed)
        floor = run_floor(p)
        got, broken = _run_line_breaks(p, lambda delta, beta: run_slack(delta, beta, floor))
        assert broken == 0, seed
        checked += got
    assert checked > 1000


def test_negative_control_runs_on_one_machine_break_a_line():
    """Where both types share a machine, fast-slow-fast-slow-fast pays two runs of slack and no network side: run_floor
    gives no rows there, and the K of one run (what the rows would charge) is broken by that plan."""
    p = alternating_problem()
    assert run_floor(p) is None
    one_run = lambda delta, beta: max((1 + beta.get(t, 0.0)) * d for t, d in delta.items())  # noqa: E731
    assert _run_line_breaks(p, one_run)[1] > 0


def test_the_bound_with_the_run_rows_stays_below_brute_force_and_rises(monkeypatch):
    raised = 0
    for seed in SEEDS:
        p, M = chain_problem(seed)
        optimum = _optimum(seed)
        monkeypatch.setattr(bounds, "RUNS", False)
        without = pipelines_lower_bound(p, M, memory=False).bound_ns
        monkeypatch.setattr(bounds, "RUNS", True)
        with_runs = pipelines_lower_bound(p, M, memory=False).bound_ns
        assert optimum is None or with_runs <= optimum, (seed, with_runs, optimum)
        assert with_runs >= without, seed
        raised += with_runs > without
    assert raised >= 6
    p, M = chain_problem(2)  # a pipeline of 2 fast and 2 mid devices, 6 microbatches: 774 ns before the rows
    assert pipelines_lower_bound(p, M, memory=False).bound_ns == 822 and _optimum(2) == 936
