"""The bytes a re-plan of slots of mixed tensor-parallel degrees moves
(`mixed_holdings`, `Holdings.needed`), counted by an independent route, and its lexicographic choice against a
brute force over every plan of small problems.

The independent route is the resume's own read plan (NOTE [checkpoint slices]), as in test_replan_tp.py: every
new rank's shard at its slot's degree (or its whole copy) assembled by `plan_reads` from the old ranks' layouts,
of any degree, each cell from the first old rank holding it in the runtime's order of preference (the rank's own
device, a surviving device of its machine, any surviving device, the checkpoint); bytes are elements x 4. Nothing
of `Holdings`, cells or part names is used there.
"""

from __future__ import annotations

import json
import math
import random

import pytest

from partition_cases import make_problem, random_problem, valid_plans
from replan_checks import check_large_candidates, check_lexicographic, check_moves, read_count
from hetpart.partitioner import solve
from hetpart.partitioner.problem import Device, Link
from hetpart.partitioner.problem_json import problem_from_json, problem_to_json
from hetpart.partitioner.replan import lost_state_bytes, moves
from hetpart.partitioner.replan_holdings import MixedRank, mixed_holdings
from hetpart.runtime.checkpoint_slices import Layout, shard_layout

MACHINES = {"m0": 4, "m1": 4, "m2": 2}
MACHINE = {f"{m}/{j}": m for m, n in MACHINES.items() for j in range(n)}
# The old plan: m0 a TP-2 group and two single devices, m1 one TP-4 group, m2 a TP-2 group.
OLD_GROUPS = [("m0/0", "m0/1"), ("m0/2",), ("m0/3",), ("m1/0", "m1/1", "m1/2", "m1/3"), ("m2/0", "m2/1")]
KEY = {1: "a", 2: "a/tp2", 4: "a/tp4"}


def _case(seed: int):
    """A chain of 3-4 nodes, each reading a weight of its own (some split at TP 2 and 4, some at 2 only, each in 1 or 3
    chunks), planned before on OLD_GROUPS; 1-2 devices lost; the new slots: per machine a degree its survivors allow,
    the survivors shuffled into groups of it."""
    rng = random.Random(seed)
    n = rng.randint(3, 4)
    names = [f"v{i}" for i in range(n)]
    shapes = {f"w{i}": (rng.choice([12, 24, 48]), 4) for i in range(n)}
    chunks = {w: rng.choice([1, 3]) for w in shapes}
    split2 = {w for w in shapes if rng.random() < 0.7}
    split_at = {2: split2, 4: {w for w in split2 if rng.random() < 0.7}}
    full = {w: rows * cols * 4 for w, (rows, cols) in shapes.items()}  # float32, inference: the value moves
    lost = set(rng.sample(sorted(MACHINE), rng.randint(1, 2)))
    alive = {d: MACHINE[d] for d in MACHINE if d not in lost}
    slots: list[tuple[str, ...]] = []
    for m in MACHINES:
        survivors = [d for d in MACHINE if MACHINE[d] == m and d in alive]
        rng.shuffle(survivors)
        t = rng.choice([t for t in (1, 2, 4) if t <= len(survivors)] or [1])
        slots += [tuple(survivors[i:i + t]) for i in range(0, len(survivors) - t + 1, t)]
    slots = [s for s in slots if s][:4]  # at most 4 slots: the brute force stays small
    nodes = {v: {"time": {KEY[t]: rng.randint(5_000, 40_000) // t for t in KEY}, "out": rng.choice([10, 1000, 10_000]),
                 "weights": [f"w{i}"]} for i, v in enumerate(names)}
    devices = [Device("+".join(s), KEY[len(s)], MACHINE[s[0]], 10**9) for s in slots]
    problem = make_problem(nodes, list(zip(names, names[1:])), devices, weights=dict(full),
                           intra=Link(100_000, 5), network=Link(1_000, 50))
    old_of = {w: rng.sample(range(len(OLD_GROUPS)), rng.choice([1, 1, 2])) for w in shapes}
    old_ranks = [MixedRank(d, j, len(group), tuple(w for w in shapes if g in old_of[w]),
                           frozenset(split_at.get(len(group), set())))
                 for g, group in enumerate(OLD_GROUPS) for j, d in enumerate(group)]
    holdings = mixed_holdings(shapes, {"+".join(s): s for s in slots}, {"+".join(s): len(s) for s in slots},
                              split_at, full, alive, old_ranks)
    return problem, holdings, (shapes, chunks, split_at, old_ranks, alive)


def _layout(world, w, index, degree):
    shapes, chunks, split_at = world[:3]
    if degree > 1 and w in split_at[degree]:
        return shard_layout(shapes[w], {"dim": 0, "chunks": chunks[w], "rank": index, "degree": degree})
    return Layout(tuple(shapes[w]))


def _independent(problem, stage_of, slots, world) -> tuple[int, int, int]:
    """(between, within, from the checkpoint) by the resume's read plan (see the module's docstring)."""
    old_ranks, alive = world[3], world[4]
    return read_count(problem, stage_of, slots,
                      lambda w: [(r.device, _layout(world, w, r.index, r.degree)) for r in old_ranks if w in r.weights],
                      lambda w, j, degree: _layout(world, w, j, degree), alive)


def test_needed_is_a_slots_share_by_its_degree():
    # w split at TP 2 (64 bytes whole): a TP-2 rank needs its half, a TP-1 slot the whole; r replicated: every
    # rank of a TP-2 slot needs it whole. Old plan: w and r on the TP-2 group (x/0, x/1); x/1 lost.
    slots = {"x/0+y/0": ("x/0", "y/0"), "y/1": ("y/1",)}
    h = mixed_holdings(["w", "r"], slots, {"x/0+y/0": 2, "y/1": 1}, {2: {"w"}}, {"w": 64, "r": 40},
                       {"x/0": "x", "y/0": "y", "y/1": "y"},
                       [MixedRank("x/0", 0, 2, ("w", "r"), frozenset({"w"})),
                        MixedRank("x/1", 1, 2, ("w", "r"), frozenset({"w"}))])
    assert h.needed_bytes("w", "x/0+y/0") == 64 and h.needed_bytes("w", "y/1") == 64
    assert [h.nbytes[p] for p in h.needed("w", "x/0+y/0")] == [32, 32]  # one half per rank
    assert h.needed_bytes("r", "x/0+y/0") == 80 and h.needed_bytes("r", "y/1") == 40
    # x/0 holds half 0 of w and r whole: on the TP-2 slot (x/0 at index 0) nothing moves of them; y/0 (index 1)
    # needs half 1 of w, which only the lost x/1 held, and r, which x/0 sends from another machine.
    w0, w1 = h.needed("w", "x/0+y/0")
    assert "x/0+y/0" in h.slots[w0] and not h.sources[w1]
    # The least any plan reads from the checkpoint: half of w (on either slot).
    assert h.lost_bytes(["w", "r"], slots) == 32


def test_a_checkpoints_scalar_state_is_needed_whole_by_every_rank():
    """rev25: Adam's 0-dim `step` of a split weight is never split: a resumed TP rank reads it whole
    (`saved_layouts`), but the cells counted it as shares (4 B x (t-1)/t short per weight). `scalar_bytes` is added
    whole to each rank's need (NOTE [bytes from a checkpoint] in hetpart/replan_checkpoint.py)."""
    slots = {"x/0+y/0": ("x/0", "y/0"), "y/1": ("y/1",)}
    h = mixed_holdings(["w", "r"], slots, {"x/0+y/0": 2, "y/1": 1}, {2: {"w"}}, {"w": 64, "r": 40},
                       {"x/0": "x", "y/0": "y", "y/1": "y"},
                       [MixedRank("x/0", 0, 2, ("w", "r"), frozenset({"w"})),
                        MixedRank("x/1", 1, 2, ("w", "r"), frozenset({"w"}))], {"w": 4, "r": 4})
    assert [h.nbytes[p] for p in h.needed("w", "x/0+y/0")] == [32 + 4, 32 + 4]  # each half and the step whole
    assert h.needed_bytes("w", "y/1") == 64 + 4 and h.needed_bytes("r", "x/0+y/0") == 2 * (40 + 4)


def test_a_whole_is_assembled_from_halves_of_two_old_ranks():
    # w (state 64 bytes) split at TP 2 on the old group (m/0, m/1), both alive; the new slot m/0 runs TP 1: half 0
    # is its own, half 1 comes from m/1 within the machine; nothing from the checkpoint.
    problem = make_problem({"x": {"time": {"a": 1}, "weights": ["w"]}}, [], [Device("m/0", "a", "m", 100)],
                           weights={"w": 64})
    h = mixed_holdings(["w"], {"m/0": ("m/0",)}, {"m/0": 1}, {2: {"w"}}, {"w": 64}, {"m/0": "m", "m/1": "m"},
                       [MixedRank("m/0", 0, 2, ("w",), frozenset({"w"})),
                        MixedRank("m/1", 1, 2, ("w",), frozenset({"w"}))])
    mv = moves(problem, {"x": 0}, ["m/0"], h)
    assert (mv.between_bytes, mv.within_bytes, mv.checkpoint_bytes) == (0, 32, 0)
    assert lost_state_bytes(problem, h) == 0


@pytest.mark.parametrize("seed", range(16))
def test_mixed_moves_equal_the_resumes_own_reads(seed):
    problem, holdings, world = _case(seed)
    check_moves(problem, holdings, lambda *plan: _independent(*plan, world))


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("slack", [0.0, 0.5])
def test_mixed_lexicographic_choice_matches_brute_force_by_the_independent_count(seed, slack):
    problem, holdings, world = _case(seed)
    check_lexicographic(problem, holdings, lambda *plan: _independent(*plan, world), slack)
    # The checkpoint's share of any plan is no less than the least any plan reads.
    for stage_of, slots, _ in list(valid_plans(problem))[:20]:
        assert moves(problem, stage_of, slots, holdings).checkpoint_bytes >= lost_state_bytes(problem, holdings)


@pytest.mark.parametrize("seed", range(8))
def test_mixed_large_re_plan_candidates_count_the_same_bytes(seed, monkeypatch):
    problem, holdings, world = _case(seed)
    check_large_candidates(problem, holdings, lambda *plan: _independent(*plan, world),
                           ["+".join(g) for g in OLD_GROUPS], monkeypatch)


def test_held_bytes_of_round_trips_through_json():
    # A mixed-degree problem's memory per slot type (NOTE [memory per slot type]) was lost by ir/analysis.json.
    import dataclasses

    p = random_problem(3)
    w = sorted(p.weights)
    p = dataclasses.replace(p, held_bytes_of={"x/tp2": {w[0]: 7}, "y": {w[-1]: 11}})
    q = problem_from_json(json.loads(json.dumps(problem_to_json(p))))
    assert q.held_bytes_of == p.held_bytes_of
    assert problem_from_json(problem_to_json(random_problem(3))).held_bytes_of is None


def _cluster(path, machines: dict[str, tuple[str, int]]):
    from hetpart.devices import load_cluster

    text = "[network]\nbandwidth_GBps = 1\nlatency_us = 50\n" + "".join(
        f'[[nodes]]\nname = "{m}"\ndevices = [{", ".join([repr(ty).replace(chr(39), chr(34))] * n)}]\n'
        f"link = {{ bandwidth_GBps = 2, latency_us = 20 }}\n" for m, (ty, n) in machines.items())
    path.write_text(text)
    return load_cluster(str(path))


def test_each_place_keeps_its_degree_or_falls_to_one_the_stored_costs_allow(tmp_path):
    from hetpart.errors import HetpartError
    from hetpart.replan_mixed import mixed_slots, new_places
    from hetpart.replan_tp import keep_groups

    old = _cluster(tmp_path / "old.toml", {"a": ("cpu", 4), "b": ("cpu", 1)})
    link = old.machines[0].link
    keys = {("cpu", 2, link): "cpu/tp2", ("cpu", 1, None): "cpu"}
    record = {"degree_of_place": {"a:cpu": 2, "b:cpu": 1}}
    notes = []
    # a keeps TP 2 with 3 devices left (one unused), b TP 1, the new machine c the largest costed degree it hosts.
    new = _cluster(tmp_path / "new.toml", {"a": ("cpu", 3), "b": ("cpu", 1), "c": ("cpu", 2)})
    assert new_places(record, keys, new, notes.append) == {"a:cpu": 2, "b:cpu": 1, "c:cpu": 2}
    assert notes == ["note: c:cpu runs TP 2 (new to the plan)"]
    # Old groups a/0+a/1 and a/2+a/3; a/1 lost: the group a/2+a/3 survives whole and comes first.
    lost = _cluster(tmp_path / "lost.toml", {"a": ("cpu", 4), "b": ("cpu", 1)})
    lost = type(lost)(lost.name, (type(lost.machines[0])("a", tuple(d for d in lost.machines[0].devices
                                                                    if d.name != "a/1"), link),
                                  lost.machines[1]), lost.network)
    places = new_places(record, keys, lost, notes.append)
    ordered = keep_groups(lost, [("a/0", "a/1"), ("a/2", "a/3"), ("b/0",)], places)
    assert [(s, t) for s, _, t in mixed_slots(ordered, places)] == [("b/0", 1), ("a/2+a/3", 2)]  # a/0 unused
    # One device left on a: TP 1, costed because b ran TP 1; a device type never costed is an error.
    one = _cluster(tmp_path / "one.toml", {"a": ("cpu", 1), "b": ("cpu", 1)})
    assert new_places(record, keys, one, notes.append) == {"a:cpu": 1, "b:cpu": 1}
    assert notes[-1] == "note: a:cpu runs TP 1 (was TP 2: 1 device(s) left)"
    with pytest.raises(HetpartError, match=r"machine 'a' has 1 cpu device\(s\) left \(it ran tensor-parallel degree "
                                           r"2\), and the old plan costed cpu only at degree\(s\) 2"):
        new_places(record, {("cpu", 2, link): "cpu/tp2"}, one, notes.append)
    # a's link changed: TP 2 was costed over the old link only, so a falls to TP 1 with its 2 devices, and the note
    # says why (it said "2 device(s) left", as if a device were lost).
    import dataclasses

    relinked = _cluster(tmp_path / "relinked.toml", {"a": ("cpu", 2), "b": ("cpu", 1)})
    faster = dataclasses.replace(link, bandwidth_bytes_per_s=4e9, latency_s=10e-6)
    relinked = dataclasses.replace(relinked, machines=(dataclasses.replace(relinked.machines[0], link=faster),
                                                       relinked.machines[1]))
    assert new_places(record, keys, relinked, notes.append) == {"a:cpu": 1, "b:cpu": 1}
    assert notes[-1] == ("note: a:cpu runs TP 1 (was TP 2: its link is now 4 GB/s, 10 us, and the stored costs of "
                         "TP 2 are for the old link: partition from scratch to cost TP 2 over the new one)")
    with pytest.raises(HetpartError, match=r"costed cpu only at degree\(s\) none over its link \(4 GB/s, 10 us\), "
                                           r"degree\(s\) 2 only over another link"):
        new_places(record, {("cpu", 2, link): "cpu/tp2"}, relinked, notes.append)
    # A device type the old plan never costed (`--add a100-40g@a`): it said "costed ... only at degree(s) none".
    added = _cluster(tmp_path / "added.toml", {"a": ("cpu", 2), "b": ("cpu", 1), "c": ("a100-40g", 1)})
    with pytest.raises(HetpartError, match=r"machine 'c' has 1 a100-40g device\(s\), a device type the old plan "
                                           r"never costed \(it costed cpu\): .* partition from scratch"):
        new_places(record, keys, added, notes.append)


# A fall of degree: m0's old TP-4 group loses 1-2 devices and m0 runs TP 2; m1 keeps its TP-2 group.
FALL_OLD = [("m0/0", "m0/1", "m0/2", "m0/3"), ("m1/0", "m1/1")]


def _fall_world(seed: int):
    """A chain of 2-3 nodes, each reading a weight of its own (split at TP 2, some at 4 too), held before by one or
    both old groups of FALL_OLD; 1-2 devices of m0 lost."""
    rng = random.Random(seed)
    n = rng.randint(2, 3)
    names = [f"v{i}" for i in range(n)]
    shapes = {f"w{i}": (rng.choice([24, 48]), 4) for i in range(n)}
    chunks = {w: rng.choice([1, 3]) for w in shapes}
    split_at = {2: set(shapes), 4: {w for w in shapes if rng.random() < 0.7}}
    full = {w: rows * cols * 4 for w, (rows, cols) in shapes.items()}
    lost = set(rng.sample(FALL_OLD[0], rng.randint(1, 2)))
    alive = {d: d.split("/")[0] for g in FALL_OLD for d in g if d not in lost}
    nodes = {v: {"time": {"a/tp2": rng.randint(5_000, 40_000)}, "out": rng.choice([10, 1000, 10_000]),
                 "weights": [f"w{i}"]} for i, v in enumerate(names)}
    old_of = {w: rng.sample(range(len(FALL_OLD)), rng.choice([1, 1, 2])) for w in shapes}
    old_ranks = [MixedRank(d, j, len(group), tuple(w for w in shapes if g in old_of[w]),
                           frozenset(split_at[len(group)]))
                 for g, group in enumerate(FALL_OLD) for j, d in enumerate(group)]
    return names, nodes, full, (shapes, chunks, split_at, old_ranks, alive)


def _fall_problem(world, slots):
    names, nodes, full, (shapes, chunks, split_at, old_ranks, alive) = world
    devices = [Device("+".join(s), "a/tp2", alive[s[0]], 10**9) for s in slots]
    problem = make_problem(nodes, list(zip(names, names[1:])), devices, weights=dict(full),
                           intra=Link(100_000, 5), network=Link(1_000, 50))
    holdings = mixed_holdings(shapes, {"+".join(s): s for s in slots}, {"+".join(s): 2 for s in slots}, split_at,
                              full, alive, old_ranks)
    return problem, holdings


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("slack", [0.0, 0.5])
def test_the_groups_of_a_fall_in_degree_move_the_fewest_bytes_of_every_grouping(seed, slack):
    # NOTE [re-plan of tensor-parallel plans]: `keep_groups`' grouping and the lexicographic plan on it move no more
    # (between, then within machines; the independent count) than the best plan of every grouping of the survivors
    # (each ordered pair of m0's, each order of m1's). It put a survivor at its old TP-4 index, which is no
    # index of TP 2 past 1, where TP-4's shard j lies in TP-2's j // 2.
    import itertools

    from hetpart.devices.catalog import CATALOG
    from hetpart.devices.cluster import Cluster, ClusterDevice, LinkSpec, Machine
    from hetpart.partitioner.evaluate import bottleneck_ns
    from hetpart.partitioner.replan import lexicographic_plan
    from hetpart.replan_mixed import mixed_slots
    from hetpart.replan_tp import keep_groups

    world = _fall_world(seed)
    alive = world[3][4]
    count = lambda problem, stage_of, slots: _independent(problem, stage_of, slots, world[3])  # noqa: E731
    m0, m1 = sorted(d for d in alive if d.startswith("m0")), ["m1/0", "m1/1"]
    best, counts = None, []
    for s0 in itertools.permutations(m0, 2):
        for s1 in itertools.permutations(m1):
            problem, _ = _fall_problem(world, [s0, s1])
            for stage_of, slots, stages in valid_plans(problem):
                counts.append((bottleneck_ns(stages), count(problem, stage_of, slots)[:2]))
                best = min(best or counts[-1][0], counts[-1][0])
    want = min(c for b, c in counts if b <= math.floor(best * (1 + slack)))

    link = LinkSpec(2e9, 20e-6)
    cluster = Cluster("c", tuple(Machine(m, tuple(ClusterDevice(d, CATALOG["cpu"], m, 10**9) for d in sorted(alive)
                                                  if alive[d] == m), link) for m in ("m0", "m1")), link)
    places = {"m0:cpu": 2, "m1:cpu": 2}
    slots = [members for _, members, _ in mixed_slots(keep_groups(cluster, FALL_OLD, places), places)]
    assert slots[1] == ("m1/0", "m1/1")  # the group that survives whole, in its order
    problem, holdings = _fall_problem(world, slots)
    scratch = solve(problem, time_limit_s=10)
    assert scratch.bottleneck_ns == best
    got = lexicographic_plan(problem, scratch, holdings, slack=slack, time_limit_s=10)
    assert (got.moves.between_bytes, got.moves.within_bytes) == want
    assert count(problem, got.plan.stage_of, got.plan.device_of_stage)[:2] == want


def test_a_fall_from_tp_4_to_2_puts_each_survivor_at_the_index_its_shard_nests_in():
    # The reviewer's case: a/0 lost of the TP-4 group a/0..a/3; a/1 (TP-4 shard 1, in TP-2 shard 0) at index 0 and
    # a/2 or a/3 (in shard 1) at 1: it gave a/2+a/1. a/3 lost: a/0 or a/1 at 0, a/2 at 1 (it gave a/0+a/1).
    from hetpart.devices.catalog import CATALOG
    from hetpart.devices.cluster import Cluster, ClusterDevice, LinkSpec, Machine
    from hetpart.replan_tp import keep_groups

    link = LinkSpec(2e9, 20e-6)
    old = [("a/0", "a/1", "a/2", "a/3")]
    for lost, want in (("a/0", ("a/1", "a/2")), ("a/3", ("a/0", "a/2")), ("a/1", ("a/0", "a/2"))):
        devices = tuple(ClusterDevice(d, CATALOG["cpu"], "a", 10**9) for d in old[0] if d != lost)
        ordered = keep_groups(Cluster("c", (Machine("a", devices, link),), link), old, {"a:cpu": 2})
        assert tuple(d.name for d in ordered.machines[0].devices[:2]) == want
