"""One cost model (costs.py): every engine's stage times for a given plan equal `evaluate`'s.

Each engine keeps its own encoding of NOTE [stage time] (the DP's numpy tables, the ideal DP's
bit matrices, the CP-SAT model's linear constraints, the sequence bound's budgets); these tests
cost random plans of random small problems through each encoding and compare with `evaluate`,
so a formula that drifts in one engine fails here.
"""

import dataclasses
import json
import random

import numpy as np
import pytest
from ortools.sat.python import cp_model

from hetpart.errors import HetpartError
from hetpart.partitioner import Device, Link, verify_plan
from hetpart.partitioner.bounds import sequence_bound_ns
from hetpart.partitioner.costs import (
    boundary_bytes, device_classes, first_states, link_between, next_state, same_machine, sequence_devices, stash_microbatches,
    transfer_ns,
)
from hetpart.partitioner.cpsat import _build, _canonical
from hetpart.partitioner.dp import _dp_over, contiguous_plan, dp_hint, fixed_device_dp, order_tables
from hetpart.partitioner.evaluate import bottleneck_ns, evaluate
from hetpart.partitioner.ideals import _Decider, ideal_tables
from hetpart.partitioner.problem import OUT_TENSORS, PIN_FIRST, PIN_LAST, Training
from hetpart.partitioner.problem_json import problem_from_json, problem_to_json

from partition_cases import make_problem

SEEDS = range(40)


def _problem(seed: int, pinned: bool = False):
    """A random DAG of 3..8 nodes on 2..5 devices of 2..3 types over 1..3 machines, each machine with
    its own link, sometimes (`pinned`: always) pins, sometimes training, nodes of 1..4 output tensors
    (each paying a latency per boundary, NOTE [stage time]); memory never binds (stage times are what
    is tested)."""
    rng = random.Random(seed)
    tensors = random.Random(20_000 + seed)  # (its own stream: the other draws stay those of earlier cases)
    n = rng.randint(3, 8)
    names = [f"n{i}" for i in range(n)]
    types = ["a", "b", "c"][: rng.randint(2, 3)]
    weights = {f"w{i}": rng.randint(1, 50) for i in range(3)}
    nodes = {v: {"time": {t: rng.randint(0, 60) for t in types}, "mem": rng.randint(0, 9),
                 "out": rng.choice([0, 7, 100, 1000, 4000]),
                 "weights": [w for w in sorted(weights) if rng.random() < 0.3],
                 "tensors": tensors.choice([1, 1, 2, 4])} for v in names}
    if rng.random() < 0.4 or pinned:
        nodes[names[0]]["pin"] = PIN_FIRST
    if rng.random() < 0.4 or pinned:
        nodes[names[-1]]["pin"] = PIN_LAST
    edges = [(u, v) for i, u in enumerate(names) for v in names[i + 1:] if rng.random() < 0.45]
    if pinned:  # a chain with skips: every boundary carries bytes (NOTE [sequence bound])
        edges = sorted(set(edges) | set(zip(names, names[1:])))
    machines = [f"m{i}" for i in range(rng.randint(1, 3))]
    devices = [Device(f"d{i}", rng.choice(types), rng.choice(machines), 10**12) for i in range(rng.randint(2, 5))]
    p = make_problem(nodes, edges, devices, weights=weights, network=Link(rng.choice([10, 100, 1000]),
                                                                           rng.choice([0, 30, 300])))
    p.intra_node_links = {m: Link(rng.choice([100, 1000, 20_000]), rng.choice([0, 5, 50])) for m in machines}
    if rng.random() < 0.4:
        p.training = Training(rng.choice(["gpipe", "1f1b"]), rng.randint(1, 4),
                              {w: rng.randint(0, 100) for w in weights})
    return p


def _random_plans(p, seed: int, count: int = 6):
    """Up to `count` valid contiguous plans of `p.node_order()`: (cuts, devices, stages)."""
    rng = random.Random(10_000 + seed)
    order = p.node_order()
    n = len(order)
    plans = []
    for _ in range(20 * count):
        S = rng.randint(1, min(len(p.devices), n))
        cuts = [0, *sorted(rng.sample(range(1, n), S - 1)), n]
        devices = rng.sample([d.name for d in p.devices], S)
        stage_of = {v: k for k in range(S) for v in order[cuts[k]:cuts[k + 1]]}
        plan = contiguous_plan(p, order_tables(p), cuts, devices, 0.0, {})
        try:
            verify_plan(p, plan)
        except Exception:
            continue
        plans.append((cuts, devices, evaluate(p, stage_of, devices)))
        if len(plans) == count:
            break
    return plans


def test_the_random_problems_and_plans_cover_every_link_kind_and_training():
    """The property tests below are only as good as their cases: several stages, both links, training."""
    kinds, training, stage_counts, counts = set(), 0, set(), set()
    for seed in SEEDS:
        p = _problem(seed)
        training += p.training is not None
        for cuts, devices, stages in _random_plans(p, seed):
            stage_counts.add(len(stages))
            order = p.node_order()
            counts.update(boundary_bytes(p, {v: k for k in range(len(devices)) for v in order[cuts[k]:cuts[k + 1]]},
                                         len(devices), weight=OUT_TENSORS))
            for a, b in zip(devices, devices[1:]):
                kinds.add(link_between(p, a, b) is p.network)
    assert kinds == {True, False} and training >= 5 and {1, 2, 3} <= stage_counts
    assert {0, 1, 2, 3, 4, 5} <= counts  # boundaries of no tensor, one, and several of one or more nodes


@pytest.mark.parametrize("seed", SEEDS)
def test_the_order_dp_costs_a_plan_as_evaluate_does(seed):
    """dp.py: the DP over fixed devices and cuts gives the plan's bottleneck, its tables each stage's
    memory; the DP over device classes gives its own plan's bottleneck and beats the given plan."""
    p = _problem(seed)
    tab = order_tables(p)
    for cuts, devices, stages in _random_plans(p, seed):
        S = len(devices)
        seg = fixed_device_dp(p, tab, devices, [np.array([c]) for c in cuts])
        assert seg is not None and seg.dp_ns == bottleneck_ns(stages)
        for k, s in enumerate(stages):
            mem = tab.seg_mem(np.array([cuts[k]]), np.array([cuts[k + 1]]), stash_microbatches(p, k, S))
            assert int(mem[0, 0]) == s.memory_bytes
        free = _dp_over(p, tab, np.array(cuts))
        assert free is not None and free.exact
        mine = evaluate(p, {v: k for k in range(len(free.devices))
                            for v in tab.order[free.cuts[k]:free.cuts[k + 1]]}, free.devices)
        assert free.dp_ns == bottleneck_ns(mine) <= bottleneck_ns(stages)


def _ideal_chain(p, tab, decider, cuts, devices):
    """The plan as a chain of (ideal index, class index), or None when a boundary is no ideal of `tab`
    (NOTE [twin branches] keeps only the ideals that hold the elder of two twins)."""
    index = {mask: i for i, mask in enumerate(tab.ideals)}
    cls_of = {d: c for c, cls in enumerate(decider.classes) for d in cls.devices}
    chain = []
    for k, d in enumerate(devices):
        mask = sum(1 << tab.order.index(v) for v in p.node_order()[: cuts[k]])
        if mask not in index:
            return None
        chain.append((index[mask], cls_of[d]))
    return chain


def _assert_matrices_cost_each_stage(p, decider, chain, stages):
    """The bit matrices of `_Decider.matrices(u)` hold each stage of `chain` exactly when its time is below u."""
    n = decider.tab.n
    for k, ((start, c), s) in enumerate(zip(chain, stages)):
        end = chain[k + 1][0] if k + 1 < len(chain) else n
        kin = -1 if k == 0 else same_machine(decider.classes, chain[k - 1][1], c)
        for u, want in ((s.time_ns, False), (s.time_ns + 1, True)):
            mats = decider.matrices(u)[c]
            if end == n:
                got = bool(mats[(kin, "last")][start])
            else:
                kout = same_machine(decider.classes, c, chain[k + 1][1])
                row = mats[(kin, kout)][0 if kin < 0 else start]
                got = bool(np.unpackbits(row, count=n + 1)[end])
            assert got == want, (k, u, s)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_ideal_dp_costs_a_plan_as_evaluate_does(seed):
    """ideals.py: a plan's chain of ideals has the plan's bottleneck, and the bit matrices find a chain
    below it + 1 (they cost it no higher) and none they cost below its real value."""
    p = _problem(seed)
    tab = ideal_tables(p)
    checked = 0
    for cuts, devices, stages in _random_plans(p, seed):
        worst = bottleneck_ns(stages)
        decider = _Decider(p, tab, worst + 1, ())
        chain = _ideal_chain(p, tab, decider, cuts, _canonical(p, devices))
        if chain is None:
            continue
        checked += 1
        assert decider.value(chain) == worst
        _assert_matrices_cost_each_stage(p, decider, chain, stages)
        found = decider.chain_below(worst + 1, None)
        assert found is not None and decider.value(found) <= worst
        got = decider.plan(found)
        if got is not None:
            assert got.bottleneck_ns == decider.value(found)
    assert checked or not _random_plans(p, seed)


def _fixed_cpsat(p, stage_of, devices, objective):
    """The CP-SAT model with every node's stage and every stage's device fixed: (solver, model)."""
    mdl = _build(p, objective=objective)
    m, K, S = mdl.model, mdl.num_stages, len(devices)
    for v in mdl.order:
        for k in range(K):
            m.add(mdl.y[v][k] == int(stage_of[v] <= k))
    for k in range(K):
        for name, lit in mdl.a[k].items():
            m.add(lit == int(k < S and name == devices[k]))
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    assert solver.solve(m) == cp_model.OPTIMAL
    return solver, mdl


@pytest.mark.parametrize("seed", SEEDS)
def test_the_cpsat_model_costs_a_plan_as_evaluate_does(seed):
    """cpsat.py: with the assignment fixed, the least bottleneck is the plan's, and the least latency
    makes every stage's time (compute, boundaries) evaluate's."""
    p = _problem(seed)
    for cuts, devices, stages in _random_plans(p, seed, count=3):
        devices = _canonical(p, devices)  # the model uses interchangeable devices in list order
        order = p.node_order()
        stage_of = {v: k for k in range(len(devices)) for v in order[cuts[k]:cuts[k + 1]]}
        stages = evaluate(p, stage_of, devices)
        solver, mdl = _fixed_cpsat(p, stage_of, devices, "throughput")
        assert solver.value(mdl.bottleneck) == bottleneck_ns(stages)
        solver, mdl = _fixed_cpsat(p, stage_of, devices, "latency")
        for k, s in enumerate(stages):
            assert solver.value(mdl.stage_time[k]) == s.time_ns
            assert solver.value(mdl.compute[k]) == s.compute_ns
            if k < len(stages) - 1:
                assert solver.value(mdl.comm[k]) == s.comm_out_ns


@pytest.mark.parametrize("seed", SEEDS)
def test_the_sequence_bound_never_exceeds_a_plan(seed):
    """bounds.py: the sequence bound prices each stage's boundaries with costs.py's links; priced any
    higher it would pass the best plan on transfer-bound problems like these (the DP's plan, optimal
    over contiguous plans, or a random one)."""
    p = _problem(seed, pinned=True)
    best = min([dp_hint(p).bottleneck_ns] + [bottleneck_ns(stages) for _, _, stages in _random_plans(p, seed)])
    assert sequence_bound_ns(p) <= best


def test_device_sequence_states_use_each_class_in_list_order():
    """NOTE [device sequences]: a state counts devices per class; classes run out; links by machine."""
    p = make_problem({"x": {"time": {"a": 1, "b": 1}}}, [],
                     [Device("a0", "a", "m0", 5), Device("b0", "b", "m1", 5), Device("a1", "a", "m0", 5),
                      Device("a2", "a", "m1", 9)])
    classes = device_classes(p)
    assert [c.devices for c in classes] == [("a0", "a1"), ("b0",), ("a2",)]
    start = first_states(classes)[0]
    two = next_state(classes, start, 0)
    assert two.counts == (2, 0, 0) and two.same == 1
    assert next_state(classes, two, 0) is None
    assert next_state(classes, two, 1).same == 0
    assert sequence_devices(classes, [0, 2, 0]) == ["a0", "a2", "a1"]
    coarse = device_classes(p, "type")
    assert coarse[0].machine == "" and coarse[0].capacity_bytes == 5


def test_transfer_time_is_one_formula_for_ints_and_vectors():
    link = Link(bandwidth_bytes_per_us=300, latency_ns=7)
    sizes = [0, 1, 299, 300, 12_345]
    assert transfer_ns(link, np.array(sizes)).tolist() == [transfer_ns(link, b) for b in sizes] == [
        0, 7 + 4, 7 + 997, 7 + 1000, 7 + 41_150]
    assert dataclasses.replace(link).transfer_ns(12_345) == 7 + 41_150
    tensors = [0, 1, 2, 3, 4]  # a latency per tensor (NOTE [stage time]); nothing moves, nothing paid
    assert transfer_ns(link, np.array(sizes), np.array(tensors)).tolist() == [
        transfer_ns(link, b, t) for b, t in zip(sizes, tensors)] == [0, 7 + 4, 14 + 997, 21 + 1000, 28 + 41_150]
    assert link.transfer_ns(300, 3) == 21 + 1000


def test_a_boundary_pays_a_latency_per_tensor_crossing_it():
    """NOTE [stage time]: a pass-through value pays its tensors on every boundary it crosses; a node
    of no bytes sends no tensor; a problem without OUT_TENSORS (an old analysis.json) counts 1 a node."""
    nodes = {"x": {"time": {"a": 1}, "out": 100, "pin": PIN_FIRST, "tensors": 3}, "y": {"time": {"a": 1}, "out": 50},
             "z": {"time": {"a": 1}, "out": 0}, "o": {"time": {"a": 1}, "pin": PIN_LAST}}
    p = make_problem(nodes, [("x", "y"), ("x", "o"), ("y", "o"), ("z", "o")], [Device(f"d{i}", "a", "m", 10**9)
                                                                                for i in range(3)],
                     intra=Link(bandwidth_bytes_per_us=1000, latency_ns=10))
    stage_of = {"x": 0, "y": 1, "z": 1, "o": 2}
    assert boundary_bytes(p, stage_of, 3, weight=OUT_TENSORS) == [3, 4]
    assert [s.comm_out_ns for s in evaluate(p, stage_of, ["d0", "d1", "d2"])[:2]] == [30 + 100, 40 + 150]
    again = problem_from_json(json.loads(json.dumps(problem_to_json(p))))  # ir/analysis.json keeps the count
    assert boundary_bytes(again, stage_of, 3, weight=OUT_TENSORS) == [3, 4]
    del p.graph.nodes["x"][OUT_TENSORS]  # an analysis.json written before the count: 1 a node
    assert boundary_bytes(problem_from_json(problem_to_json(p)), stage_of, 3, weight=OUT_TENSORS) == [1, 2]
    p.graph.nodes["x"][OUT_TENSORS] = 0
    with pytest.raises(HetpartError, match="out_tensors must be an int >= 1"):
        p.validate()


def test_stages_run_on_slots_and_device_of_stage_reads_their_one_device():
    """NOTE [slots]: one "device" slot per device by default; plans name slots; the old spelling holds."""
    p = _problem(3)
    assert [s.name for s in p.slots] == [d.name for d in p.devices]
    assert all(s.kind == "device" and s.devices == (s.name,) for s in p.slots)
    slot = p.slot(p.devices[-1].name)
    assert (slot.type, slot.node) == (p.devices[-1].type, p.devices[-1].node)
    plan = dp_hint(p)
    assert plan.device_of_stage == plan.slot_of_stage
    assert [(s.slot, s.devices) for s in plan.stages] == [(name, (name,)) for name in plan.slot_of_stage]
    again = dataclasses.replace(plan, device_of_stage=list(reversed(plan.slot_of_stage)))
    assert again.slot_of_stage == list(reversed(plan.slot_of_stage))
    with pytest.raises(KeyError):
        p.slot("nowhere")
    with pytest.raises(AttributeError):
        plan.device_of_stage = []  # read-only: a plan names slots
