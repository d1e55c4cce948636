"""NOTE [lexicographic re-plan]: the re-plan's choice against a brute force over every plan of small problems."""

from __future__ import annotations

import math
import random

import pytest

from partition_cases import make_problem, random_problem, valid_plans
from hetpart.partitioner import solve
from hetpart.partitioner.evaluate import bottleneck_ns
from hetpart.partitioner.problem import Device, Link
from hetpart.partitioner.replan import CHECKPOINT, lexicographic_plan, moves


def _holders(problem, seed: int) -> dict[str, tuple[str, ...]]:
    """Each weight on a random set of devices, some of them lost ("gone/0")."""
    rng = random.Random(seed)
    names = [d.name for d in problem.devices] + ["gone/0"]
    return {w: tuple(rng.sample(names, rng.randint(1, 2))) for w in problem.weights}


def _brute(problem, holders, slack: float):
    plans = list(valid_plans(problem))
    if not plans:
        return None
    best = min(bottleneck_ns(stages) for _, _, stages in plans)
    limit = math.floor(best * (1 + slack))
    keys = []
    for stage_of, devs, stages in plans:
        if bottleneck_ns(stages) <= limit:
            mv = moves(problem, stage_of, devs, holders)
            keys.append((mv.between_bytes, mv.within_bytes))
    return best, min(keys)


@pytest.mark.parametrize("seed", range(24))
@pytest.mark.parametrize("slack", [0.0, 0.3])
def test_lexicographic_choice_matches_brute_force(seed, slack):
    problem = random_problem(seed)
    if problem.graph.number_of_nodes() > 5:
        pytest.skip("the brute force over 6 nodes on 4 devices takes seconds")
    problem.devices.append(Device("d3", "a", "m1", problem.devices[0].capacity_bytes))  # a twin on another machine
    problem.intra_node_links["m1"] = problem.intra_node_links["m0"]
    holders = _holders(problem, seed)
    want = _brute(problem, holders, slack)
    if want is None:
        pytest.skip("no plan fits")
    scratch = solve(problem, time_limit_s=10)
    assert scratch.bottleneck_ns == want[0]
    got = lexicographic_plan(problem, scratch, holders, slack=slack, time_limit_s=10)
    assert got.status == ["OPTIMAL", "OPTIMAL"]
    assert got.plan.bottleneck_ns <= math.floor(want[0] * (1 + slack))
    assert (got.moves.between_bytes, got.moves.within_bytes) == want[1]
    scratch_key = (got.scratch_moves.between_bytes, got.scratch_moves.within_bytes)
    assert (got.moves.between_bytes, got.moves.within_bytes) <= scratch_key


def test_moves_by_hand():
    # Two weights: w0 held by d0 (survives), w1 only by a lost device; the plan puts both on d1 (machine m0,
    # like d0): w0 moves within m0, w1 comes from the checkpoint over the network.
    net, intra = Link(1000, 10_000), Link(100_000, 1_000)
    p = make_problem({"x": {"time": {"a": 1}, "weights": ["w0", "w1"]}}, [],
                     [Device("d0", "a", "m0", 100), Device("d1", "a", "m0", 100)],
                     weights={"w0": 4000, "w1": 2000}, intra=intra, network=net)
    mv = moves(p, {"x": 0}, ["d1"], {"w0": ("d0",), "w1": ("lost",)})
    assert (mv.between_bytes, mv.within_bytes, mv.checkpoint_bytes) == (0, 4000, 2000)
    assert [(m.weight, m.source) for m in mv.moves] == [("w0", "d0"), ("w1", CHECKPOINT)]
    # costs.transfer_ns: latency + ceil(bytes * 1000 / bandwidth)
    assert mv.link_time_ns == {"m0 -> m0": 1_000 + 40, f"{CHECKPOINT} -> m0": 10_000 + 2_000}
    assert mv.time_ns == 12_000
    assert moves(p, {"x": 0}, ["d0"], {"w0": ("d0",), "w1": ("d1",)}).within_bytes == 2000


@pytest.mark.parametrize("seed", range(12))
def test_a_large_problems_relabeling_keeps_every_cost_and_moves_least(seed, monkeypatch):
    # NOTE [large re-plan], forced on a small problem: 3 machines of one kind, 2 devices each.
    import itertools

    from hetpart.partitioner import replan
    from hetpart.partitioner.evaluate import evaluate

    problem = random_problem(seed)
    cap = 1000  # roomy: every plan fits
    for d in list(problem.devices):
        problem.devices.remove(d)
    problem.devices.extend(Device(f"m{i}/{j}", "a", f"m{i}", cap) for i in range(3) for j in range(2))
    problem.intra_node_links = {f"m{i}": Link(1000, 5) for i in range(3)}
    problem.network = Link(100, 50)
    holders = {w: tuple(random.Random(seed + i).sample([d.name for d in problem.devices] + ["gone/0"], 2))
               for i, w in enumerate(sorted(problem.weights))}
    scratch = solve(problem, time_limit_s=10)
    monkeypatch.setattr(replan, "RELABEL_ABOVE", 0)
    got = lexicographic_plan(problem, scratch, holders)
    assert got.status == ["RELABELED"]
    key = lambda s: (s.compute_ns, s.comm_in_ns, s.comm_out_ns, s.memory_bytes)  # noqa: E731
    assert [key(s) for s in got.plan.stages] == [key(s) for s in scratch.stages]
    # Brute force over every relabeling (stages that shared a machine share one, the others do not; every
    # machine here is of one kind): the chosen one moves the least of them, and each keeps every cost.
    machine = {d.name: d.node for d in problem.devices}
    old = scratch.device_of_stage
    options = []
    for devs in itertools.permutations([d.name for d in problem.devices], len(scratch.stages)):
        if all((machine[devs[i]] == machine[devs[j]]) == (machine[old[i]] == machine[old[j]])
               for i in range(len(old)) for j in range(len(old))):
            stages = evaluate(problem, scratch.stage_of, list(devs))
            assert [key(s) for s in stages] == [key(s) for s in scratch.stages]
            mv = moves(problem, scratch.stage_of, list(devs), holders)
            options.append((mv.between_bytes, mv.within_bytes))
    assert (got.moves.between_bytes, got.moves.within_bytes) == min(options)


@pytest.mark.parametrize("seed", range(10))
def test_the_kept_order_candidate_is_the_fewest_bytes_over_its_cuts(seed, monkeypatch):
    # NOTE [large re-plan]'s second candidate on a chain whose every node reads a weight of its own: against
    # every contiguous split of the node order over the old devices in their order, within the cap.
    import itertools

    from hetpart.partitioner import replan
    from hetpart.partitioner.evaluate import evaluate
    from hetpart.partitioner.problem import PIN_FIRST

    rng = random.Random(seed)
    n = 6
    names = [f"v{i}" for i in range(n)]
    nodes = {v: {"time": {"a": rng.randint(5_000, 40_000)}, "out": rng.choice([10, 100, 1000]),
                 "weights": [f"w{i}"]} for i, v in enumerate(names)}
    nodes["v0"]["pin"] = PIN_FIRST
    devices = [Device(f"m{i}/{j}", "a", f"m{i}", 10**6) for i in range(2) for j in range(2)]
    problem = make_problem(nodes, list(zip(names, names[1:])), devices,
                           weights={f"w{i}": rng.randint(1, 50) for i in range(n)},
                           intra=Link(100_000, 5), network=Link(10_000, 50))
    old = [d.name for d in devices] + ["gone/0"]
    rng.shuffle(old)
    holders = {f"w{i}": (old[min(i * len(old) // n, len(old) - 1)],) for i in range(n)}
    scratch = solve(problem, time_limit_s=10)
    slack = 0.9
    limit = math.floor(scratch.bottleneck_ns * (1 + slack))
    got = replan._kept_order(problem, scratch, holders, old, limit)
    alive = [d for d in old if d != "gone/0"]
    want = None
    for cuts in itertools.combinations(range(1, n), len(alive) - 1):
        bounds = [0, *cuts, n]
        stage_of = {v: k for k in range(len(alive)) for v in names[bounds[k]:bounds[k + 1]]}
        if bottleneck_ns(evaluate(problem, stage_of, alive)) <= limit:
            mv = moves(problem, stage_of, alive, holders)
            want = min(want or (mv.between_bytes, mv.within_bytes), (mv.between_bytes, mv.within_bytes))
    assert want is not None  # some split of the old order is within the cap here
    assert got is not None and got[1] == alive
    mv = moves(problem, got[0], got[1], holders)
    assert (mv.between_bytes, mv.within_bytes) == want
    assert bottleneck_ns(evaluate(problem, got[0], got[1])) <= limit
