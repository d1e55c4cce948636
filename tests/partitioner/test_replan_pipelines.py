"""NOTE [re-plan pipelines]: the candidates of a re-plan of data-parallel pipelines, each checked by another route.

Small problems (a chain of 4 ops with a weight each, 3 machines of 2 identical devices): the old plan is two
pipelines (2 and 3 stages) from `fixed_pipelines`; one device of the longer one is lost. Brute force: every
split of the batch for the re-split, every relabeling (machine permutation x device permutations inside each
machine) for the relabeled from-scratch plan, and the bytes each candidate moves counted by a counter of this
file, not by replan.stage_moves.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random

import networkx as nx
import pytest

from hetpart.errors import HetpartError
from hetpart.partitioner import MEM_BYTES, OUT_BYTES, PIN, PIN_FIRST, PIN_LAST, TIME_NS, WEIGHTS, Device, Link
from hetpart.partitioner.pipeline_search import plan_pipelines
from hetpart.partitioner.pipelines import fixed_pipelines, pipelines_violations, sub_problem
from hetpart.partitioner.problem import Problem, Training
from hetpart.partitioner.replan import state_to_move_bytes
from hetpart.partitioner.replan_pipelines import (
    OldPipeline, pipeline_plan, pipelines_from_json, pipelines_to_json, relabeled, replan_pipelines, resplit,
)
from hetpart.partitioner.verify import plan_violations

M = 6


def _problem(seed: int) -> Problem:
    rng = random.Random(seed)
    g = nx.DiGraph()
    weights = {}
    for i in range(4):
        weights[f"w{i}"] = rng.randint(100, 400)
        g.add_node(f"v{i}", **{TIME_NS: {"a": rng.randint(200, 900)}, MEM_BYTES: rng.randint(5, 40),
                              OUT_BYTES: rng.randint(10, 300) if i < 3 else 0, WEIGHTS: (f"w{i}",),
                              PIN: PIN_FIRST if i == 0 else PIN_LAST if i == 3 else None})
        if i:
            g.add_edge(f"v{i - 1}", f"v{i}")
    cap = int(sum(weights.values()) * 4 * rng.uniform(0.8, 1.4)) + 200  # some splits' stash does not fit (GPipe)
    devices = [Device(f"m{i}/{j}", "a", f"m{i}", cap) for i in range(3) for j in range(2)]
    training = Training(rng.choice(["gpipe", "1f1b"]), 1, {w: 3 * b for w, b in weights.items()})
    return Problem(graph=g, weights=weights, devices=devices,
                   intra_node_links={f"m{i}": Link(2000, 5) for i in range(3)},
                   network=Link(rng.choice([200, 600]), 40), training=training)


def _old(problem: Problem) -> list[OldPipeline]:
    pp = fixed_pipelines(problem, [["m0/0", "m0/1"], ["m1/0", "m1/1", "m2/0"]], [3, 3], time_limit_s=5)
    return pipelines_from_json(pipelines_to_json(pp), "test")  # through its JSON record, as `replan` reads it


def _holders(problem: Problem, old: list[OldPipeline]) -> dict[str, tuple[str, ...]]:
    out: dict[str, list[str]] = {}
    for p in old:
        for v, k in p.stage_of.items():
            for w in problem.graph.nodes[v][WEIGHTS]:
                if p.device_of_stage[k] not in out.setdefault(w, []):
                    out[w].append(p.device_of_stage[k])
    return {w: tuple(ds) for w, ds in out.items()}


def _without(problem: Problem, lost: str) -> Problem:
    return dataclasses.replace(problem, devices=[d for d in problem.devices if d.name != lost])


def _case(seed: int):
    """The problem less m1/1, the old pipelines, their weights' holders, and the from-scratch plan."""
    full = _problem(seed)
    old = _old(full)
    problem = _without(full, "m1/1")
    return problem, old, _holders(full, old), plan_pipelines(problem, M, time_limit_s=5)


def _bytes(problem: Problem, pp, holders) -> tuple[int, int]:
    """This test's own count: (between machines, within) of every pipeline stage's weights."""
    machine = {d.name: d.node for d in problem.devices}
    state = {w: state_to_move_bytes(problem, w) for w in problem.weights}  # a weight's bytes: value and optimizer
    between = within = 0
    for p in pp.pipelines:
        for k, dev in enumerate(p.plan.slot_of_stage):
            for w in sorted({w for v, s in p.plan.stage_of.items() if s == k for w in problem.graph.nodes[v][WEIGHTS]}):
                alive = [h for h in holders[w] if h in machine]
                if dev in alive or not alive:
                    continue  # held there, or read from the checkpoint by every plan
                if any(machine[h] == machine[dev] for h in alive):
                    within += state[w]
                else:
                    between += state[w]
    return between, within


@pytest.mark.parametrize("seed", range(6))
def test_the_split_is_the_least_over_every_split(seed):
    problem = _without(_problem(seed), "m1/1")
    old = _old(_problem(seed))
    survivors = ("m1/0", "m2/0")
    parts = [(p.device_of_stage, p.stage_of, p.device_of_stage) for p in old[:1]]
    parts.append(fixed_part := (survivors, *_one_stage_each(problem, survivors)))
    got = resplit(problem, parts, M)
    best, one_f1b = None, problem.training.schedule == "1f1b"
    for shares in itertools.product(range(M + 1), repeat=len(parts)):
        if sum(shares) != M:
            continue
        times = []
        for part, m in zip(parts, shares):
            if not m:
                continue
            plan = pipeline_plan(problem, *part, m)
            if plan_violations(sub_problem(problem, part[0], m), plan) or one_f1b and m < len(part[2]):
                break  # its stash does not fit, or 1F1B has fewer microbatches than stages (NOTE [1F1B stages])
            times.append(plan.objective_ns)
        else:
            best = min(best, max(times)) if best is not None else max(times)
    assert fixed_part
    if best is None:
        assert got is None
        return
    assert got is not None
    pp, kept = got
    assert max(p.time_ns for p in pp.pipelines) == best
    assert not pipelines_violations(problem, pp, M) and sum(p.microbatches for p in pp.pipelines) == M
    for p, i in zip(pp.pipelines, kept):  # each part keeps its cuts and devices exactly
        assert p.plan.stage_of == parts[i][1] and tuple(p.plan.slot_of_stage) == tuple(parts[i][2])


def _one_stage_each(problem: Problem, devices: tuple[str, ...]) -> tuple[dict[str, int], tuple[str, ...]]:
    """v0 v1 on the first device, v2 v3 on the second."""
    return {"v0": 0, "v1": 0, "v2": 1, "v3": 1}, devices


@pytest.mark.parametrize("seed", range(6))
def test_the_choice_is_the_lexicographic_best_candidate_and_kept_pipelines_keep_their_stages(seed):
    problem, old, holders, scratch = _case(seed)
    got = replan_pipelines(problem, old, holders, scratch, slack=0.05, time_limit_s=1)
    names = [c.name for c in got.candidates]
    assert names[0] == "from scratch" and any(n.startswith("re-split: kept 0") for n in names), names
    for c in got.candidates:
        assert not pipelines_violations(problem, c.plan, M), c.name
        assert (c.moves.between_bytes, c.moves.within_bytes) == _bytes(problem, c.plan, holders), c.name
        for p, how in zip(c.plan.pipelines, c.how):
            if how == "kept":  # pipeline 0 survived whole: its stages exactly as before
                assert p.plan.stage_of == old[0].stage_of and tuple(p.plan.slot_of_stage) == old[0].device_of_stage
            assert "m1/1" not in p.plan.slot_of_stage
    best = min(c.plan.iteration_ns for c in got.candidates)
    limit = math.floor(best * (1 + 0.05))
    want = min(_bytes(problem, c.plan, holders) + (c.plan.iteration_ns,) for c in got.candidates
               if c.plan.iteration_ns <= limit)
    assert (got.best_ns, got.limit_ns) == (best, limit)
    assert _bytes(problem, got.chosen.plan, holders) + (got.chosen.plan.iteration_ns,) == want
    assert got.chosen.plan.iteration_ns <= limit
    record = got.to_json()
    assert record["chosen"]["name"] == got.chosen.name and len(record["candidates"]) == len(got.candidates)


@pytest.mark.parametrize("seed", range(6))
def test_the_relabeled_from_scratch_plan_moves_the_least_of_every_relabeling(seed):
    problem, old, holders, scratch = _case(seed)
    parts = relabeled(problem, scratch, holders)
    names = [d.name for d in problem.devices]
    machines = sorted({d.node for d in problem.devices})
    members = {mc: [d.name for d in problem.devices if d.node == mc] for mc in machines}
    # Only machines of one kind swap: m1 has one device left, m0 and m2 two.
    kinds = [[mc for mc in machines if len(members[mc]) == n] for n in sorted({len(v) for v in members.values()})]
    options = []
    for perm in itertools.product(*(itertools.permutations(k) for k in kinds)):
        to = {a: b for k, p in zip(kinds, perm) for a, b in zip(k, p)}
        for inner in itertools.product(*(itertools.permutations(members[to[mc]]) for mc in machines)):
            rename = {d: inner[i][members[mc].index(d)] for i, mc in enumerate(machines) for d in members[mc]}
            assert sorted(rename.values()) == sorted(names)
            pipes = [dataclasses.replace(p, plan=dataclasses.replace(
                p.plan, slot_of_stage=[rename[d] for d in p.plan.slot_of_stage])) for p in scratch.pipelines]
            options.append(_bytes(problem, dataclasses.replace(scratch, pipelines=pipes), holders))
    chosen = [dataclasses.replace(p, plan=dataclasses.replace(p.plan, slot_of_stage=list(part[2])))
              for p, part in zip(scratch.pipelines, parts)]
    assert _bytes(problem, dataclasses.replace(scratch, pipelines=chosen), holders) == min(options)
    for p, part in zip(scratch.pipelines, parts):  # every stage keeps its costs
        again = pipeline_plan(problem, *part, p.microbatches)
        assert [(s.time_ns, s.memory_bytes) for s in again.stages] == [(s.time_ns, s.memory_bytes)
                                                                       for s in p.plan.stages]


def test_each_device_a_re_plan_leaves_idle_gets_the_reason_its_candidates_give():
    # NOTE [re-plan idle reasons] (ux21: "idle: local/1, local/2: in no pipeline", a restatement), checked against
    # the candidates with this file's own byte count; seeds 0-4 give a from-scratch choice with the search's own
    # reasons and with a cheaper candidate on the device, and a relabeled choice whose candidates on it are over
    # the limit; without a from-scratch plan, the re-splits' own reasons.
    from hetpart.partitioner.pipelines import used_devices
    from hetpart.partitioner.replan_idle import replan_idle_reasons

    seen = set()
    for seed in range(5):
        for with_scratch in (True, False):
            problem, old, holders, scratch = _case(seed)
            got = replan_pipelines(problem, old, holders, scratch if with_scratch else None, time_limit_s=1)
            chosen = got.chosen
            assert set(got.devices_idle) == {d.name for d in problem.devices} - chosen.plan.used_devices
            mine = _bytes(problem, chosen.plan, holders)
            for d, why in got.devices_idle.items():
                on = [c for c in got.candidates if c is not chosen and d in used_devices(c.plan.pipelines)]
                more = [c for c in on if c.plan.iteration_ns <= got.limit_ns and _bytes(problem, c.plan, holders) > mine]
                if more:
                    assert why.startswith("bytes: ") and any(f"'{c.name}' runs a stage on it" in why for c in more)
                elif chosen is got.scratch:
                    assert why == scratch.devices_idle[d]
                elif on:
                    fastest = min(on, key=lambda c: c.plan.iteration_ns)
                    assert why.startswith(f"too slow to help: the fastest candidate that runs a stage on it, "
                                          f"'{fastest.name}'"), why
                    assert (fastest.plan.iteration_ns > got.limit_ns) == ("over the limit" in why)
                elif got.scratch is not None:
                    kind, _, said = scratch.devices_idle[d].partition(": ")
                    assert why == f"{kind}: the from-scratch plan leaves it idle too, as the search says: {said}"
                else:
                    assert why.startswith("not planned: ")
                seen.add((why.split(":")[0], chosen is got.scratch))
    assert {("bytes", True), ("too slow to help", False)} <= seen, seen
    assert any(scratch for _, scratch in seen - {("bytes", True)}), seen  # the search's own reasons
    # A choice of the relabeled from-scratch plan among the two from-scratch candidates alone (seed 0: it runs on m0
    # only): no candidate runs a stage on m1/0, m2/0, m2/1, and the from-scratch plan's reasons are said as its.
    problem, old, holders, scratch = _case(0)
    got = replan_pipelines(problem, old, holders, scratch, time_limit_s=1)
    two = [c for c in got.candidates if c.name.startswith("from scratch")]
    assert [c.name for c in two] == ["from scratch", "from scratch, relabeled"]
    got = dataclasses.replace(got, chosen=two[1], candidates=two)
    idle = replan_idle_reasons(problem, got)
    assert set(idle) == {"m1/0", "m2/0", "m2/1"} == set(scratch.devices_idle), idle
    for d, why in idle.items():
        kind, _, said = scratch.devices_idle[d].partition(": ")
        assert why == f"{kind}: the from-scratch plan leaves it idle too, as the search says: {said}"


def test_without_a_from_scratch_plan_the_re_splits_alone_are_chosen_from():
    problem, old, holders, _ = _case(0)
    got = replan_pipelines(problem, old, holders, None, time_limit_s=1)
    assert got.scratch is None and got.to_json()["from_scratch"] is None
    assert got.candidates and all(c.name.startswith("re-split: ") for c in got.candidates)
    assert got.chosen.plan.iteration_ns <= got.limit_ns == math.floor(got.best_ns * 1.02)


@pytest.mark.parametrize("seed", range(3))
def test_the_re_splits_solves_share_one_deadline(seed, monkeypatch):
    # NOTE [re-plan deadline], on a clock the test moves: every `solve` of the re-splits runs its whole limit
    # (the worst case); their limits together stay within the re-splits' share of T (one MIN_SOLVE_S floor more at
    # most), where before each solve had T of its own; a solve started with less than MIN_SOLVE_S left is not run.
    import importlib

    from hetpart.partitioner import replan_deadline

    solve_module = importlib.import_module("hetpart.partitioner.solve")

    real, limits, clock = solve_module.solve, [], [0.0]

    def timed(problem, *, time_limit_s, **kw):
        limits.append(time_limit_s)
        clock[0] += time_limit_s
        return real(problem, time_limit_s=5, **kw)

    problem, old, holders, _ = _case(seed)
    monkeypatch.setattr(solve_module, "solve", timed)
    monkeypatch.setattr(replan_deadline.time, "perf_counter", lambda: clock[0])
    T = 4.0
    got = replan_pipelines(problem, old, holders, None, deadline=replan_deadline.Deadline(T))
    assert limits, "the lost device's pipeline is repaired or replaced: some solve ran"
    assert sum(limits) <= T + replan_deadline.MIN_SOLVE_S
    assert all(lim >= replan_deadline.MIN_SOLVE_S for lim in limits) and got.candidates


@pytest.mark.parametrize("reference_part", [1.0, 0.5])
def test_a_data_parallel_re_plan_s_steps_share_one_time_limit(monkeypatch, reference_part):
    # NOTE [re-plan deadline], on a clock the test moves: the re-splits run their whole limit, the from-scratch
    # search and its baselines `reference_part` of theirs (1: the worst case); the stripes' deadline is what is
    # left of T, at least STRIPES_SHARE of it, so the limits together are T (they were 1.25 T: the stripes had
    # 0.25 T of their own); the one-pipeline baseline is not asked for (its solve overran its limit by a second
    # on 56 GPUs).
    from hetpart.partitioner import pipeline_search, replan_deadline, replan_pipelines as rp, replan_stripes

    clock, spent, asked = [0.0], {}, {}
    monkeypatch.setattr(replan_deadline.time, "perf_counter", lambda: clock[0])

    def resplits(*a, deadline, **k):
        spent["resplits"] = deadline.left()
        clock[0] += deadline.left()
        return []

    def reference(problem, m, options, *, baseline_limit_s, memo, single_up_to):
        spent["reference"] = reference_part * (options.time_limit_s + baseline_limit_s)
        asked["single_up_to"] = single_up_to
        clock[0] += spent["reference"]
        raise HetpartError("none in time")

    def stripes(*a, deadline, **k):
        spent["stripes"] = deadline.left()
        clock[0] += deadline.left()
        return []

    monkeypatch.setattr(rp, "resplit_candidates", resplits)
    monkeypatch.setattr(pipeline_search, "plan_with_baselines", reference)
    monkeypatch.setattr(replan_stripes, "stripe_candidates", stripes)
    problem, old, holders, _ = _case(0)
    T = 4.0
    with pytest.raises(HetpartError):  # no candidate at all: what matters is the time each step was given
        replan_deadline.replan_pipelines_within(problem, old, holders, 4, slack=0.02, time_limit_s=T, seed=0)
    assert asked["single_up_to"] == 0
    assert spent["stripes"] >= replan_deadline.STRIPES_SHARE * T - 1e-9
    assert spent["stripes"] == pytest.approx(T - spent["resplits"] - spent["reference"])  # all that was left
    assert sum(spent.values()) == pytest.approx(T)


def _three_machines():
    """`stripy` (test_pipeline_stripes) with a second GPU machine n2 and slow 'old' devices on n1 (400 ns an op):
    stripes over every machine, and over the GPU machines alone (NOTE [re-plan pipelines] c: every machine but
    one kind's)."""
    from test_pipeline_stripes import stripy

    p = stripy(400)
    p.devices += [Device(f"h{i}", "gpu", "n2", 250) for i in range(2)]
    p.intra_node_links["n2"] = Link(100_000, 0)
    return p, {w: ("g0",) for w in p.weights}


def test_stripes_over_every_machine_or_all_but_a_kind_cost_what_brute_force_says(monkeypatch):
    """Each stripe candidate runs f copies of stripe 0's solved plan; its step equals brute force's best over its
    own device groups (stripes are interchangeable: NOTE [striped pipelines]); the set without the slow kind is
    among them; a stripe of one machine (too little memory) is not tried; the memo keeps the solved stripes, so
    the same re-plan with nothing solved gives them again."""
    from hetpart.partitioner import pipeline_shape
    from hetpart.partitioner.pipeline_stripes import stripe_devices
    from hetpart.partitioner.replan_deadline import Deadline
    from hetpart.partitioner.replan_stripes import stripe_candidates
    from hetpart.partitioner.shape_memo import ShapeMemo

    from test_pipeline_search import brute_groups

    p, holders = _three_machines()
    M, memo = 4, ShapeMemo("")
    got = stripe_candidates(p, holders, M, deadline=Deadline(30), seed=0, memo=memo)
    plain = {c.name: c for c in got if not c.name.endswith("relabeled")}
    assert set(plain) == {"stripes: 2 x 2 stages on 3 machines", "stripes: 2 x 2 stages on 2 machines"}
    for c in got:
        assert not pipelines_violations(p, c.plan, M)
    for name, machines in (("stripes: 2 x 2 stages on 3 machines", ("n0", "n1", "n2")),
                           ("stripes: 2 x 2 stages on 2 machines", ("n0", "n2"))):
        groups = stripe_devices(p, machines, 2)
        assert all(set(q.plan.slot_of_stage) <= set(g) for q, g in zip(plain[name].plan.pipelines, groups))
        assert plain[name].plan.iteration_ns == brute_groups(p, groups, M)
    assert len(memo.stripes) == 2
    monkeypatch.setattr(pipeline_shape, "_solve_shape", lambda *a, **k: None)  # nothing solved: the memo's alone
    again = stripe_candidates(p, holders, M, deadline=Deadline(30), seed=0, memo=memo)
    assert {c.name for c in again} == {c.name for c in got}
    assert {(c.name, c.plan.iteration_ns) for c in again} <= {(c.name, c.plan.iteration_ns) for c in got}


def test_the_stripes_keep_to_their_deadline_after_the_first(monkeypatch):
    """With the deadline spent, the first set (every machine) is still solved, the others are not."""
    from hetpart.partitioner.replan_deadline import Deadline
    from hetpart.partitioner.replan_stripes import stripe_candidates

    p, holders = _three_machines()
    got = stripe_candidates(p, holders, 4, deadline=Deadline(0), seed=0)
    assert {c.name for c in got} == {"stripes: 2 x 2 stages on 3 machines",
                                     "stripes: 2 x 2 stages on 3 machines, relabeled"}


def test_past_their_deadline_the_stripes_make_no_more_candidates_and_say_what_they_left_out(monkeypatch):
    """NOTE [re-plan deadline]: on a clock the test moves, the deadline passes while the first plan is striped:
    its candidates (as is, relabeled) are kept, every later plan's are not striped, no bytes-first DP of a later
    set runs, and `left_out` says so; with time, the same call cuts nothing and makes more candidates, all valid;
    with the deadline spent from the start, the first set's bytes-first DPs still run (theirs were chosen)."""
    from hetpart.partitioner import pipeline_stripes, replan_deadline, replan_stripes
    from hetpart.partitioner.replan_deadline import Deadline
    from hetpart.partitioner.replan_stripes import stripe_candidates

    p, holders = _three_machines()
    roomy: list[str] = []
    full = stripe_candidates(p, holders, 4, deadline=Deadline(30), seed=0, left_out=roomy)
    assert roomy == [] and len({c.name for c in full}) > 2
    clock, striped, dps = [0.0], [0], [0]
    monkeypatch.setattr(replan_deadline.time, "perf_counter", lambda: clock[0])
    real_striped = pipeline_stripes.striped

    def striping(*a, **k):  # the first stripe plan's striping spends the deadline
        striped[0] += 1
        clock[0] += 100.0
        return real_striped(*a, **k)

    monkeypatch.setattr(pipeline_stripes, "striped", striping)
    monkeypatch.setattr(replan_stripes, "_bytes_first_stripes", lambda *a, **k: dps.__setitem__(0, dps[0] + 1) or [])
    left_out: list[str] = []
    got = stripe_candidates(p, holders, 4, deadline=Deadline(50), seed=0, left_out=left_out)
    assert striped[0] == 1 and dps[0] == 1  # the first set's DPs ran in time, the second set's not begun
    assert {c.name for c in got} <= {c.name for c in full} and 1 <= len(got) <= 2
    assert all(not pipelines_violations(p, c.plan, 4) for c in got)
    assert any("not striped" in x for x in left_out) and any("not re-cut bytes-first" in x for x in left_out)
    dps[0] = 0
    stripe_candidates(p, holders, 4, deadline=Deadline(0), seed=0)
    assert dps[0] == 1


def test_stripes_of_a_striped_plan_on_the_same_machines_move_nothing():
    """NOTE [re-plan pipelines] c: with the state where a striped plan put it, the stripes solved in the device
    orders of `_held_orders` (as held, reversed, as is) and relabeled include one that moves no byte; the orders
    list the machines by where they hold the model."""
    from hetpart.partitioner.replan import stage_weights
    from hetpart.partitioner.replan_deadline import Deadline
    from hetpart.partitioner.replan_holdings import as_holdings
    from hetpart.partitioner.replan_stripes import _first_held, _held_orders, stripe_candidates

    p, holders = _three_machines()
    first = [c for c in stripe_candidates(p, holders, 4, deadline=Deadline(30), seed=0)
             if c.name.startswith("stripes: 2 x 2 stages on 2 machines")][0]
    held: dict[str, list[str]] = {}
    for q in first.plan.pipelines:
        for k, ws in stage_weights(p, q.plan.stage_of).items():
            for w in ws:
                held.setdefault(w, []).append(q.plan.slot_of_stage[k])
    held_t = {w: tuple(ds) for w, ds in held.items()}
    got = stripe_candidates(p, held_t, 4, deadline=Deadline(30), seed=0)
    assert min(c.moves.between_bytes + c.moves.within_bytes for c in got) == 0
    by = [[d.node for d in prob.devices] for prob, _ in _held_orders(p, _first_held(p, as_holdings(p, held_t)))]
    first_held = p.device(held_t["wa"][0]).node  # the machine that holds the model's first weight
    assert by[-1] == [d.node for d in p.devices]  # as is, last
    assert by[1][:2] == [first_held] * 2 and by[0][2:4] == [first_held] * 2  # as held; reversed
    assert by[0][-2:] == by[1][-2:] == ["n1", "n1"]  # n1 holds nothing: last in both


def _chain_of_three_machines(times: list[int]) -> Problem:
    """A chain of len(times) ops (ns on a GPU), a 100-byte weight each, on three machines of two GPUs (stripes: two
    of three devices); a device holds four weights (and their
    gradients and optimizer state); slow network, fast machine links, no activations out."""
    names = [f"v{i}" for i in range(len(times))]
    g = nx.path_graph(names, create_using=nx.DiGraph)
    nx.set_node_attributes(g, {v: {"gpu": t} for v, t in zip(names, times)}, TIME_NS)
    nx.set_node_attributes(g, {v: (f"w{v}",) for v in names}, WEIGHTS)
    weights = {f"w{v}": 100 for v in names}
    devices = [Device(f"n{i}/{j}", "gpu", f"n{i}", 1800) for i in range(3) for j in range(2)]
    return Problem(graph=g, weights=weights, devices=devices,
                   intra_node_links={f"n{i}": Link(100_000, 0) for i in range(3)}, network=Link(10, 0),
                   training=Training("1f1b", 1, {w: 200 for w in weights}))


def _stripe0_between(problem: Problem, stage_of: dict[str, int], devices: list[str], holders) -> int:
    """This test's own count of the bytes one stripe's stages read from other machines."""
    machine = {d.name: d.node for d in problem.devices}
    return sum(state_to_move_bytes(problem, w) for v, k in stage_of.items() for w in problem.graph.nodes[v][WEIGHTS]
               if any(h in machine for h in holders[w])
               and not any(machine.get(h) == machine[devices[k]] for h in holders[w]))


def _old_stripes(rng: random.Random, n: int) -> dict[str, tuple[str, ...]]:
    """Where an old stripe layout of four machines (n3 since lost) left each weight: both devices of its stage's
    machine."""
    old = [0, *sorted(rng.sample(range(1, n), 3)), n]
    order = rng.sample(range(4), 4)  # the machine each old stage ran on
    return {f"wv{i}": (f"n{order[k]}/0", f"n{order[k]}/1") for k in range(4) for i in range(old[k], old[k + 1])}


def test_bytes_first_stripes_move_fewer_bytes_than_the_solved_ones_somewhere():
    """NOTE [re-plan pipelines] d earns its keep: over these layouts, a bytes-first stripe moves fewer bytes between
    machines than every stripe solved for time, within the slack, in some case."""
    from hetpart.partitioner.replan_deadline import Deadline
    from hetpart.partitioner.replan_stripes import stripe_candidates

    fewer = 0
    for seed in range(6):
        rng = random.Random(seed)
        p = _chain_of_three_machines([rng.randint(40, 120) for _ in range(9)])
        holders = _old_stripes(rng, 9)
        got = stripe_candidates(p, holders, 8, deadline=Deadline(30), seed=0, slack=0.3)
        solved = min(c.moves.between_bytes for c in got if "bytes-first" not in c.name)
        fewer += min((c.moves.between_bytes for c in got if "bytes-first" in c.name), default=solved) < solved
    assert fewer


def _brute_between(p: Problem, q, holders, devices: list[str], n: int, cap: int) -> int | None:
    """The fewest bytes stripe 0 reads from other machines over every cut of the chain into len(devices) stages on
    `devices` in order whose bottleneck is within `cap` and that is valid (brute force); None: no such cut."""
    S, order_nodes, brute = len(devices), [f"v{i}" for i in range(n)], None
    for cuts in itertools.combinations(range(1, n), S - 1):
        bounds = [0, *cuts, n]
        stage_of = {order_nodes[i]: k for k in range(S) for i in range(bounds[k], bounds[k + 1])}
        plan = pipeline_plan(p, q.devices, stage_of, devices, q.microbatches)
        if plan.bottleneck_ns > cap or plan_violations(sub_problem(p, q.devices, q.microbatches), plan):
            continue
        b = _stripe0_between(p, stage_of, devices, holders)
        brute = b if brute is None else min(brute, b)
    return brute


@pytest.mark.parametrize("seed", range(4))
def test_bytes_first_stripes_move_no_more_than_any_cut_of_a_solved_stripe_under_its_cap(seed):
    """NOTE [re-plan pipelines] d: with the state where an old stripe layout left it, each bytes-first candidate is
    valid, moves what this test counts, and keeps stripe 0's step within a solved stripe's step x (1 + slack); in
    each solved stripe's relabeled device order (`_relabeled_in`, which moves no more than the solved order at its
    own cuts), every plan `_step_capped` finds keeps within the bottleneck cap it was found under, each cap after
    the first is the one at which the last plan's stages meet the step cap, each plan moves no more between
    machines than every cut of the chain on that order within its cap (brute force), and one within the step cap
    and valid bounds the candidates' best."""
    from hetpart.partitioner.dp import order_tables
    from hetpart.partitioner.replan_deadline import Deadline
    from hetpart.partitioner.replan_holdings import as_holdings
    from hetpart.partitioner.replan_stripes import _relabeled_in, _step_capped, stripe_candidates

    rng = random.Random(seed)
    n, slack, M = 9, 0.3, 8
    p = _chain_of_three_machines([rng.randint(40, 120) for _ in range(n)])
    holders = _old_stripes(rng, n)
    got = stripe_candidates(p, holders, M, deadline=Deadline(30), seed=0, slack=slack)
    plain = [c for c in got if "bytes-first" not in c.name and not c.name.endswith("relabeled")]
    assert plain
    for c in got:
        assert not pipelines_violations(p, c.plan, M)
        assert (c.moves.between_bytes, c.moves.within_bytes) == _bytes(p, c.plan, holders)
    best = min(_stripe0_between(p, c.plan.pipelines[0].plan.stage_of, c.plan.pipelines[0].plan.slot_of_stage,
                                holders) for c in got)
    step_caps = [math.floor(c.plan.pipelines[0].plan.objective_ns * (1 + slack)) for c in plain]
    for c in got:
        if "bytes-first" in c.name:
            assert c.plan.pipelines[0].plan.objective_ns <= max(step_caps)
    for c, step_cap in zip(plain, step_caps):
        q = c.plan.pipelines[0]
        devices, S = _relabeled_in(p, q.devices, q.plan, holders), len(q.plan.slot_of_stage)
        assert len(set(devices)) == S and set(devices) <= set(q.devices)  # distinct devices of stripe 0's group
        assert (_stripe0_between(p, q.plan.stage_of, devices, holders)
                <= _stripe0_between(p, q.plan.stage_of, list(q.plan.slot_of_stage), holders))
        sub = sub_problem(p, q.devices, q.microbatches)
        tab = order_tables(sub)
        at = {v: j for j, v in enumerate(tab.order)}
        own = [at[v] for v, k in q.plan.stage_of.items() if at[v] > 0 and q.plan.stage_of[tab.order[at[v] - 1]] != k]
        found = _step_capped(p, q.devices, sub, tab, as_holdings(p, holders), devices, own, q.microbatches, step_cap,
                             math.floor(q.plan.bottleneck_ns * (1 + slack)))
        assert found and found[0][1] == math.floor(q.plan.bottleneck_ns * (1 + slack))
        for (a, _), (_, cap) in zip(found, found[1:]):
            fill = a.objective_ns - (q.microbatches - 1) * a.bottleneck_ns
            assert cap == (step_cap - fill) // (q.microbatches - 1)
        for plan, cap in found:
            assert plan.bottleneck_ns <= cap
            mine = _stripe0_between(p, plan.stage_of, list(plan.slot_of_stage), holders)
            brute = _brute_between(p, q, holders, devices, n, cap)
            assert brute is None or mine <= brute
            if plan.objective_ns <= step_cap and not plan_violations(sub, plan):
                assert best <= mine


def test_a_re_plan_onto_too_little_memory_says_memory_not_time_limit():
    """ux20: `replan --cluster` onto devices that together cannot hold one copy of the model said "raise
    --time-limit, or add devices"; no time limit helps there. With the memory there, the same failure (no
    candidate in time) still names the time limit (the negative control)."""
    from hetpart.partitioner import replan_deadline

    problem, old, holders, _ = _case(0)
    tiny = dataclasses.replace(problem, devices=[dataclasses.replace(d, capacity_bytes=10) for d in problem.devices])
    with pytest.raises(HetpartError) as err:
        replan_deadline.replan_pipelines_within(tiny, old, holders, M, slack=0.02, time_limit_s=2, seed=0)
    assert "no plan fits whatever the --time-limit; add devices with more memory" in str(err.value)
    assert "raise --time-limit" not in str(err.value)


def test_a_re_plan_onto_too_little_memory_is_refused_once_by_the_search_s_own_check(monkeypatch):
    """trust21: the re-plan wrote its own refusal (the new cluster's bytes against the model's) after the search's
    had been echoed as a note ("no set of the 6 devices holds the model ..."), and only once the re-splits, the
    search, its baselines and the stripes had run. Now the one check (`infeasible.check_holds_model`) refuses first:
    the search's message, word for word, nothing echoed, no candidate tried."""
    from hetpart.partitioner import replan_deadline, replan_pipelines as rp
    from hetpart.partitioner.infeasible import PipelinesRefused

    def tried(*a, **k):
        raise AssertionError("a candidate was tried for a cluster that cannot hold the model")

    problem, old, holders, _ = _case(0)
    tiny = dataclasses.replace(problem, devices=[dataclasses.replace(d, capacity_bytes=10) for d in problem.devices])
    with pytest.raises(PipelinesRefused) as search:
        plan_pipelines(tiny, M, time_limit_s=2)
    monkeypatch.setattr(rp, "resplit_candidates", tried)
    echoed: list[str] = []
    with pytest.raises(PipelinesRefused) as err:
        replan_deadline.replan_pipelines_within(tiny, old, holders, M, slack=0.02, time_limit_s=2, seed=0,
                                                echo=echoed.append)
    assert str(err.value) == str(search.value) and not echoed and err.value.memory_refused == 0
    assert str(err.value).startswith("partitioner: no set of the 5 devices holds the model (together they hold 50 B")
    monkeypatch.undo()  # the negative control: with the memory there, the re-plan runs (and echoes no refusal)
    result, _ = replan_deadline.replan_pipelines_within(problem, old, holders, M, slack=0.02, time_limit_s=2, seed=0,
                                                        echo=echoed.append)
    assert result.chosen is not None and not any("holds the model" in line for line in echoed)


def test_a_re_plan_that_found_nothing_in_time_still_names_the_time_limit(monkeypatch):
    from hetpart.partitioner import pipeline_search, replan_deadline, replan_pipelines as rp, replan_stripes

    def none(*a, **k):
        raise HetpartError("none in time")

    monkeypatch.setattr(rp, "resplit_candidates", lambda *a, **k: [])
    monkeypatch.setattr(pipeline_search, "plan_with_baselines", none)
    monkeypatch.setattr(replan_stripes, "stripe_candidates", lambda *a, **k: [])
    problem, old, holders, _ = _case(0)
    with pytest.raises(HetpartError, match="raise --time-limit"):
        replan_deadline.replan_pipelines_within(problem, old, holders, M, slack=0.02, time_limit_s=2, seed=0)
