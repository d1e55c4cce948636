"""NOTE [re-plan by shard]: the bytes a tensor-parallel re-plan moves, counted by an independent route, and its
lexicographic choice against a brute force over every plan of small TP problems.

The independent route is the resume's own read plan (NOTE [checkpoint slices]): for every new TP rank and every
weight its stage reads, `plan_reads` assembles the rank's shard (or whole copy) from the old ranks' layouts,
each cell from the first old rank that holds it, in the order the runtime prefers (the rank's own device, a
surviving device of its machine, any surviving device, then the checkpoint); each read's bytes (elements x 4)
are classed by where it comes from. Nothing of `Holdings` or part names is used there.
"""

from __future__ import annotations

import random

import pytest

from partition_cases import make_problem
from replan_checks import check_large_candidates, check_lexicographic, check_moves, read_count
from hetpart.partitioner.problem import Device, Link
from hetpart.partitioner.replan import moves
from hetpart.partitioner.replan_holdings import OldRank, tp_holdings
from hetpart.runtime.checkpoint_slices import Layout, shard_layout

T = 2
MACHINES = {f"m{i}": [f"m{i}/{j}" for j in range(4)] for i in range(2)}
MACHINE = {d: m for m, ds in MACHINES.items() for d in ds}
OLD_GROUPS = [(ds[0], ds[1]) for ds in MACHINES.values()] + [(ds[2], ds[3]) for ds in MACHINES.values()]


def _case(seed: int):
    """A chain of 3-4 nodes, each reading a weight of its own (some split by TP, some fused in 3 chunks), planned
    before on 4 TP-2 groups; 1-2 devices lost; the new problem's slots: random disjoint TP-2 groups of survivors."""
    rng = random.Random(seed)
    n = rng.randint(3, 4)
    names = [f"v{i}" for i in range(n)]
    shapes = {f"w{i}": (rng.choice([6, 12, 24]), 4) for i in range(n)}
    split = {w: rng.choice([1, 3]) for w in shapes if rng.random() < 0.6}  # weight -> chunks
    full = {w: rows * cols * 4 for w, (rows, cols) in shapes.items()}  # float32
    lost = set(rng.sample(sorted(MACHINE), rng.randint(1, 2)))
    alive = {d: MACHINE[d] for d in MACHINE if d not in lost}
    slots = []
    for m, ds in MACHINES.items():
        survivors = [d for d in ds if d in alive]
        rng.shuffle(survivors)
        for i in range(0, len(survivors) - 1, 2):
            if rng.random() < 0.8:
                slots.append(tuple(survivors[i:i + 2]))
    if len(slots) < 2:
        slots = [tuple(ds[:2]) for ds in ([d for d in MACHINES[m] if d in alive] for m in MACHINES) if len(ds) >= 2]
    nodes = {v: {"time": {"a/tp2": rng.randint(5_000, 40_000)}, "out": rng.choice([10, 1000, 10_000]),
                 "weights": [f"w{i}"]} for i, v in enumerate(names)}
    devices = [Device("+".join(s), "a/tp2", MACHINE[s[0]], 10**9) for s in slots]
    problem = make_problem(nodes, list(zip(names, names[1:])), devices,
                           weights={w: full[w] // T if w in split else full[w] for w in shapes},
                           intra=Link(100_000, 5), network=Link(1_000, 50))
    # The old plan: each weight on one old group's stage, some on a second (a tied weight).
    old_of = {w: rng.sample(range(len(OLD_GROUPS)), rng.choice([1, 1, 2])) for w in shapes}
    old_ranks = [OldRank(d, j, tuple(w for w in shapes if g in old_of[w]))
                 for g, group in enumerate(OLD_GROUPS) for j, d in enumerate(group)]
    holdings = tp_holdings(problem, T, {"+".join(s): s for s in slots}, alive, old_ranks, set(split))
    return problem, holdings, (shapes, split, old_ranks, alive)


def _layout(shape, split, w, index):
    return shard_layout(shape, {"dim": 0, "chunks": split[w], "rank": index, "degree": T}) if w in split else \
        Layout(tuple(shape))


def _independent(problem, stage_of, slots, world) -> tuple[int, int, int]:
    """(between, within, from the checkpoint) by the resume's read plan (see the module's docstring)."""
    shapes, split, old_ranks, alive = world
    return read_count(problem, stage_of, slots,
                      lambda w: [(r.device, _layout(shapes[w], split, w, r.index)) for r in old_ranks if w in r.weights],
                      lambda w, j, _: _layout(shapes[w], split, w, j), alive)


@pytest.mark.parametrize("seed", range(16))
def test_tp_moves_equal_the_resumes_own_reads(seed):
    problem, holdings, world = _case(seed)
    check_moves(problem, holdings, lambda *plan: _independent(*plan, world))


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("slack", [0.0, 0.5])
def test_tp_lexicographic_choice_matches_brute_force_by_the_independent_count(seed, slack):
    problem, holdings, world = _case(seed)
    check_lexicographic(problem, holdings, lambda *plan: _independent(*plan, world), slack)


@pytest.mark.parametrize("seed", range(8))
def test_tp_large_re_plan_candidates_count_the_same_bytes(seed, monkeypatch):
    problem, holdings, world = _case(seed)
    check_large_candidates(problem, holdings, lambda *plan: _independent(*plan, world),
                           ["+".join(g) for g in OLD_GROUPS], monkeypatch)


def test_a_part_held_at_another_index_counts_within_its_machine():
    # By hand: w split in 2 (8 bytes a shard), held by old group (m0/0, m0/1); m0/1 lost, the new slot is
    # (m0/2, m0/0): index 0 needs shard 0, which m0/0 holds at index 1 of the new slot -> within m0; index 1
    # needs shard 1, which only the lost m0/1 held -> the checkpoint.
    problem = make_problem({"x": {"time": {"a/tp2": 1}, "weights": ["w"]}}, [],
                           [Device("m0/2+m0/0", "a/tp2", "m0", 100)], weights={"w": 8})
    alive = {"m0/0": "m0", "m0/2": "m0"}
    h = tp_holdings(problem, 2, {"m0/2+m0/0": ("m0/2", "m0/0")}, alive,
                    [OldRank("m0/0", 0, ("w",)), OldRank("m0/1", 1, ("w",))], {"w"})
    mv = moves(problem, {"x": 0}, ["m0/2+m0/0"], h)
    assert (mv.between_bytes, mv.within_bytes, mv.checkpoint_bytes) == (0, 8, 8)
    assert [(m.weight, m.source, m.target) for m in mv.moves] == [("w[tp 0/2]", "m0/0", "m0/2+m0/0"),
                                                                 ("w[tp 1/2]", "checkpoint", "m0/2+m0/0")]
