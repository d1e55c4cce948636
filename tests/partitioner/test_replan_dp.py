"""NOTE [re-plan DP]: the bytes-first DP against a brute force over its family of plans on small chains."""

from __future__ import annotations

import itertools
import random

import pytest

from partition_cases import make_problem
from hetpart.partitioner.dp import order_tables, valid_cuts
from hetpart.partitioner.evaluate import bottleneck_ns, evaluate
from hetpart.partitioner.problem import Device, Link, Plan
from hetpart.partitioner.replan import moves, state_to_move_bytes
from hetpart.partitioner import replan_dp
from hetpart.partitioner.replan_dp import bytes_first_plan, candidate_positions
from hetpart.partitioner.replan_holdings import as_holdings
from hetpart.partitioner.verify import plan_violations


def _case(seed: int):
    """A 6-node chain, a weight per node, on 3 machines (types a, b, a); an old plan on some of the devices,
    one of them lost ("gone/0"), the others idle (free)."""
    rng = random.Random(seed)
    n = 6
    names = [f"v{i}" for i in range(n)]
    nodes = {v: {"time": {"a": rng.randint(5_000, 40_000), "b": rng.randint(5_000, 80_000)},
                 "out": rng.choice([10, 1000, 100_000]), "weights": [f"w{i}"], "mem": rng.randint(1, 30)}
             for i, v in enumerate(names)}
    devices = [Device("m0/0", "a", "m0", 200), Device("m0/1", "a", "m0", 200), Device("m1/0", "b", "m1", 90),
               Device("m1/1", "b", "m1", 90), Device("m2/0", "a", "m2", 200)]
    problem = make_problem(nodes, list(zip(names, names[1:])), devices,
                           weights={f"w{i}": rng.randint(1, 50) for i in range(n)},
                           intra=Link(100_000, 5), network=Link(2_000, 50))
    pool = [d.name for d in devices]
    rng.shuffle(pool)
    old = pool[:rng.randint(1, 3)] + ["gone/0"]
    rng.shuffle(old)
    bounds = sorted(rng.sample(range(1, n), len(old) - 1))
    stage = [sum(i >= b for b in bounds) for i in range(n)]
    holders = {f"w{i}": (old[stage[i]],) for i in range(n)}
    return problem, names, old, holders


def _family(problem, old: list[str], holders) -> list[list[str]]:
    """Every device sequence of NOTE [re-plan DP]: the old devices alive in order, each kept or skipped, with
    each free device (one per class here) inserted at most once, at a place where the old order changes
    machine (its start and end too)."""
    dev = {d.name: d for d in problem.devices}
    alive = [d for d in old if d in dev]
    held = {h for hs in holders.values() for h in hs}
    free = sorted(d for d in dev if d not in held and d not in alive)
    places = sorted({0, len(alive)} | {i for i in range(1, len(alive)) if dev[alive[i]].node != dev[alive[i - 1]].node})
    out = set()
    for keep in itertools.product([False, True], repeat=len(alive)):
        for where in itertools.product([None, *places], repeat=len(free)):
            seq = []
            for i in range(len(alive) + 1):
                seq += [f for f, at in zip(free, where) if at == i]
                if i < len(alive) and keep[i]:
                    seq.append(alive[i])
            if seq:
                out.add(tuple(seq))
    return [list(s) for s in sorted(out)]


INEXACT: list[int] = []


@pytest.mark.parametrize("seed", range(16))
def test_bytes_first_plan_is_the_fewest_bytes_of_its_family(seed, monkeypatch):
    dp = replan_dp._dp
    problem, names, old, holders = _case(seed)
    n = len(names)
    tab = order_tables(problem)
    valid = valid_cuts(tab)
    held = as_holdings(problem, holders)
    P = candidate_positions(tab, problem, held, [])
    assert set(P) >= {j for j in range(1, n) if valid[j]}  # every cut position: the family's cuts are all here
    # The cap: a bottleneck between the fastest and the slowest plans of the family, so it binds.
    options = []
    for seq in _family(problem, old, holders):
        for cuts in itertools.combinations(range(1, n), len(seq) - 1):
            bounds = [0, *cuts, n]
            stage_of = {v: k for k in range(len(seq)) for v in names[bounds[k]:bounds[k + 1]]}
            stages = evaluate(problem, stage_of, seq)
            plan = Plan(stage_of=stage_of, slot_of_stage=seq, stages=stages, bottleneck_ns=bottleneck_ns(stages),
                        lower_bound_ns=0, solver_status="FEASIBLE", solve_seconds=0.0)
            if not plan_violations(problem, plan):
                mv = moves(problem, stage_of, seq, holders)
                options.append((plan.bottleneck_ns, (mv.between_bytes, mv.within_bytes)))
    if not options:
        pytest.skip("no plan of the family fits in memory")
    times = sorted(t for t, _ in options)
    for limit in (times[0], times[len(times) // 3], times[-1]):
        want = min(key for t, key in options if t <= limit)
        runs = []
        monkeypatch.setattr(replan_dp, "_dp", lambda *a: runs.append(1) or dp(*a))
        got = bytes_first_plan(problem, tab, held, old, limit)
        if len(runs) > 1:  # a free class was used too often and then restricted: no claim
            INEXACT.append(seed)
            assert got is None or not got.exact
        if got is None:
            continue
        stage_of = {v: k for k in range(len(got.devices)) for v in tab.order[got.cuts[k]:got.cuts[k + 1]]}
        stages = evaluate(problem, stage_of, got.devices)
        assert bottleneck_ns(stages) <= limit
        plan = Plan(stage_of=stage_of, slot_of_stage=got.devices, stages=stages, bottleneck_ns=bottleneck_ns(stages),
                    lower_bound_ns=0, solver_status="FEASIBLE", solve_seconds=0.0)
        assert plan_violations(problem, plan) == []
        mv = moves(problem, stage_of, got.devices, holders)
        assert (mv.between_bytes, mv.within_bytes) == (got.between_bytes, got.within_bytes)
        if got.exact:  # the claim: the fewest of the family
            assert (got.between_bytes, got.within_bytes) == want
        else:  # a free class was restricted to one place: a plan of the family, maybe not the best
            assert (got.between_bytes, got.within_bytes) >= want
    assert bytes_first_plan(problem, tab, held, old, times[0] - 1) is None  # below every plan: none


def test_the_claim_is_made_on_a_fair_share_of_cases():
    # The brute-force test above checks the exact claim only where the DP makes it (one run, no free class
    # restricted): on these tight small cases about half of them, not none.
    assert len(set(INEXACT)) <= 10, INEXACT


@pytest.mark.parametrize("seed", range(8))
def test_a_large_re_plan_keeps_the_candidate_that_moves_least(seed, monkeypatch):
    # NOTE [large re-plan] forced on a small problem: the chosen plan is within the cap and moves no more
    # than the relabeled from-scratch plan or the bytes-first DP's plan.
    from hetpart.partitioner import replan, solve

    problem, _, old, holders = _case(seed)
    scratch = solve(problem, time_limit_s=1)
    monkeypatch.setattr(replan, "RELABEL_ABOVE", 0)
    got = replan.lexicographic_plan(problem, scratch, holders, slack=0.5, old_devices=old)
    assert got.plan.bottleneck_ns <= got.limit_ns == int(scratch.bottleneck_ns * 1.5)
    key = (got.moves.between_bytes, got.moves.within_bytes)
    relabeled = moves(problem, scratch.stage_of, replan.relabel(problem, scratch, holders), holders)
    assert key <= (relabeled.between_bytes, relabeled.within_bytes)
    dp = replan._bytes_first(problem, scratch, holders, old, got.limit_ns)
    if dp is not None:
        mv = moves(problem, *dp, holders)
        assert key <= (mv.between_bytes, mv.within_bytes)
        assert got.status[0] in ("BYTES_DP", "RELABELED", "KEPT_SCRATCH")


@pytest.mark.parametrize("seed", range(6))
def test_the_floor_is_below_every_plan(seed):
    # replan.lost_state_bytes, the lower limit spot_trace reports: no plan of the small problem moves less.
    from hetpart.partitioner.replan import lost_state_bytes

    problem, names, old, holders = _case(seed)
    floor = lost_state_bytes(problem, holders)
    assert floor == sum(state_to_move_bytes(problem, w) for w, hs in holders.items() if hs == ("gone/0",))
    least = None
    for seq in _family(problem, old + [d.name for d in problem.devices], {}):  # subsequences of that list
        for cuts in itertools.combinations(range(1, len(names)), len(seq) - 1):
            bounds = [0, *cuts, len(names)]
            stage_of = {v: k for k in range(len(seq)) for v in names[bounds[k]:bounds[k + 1]]}
            mv = moves(problem, stage_of, seq, holders)
            total = mv.between_bytes + mv.within_bytes + mv.checkpoint_bytes
            least = total if least is None else min(least, total)
    assert least is not None and least >= floor
