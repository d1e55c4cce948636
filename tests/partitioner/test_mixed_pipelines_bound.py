"""NOTE [pipelines bound] on slot problems of mixed tensor-parallel degrees (NOTE [mixed-degree gradient sync]),
against brute force: every plan of two or more pipelines syncs at least the floor `sync_floor_ns` charges (its
sync the slices' rings, `grad_sync_ns` over a problem with `tp_sync` as `mixed_compile` sets it), and the bound
(`pipelines_lower_bound`, and the one `plan_pipelines` reports) is at most the best plan. Negative controls: the
same checks fail when the sync floor is scaled up, so they can fail.

The problems are test_tp_pipelines' slot problems at degrees 1 and 2, each machine given a degree (both degrees
used), joined by `mixed_problem` as `--tensor-parallel-per-machine` joins them (hetpart/pipelines_per_machine.py)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from hetpart.partitioner import pipeline_bounds
from hetpart.partitioner.certificate import valid_plans
from hetpart.partitioner.pipeline_bounds import pipelines_lower_bound
from hetpart.partitioner.pipeline_quick_bound import quick_pipelines_bound
from hetpart.partitioner.pipeline_search import plan_pipelines
from hetpart.partitioner.pipelines import (
    Pipeline, cost_pipelines, fixed_pipelines, grad_sync_ns, mixed_sync_buckets, pipelines_violations, sub_problem)
from hetpart.partitioner.problem import Plan, Problem
from hetpart.partitioner.tp_choice import TPSlot, mixed_problem
from hetpart.partitioner.tp_sync import TPSyncLayout

from test_pipeline_search import _partitions, brute_pipelines
from test_tp_pipelines import slot_problems


def mixed_slot_problems(seed: int) -> tuple[list[Problem], int]:
    """Every assignment of degree 1 or 2 to the machines of `slot_problems(seed)` that uses both, each as the slot
    problem `mixed_compile` plans on (its `tp_sync` the slices' layout), and the microbatches."""
    problems, M, _ = slot_problems(seed)
    whole = problems[1].weights
    split = {w: (0, 1) for w, b in problems[2].weights.items() if b != whole[w]}  # what degree 2 splits
    slots = {t: [TPSlot(d.name, tuple(d.name.split("+")), d.node, d.type.split("/")[0], t) for d in p.devices]
             for t, p in problems.items()}
    machines = sorted({d.node for d in problems[1].devices})
    out = []
    for degrees in itertools.product((1, 2), repeat=len(machines)):
        if len(set(degrees)) < 2:
            continue
        of = dict(zip(machines, degrees))
        chosen = [s for t, ss in slots.items() for s in ss if of[s.machine] == t]
        layout = TPSyncLayout({f"{s.device_type}/tp2": 2 for s in chosen if s.degree == 2}, {2: split}, dict(whole))
        out.append(dataclasses.replace(mixed_problem(problems, chosen), tp_sync=layout))
    return out, M


def _plans(problem: Problem, group: tuple[str, ...]) -> list[Plan]:
    return [Plan(stage_of=stage_of, device_of_stage=devs, stages=stages, bottleneck_ns=0, lower_bound_ns=0,
                 solver_status="FEASIBLE", solve_seconds=0.0)
            for stage_of, devs, stages in valid_plans(sub_problem(problem, group, 1))]


def _mixed_slice(problem: Problem, ranks: tuple[tuple[str, int], ...]) -> bool:
    """Whether a bucket's ranks sum a slice of a split weight over a TP-2 stage (one of its ranks) and a degree-1
    stage."""
    degree = {d: problem.tp_sync.degree_of_type.get(problem.device(d).type, 1) for d, _ in ranks}
    return 1 in degree.values() and any(t == 2 and sum(e == d for e, _ in ranks) == 1 for d, t in degree.items())


def _below_floor(seeds: list[int]) -> tuple[list[tuple[int, int, int, bool]], int]:
    """Every plan of two or more pipelines (every grouping of every subset of the slots, every valid plan of each
    group) of the mixed problems of `seeds` whose sync is below `sync_floor_ns` for its pipelines and smallest
    pipeline's stages: (seed, sync, floor, whether it sums a slice over both degrees, `_mixed_slice`); and how
    many of the plans checked do."""
    below, sliced = [], 0
    for seed in seeds:
        for p in mixed_slot_problems(seed)[0]:
            names = [d.name for d in p.devices]
            per_group: dict[tuple[str, ...], list[Plan]] = {}
            for r in range(2, len(names) + 1):
                for subset in itertools.combinations(names, r):
                    for part in _partitions(list(subset)):
                        if len(part) < 2:
                            continue
                        groups = [tuple(g) for g in part]
                        options = [per_group.setdefault(g, _plans(p, g)) for g in groups]
                        for combo in itertools.product(*options):
                            pipes = [Pipeline(i, g, 1, plan, 0) for i, (g, plan) in enumerate(zip(groups, combo))]
                            sync = grad_sync_ns(p, pipes)[0]
                            floor = pipeline_bounds.sync_floor_ns(p, min(len(q.stages) for q in combo), len(pipes))
                            mixed = any(_mixed_slice(p, ranks) for ranks in mixed_sync_buckets(p, pipes))
                            if sync < floor:
                                below.append((seed, sync, floor, mixed))
                            sliced += mixed
    return below, sliced


def test_every_mixed_plan_syncs_at_least_the_floor():
    below, sliced = _below_floor([4, 18, 24])
    assert below == []
    assert sliced >= 1000  # plans summing a split weight's slice over a TP-2 stage's rank and a degree-1 stage


def test_a_floor_too_strong_is_below_a_mixed_plan_s_sync(monkeypatch):
    """Negative control: a fifth more than the floor is above the sync of plans that sum slices over both degrees
    (seed 24: 3 pipelines, two of two degree-1 slots and one of a TP-2 slot, 1.10 x the floor): the check above
    fails on them."""
    floor = pipeline_bounds.sync_floor_ns
    monkeypatch.setattr(pipeline_bounds, "sync_floor_ns", lambda *a, **k: int(floor(*a, **k) * 1.2))
    assert any(mixed for *_, mixed in _below_floor([24])[0])


def _above_optimum(seeds: list[int], plans: bool) -> list[tuple[int, int, int]]:
    """(seed, bound, optimum) of every mixed problem of `seeds` whose NOTE [pipelines bound] is above its
    brute-force optimum; where `plans`, also checks `plan_pipelines`' plan, its bound and the quick bound."""
    over = []
    for seed in seeds:
        problems, M = mixed_slot_problems(seed)
        for p in problems:
            opt = brute_pipelines(p, M)
            if opt is None:
                continue
            bound = pipelines_lower_bound(p, M).bound_ns
            if bound > opt:
                over.append((seed, bound, opt))
            if plans:
                assert quick_pipelines_bound(p, M).bound_ns <= opt
                plan = plan_pipelines(p, M, time_limit_s=10)
                assert not pipelines_violations(p, plan, M)
                assert cost_pipelines(p, plan.pipelines, solver_status="x").iteration_ns == plan.iteration_ns
                assert plan.lower_bound_ns <= opt <= plan.iteration_ns, (seed, plan.lower_bound_ns, opt)
    return over


@pytest.mark.parametrize("seed", [0, 10, 20, 26])
def test_mixed_degree_bound_against_brute_force(seed):
    """Bound <= the optimum over every plan of the mixed slot problem <= the plan found."""
    assert _above_optimum([seed], plans=True) == []


def test_a_bound_too_strong_is_above_an_optimum(monkeypatch):
    """Negative control: with the sync floor half as large again, the bound is above the optimum of seed 20's mixed
    problems (two pipelines of one degree-1 slot each, their sync the slices' rings of whole weights)."""
    floor = pipeline_bounds.sync_floor_ns
    monkeypatch.setattr(pipeline_bounds, "sync_floor_ns", lambda *a, **k: int(floor(*a, **k) * 1.5))
    assert _above_optimum([20], plans=False)


def test_a_coarsened_solve_prints_the_slices_sync():
    """The coarse problem of NOTE [coarsened solve] keeps no `tp_sync` (its merged weights have no one split), but
    it only ever plans single pipelines: a pipelines plan is costed on the problem it was asked for. Two pipelines,
    one with a TP-2 stage, solved coarsened: the step is the slowest pipeline plus the slices' sync (every weight
    split at TP 2: the degree-1 stages' ranks join both slices), not the sync of the same weights as whole rings."""
    from test_pipeline_layers import layered

    from hetpart.partitioner import TIME_NS, WEIGHTS, Device, Link
    from hetpart.partitioner.costs import allreduce_ns, tp_shard_bytes

    p = layered()
    g = p.graph.copy()
    for _, a in g.nodes(data=True):
        a[TIME_NS] = {**a[TIME_NS], "fast/tp2": int(a[TIME_NS]["fast"] * 0.6)}
    whole = dict(p.weights)
    link = Link(5000, 20)
    p = dataclasses.replace(
        p, graph=g, devices=[d for d in p.devices if d.node != "fast1"] + [Device("t", "fast/tp2", "fast1", 16_000)],
        weights={w: tp_shard_bytes(b, 2) for w, b in whole.items()}, held_bytes_of={"fast": whole, "slow": whole},
        intra_node_links={d.node: link for d in p.devices}, network=link,
        tp_sync=TPSyncLayout({"fast/tp2": 2}, {2: {w: (0, 1) for w in whole}}, whole))
    plan = fixed_pipelines(p, [["t", "fast0/0"], ["fast0/1", "slow0/0"]], [2, 2], time_limit_s=10, coarsen_above=10)
    assert all(q.plan.stats.coarsened for q in plan.pipelines)
    # By hand: each degree-1 rank sums, per weight, both its halves with a TP-2 rank (2 ranks) or the whole weight
    # with the other pipeline's degree-1 rank (2 ranks); buckets by ranks; the slowest rank's sum.
    stage_of = {}
    for q in plan.pipelines:
        for s in q.plan.stages:
            for v in s.nodes:
                stage_of.setdefault(v, []).append(s.device)
    buckets: dict[tuple, int] = {}
    for v in g.nodes:
        for w in g.nodes[v][WEIGHTS]:
            a, b = stage_of[v]
            if a == "t":
                for j in range(2):
                    buckets[(("t", j), (b, 0))] = buckets.get((("t", j), (b, 0)), 0) + whole[w] // 2
            elif a != b:
                buckets[((a, 0), (b, 0))] = buckets.get(((a, 0), (b, 0)), 0) + whole[w]
    per_rank: dict[tuple, int] = {}
    for ranks, nbytes in buckets.items():
        for r in ranks:
            per_rank[r] = per_rank.get(r, 0) + allreduce_ns(link, nbytes, 2)
    sync = max(per_rank.values())
    assert plan.grad_sync_ns == sync and plan.iteration_ns == max(q.time_ns for q in plan.pipelines) + sync
    assert sync != grad_sync_ns(dataclasses.replace(p, tp_sync=None), plan.pipelines)[0]
