"""NOTE [shape memo]: a search started from another search's solved shapes, checked against brute force.

The memo is made by a search on a problem, then given to a search on the problem less one machine (what a
re-plan sees): its plan must be valid, costed truly, no slower than the search without the memo, and its bound
at most the brute-force optimum (the certificate a re-plan prints stays true). With every shape's solve made to
run out of time, the memo's plans alone must still give a plan; a memo of another problem is not used.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from hetpart.errors import HetpartError
from hetpart.partitioner import TIME_NS
from hetpart.partitioner import pipeline_search, pipeline_shape
from hetpart.partitioner.pipeline_search import plan_pipelines
from hetpart.partitioner.pipeline_shape import ShapeSolve
from hetpart.partitioner.pipelines import cost_pipelines, pipelines_violations
from hetpart.partitioner.shape_memo import ShapeMemo, problem_fingerprint

from test_pipeline_search import brute_pipelines, small_problem

CASES = [0, 1, 2, 4, 6, 7]


def _less_one_machine(problem):
    """The problem without its last machine's devices (a re-plan after that machine was lost), or None."""
    machines = sorted({d.node for d in problem.devices})
    if len(machines) < 2:
        return None
    lost = machines[-1]
    return dataclasses.replace(problem, devices=[d for d in problem.devices if d.node != lost],
                               intra_node_links={m: x for m, x in problem.intra_node_links.items() if m != lost})


def _memo_of(problem, M) -> ShapeMemo:
    memo = ShapeMemo("")
    plan_pipelines(problem, M, time_limit_s=10, memo=memo)
    return ShapeMemo.from_json(json.loads(json.dumps(memo.to_json())), "memo")  # as ir/shapes.json carries it


@pytest.mark.parametrize("seed", CASES)
def test_a_search_from_the_memo_is_no_worse_and_its_certificate_holds(seed):
    p, M = small_problem(seed)
    memo = _memo_of(p, M)
    assert memo.plans and memo.fingerprint == problem_fingerprint(p, M)
    q = _less_one_machine(p)
    opt = brute_pipelines(q, M) if q is not None else None
    if opt is None:
        pytest.skip("no plan without the last machine")
    without = plan_pipelines(q, M, time_limit_s=10)
    got = plan_pipelines(q, M, time_limit_s=10, memo=memo)
    assert not memo.ignored and got.stats["shapes_from_memo"] >= 1
    assert not pipelines_violations(q, got, M)
    assert cost_pipelines(q, got.pipelines, solver_status="x").iteration_ns == got.iteration_ns
    assert opt <= got.iteration_ns <= without.iteration_ns
    assert got.lower_bound_ns <= opt  # the certificate stays true
    if got.solver_status == "OPTIMAL":
        assert got.iteration_ns == opt


@pytest.mark.parametrize("seed", CASES)
def test_the_memo_alone_gives_a_plan_when_no_shape_is_solved_in_time(seed, monkeypatch):
    p, M = small_problem(seed)
    first = plan_pipelines(p, M, time_limit_s=10)
    memo = _memo_of(p, M)
    monkeypatch.setattr(pipeline_search, "_solve_shape_why", lambda *a, **k: ShapeSolve(None, timed_out=True))
    monkeypatch.setattr(pipeline_search, "_solve_shape", lambda *a, **k: None)
    monkeypatch.setattr(pipeline_shape, "_solve_shape", lambda *a, **k: None)  # GPipe's `_most_gpipe`
    with pytest.raises(HetpartError, match="no pipeline shape was solved"):
        plan_pipelines(p, M, time_limit_s=2)
    got = plan_pipelines(p, M, time_limit_s=2, memo=memo)
    assert not pipelines_violations(p, got, M)
    assert got.lower_bound_ns <= brute_pipelines(p, M) <= got.iteration_ns
    # The memo holds every candidate the first search had (its stripes and one-machine mixes are made again).
    assert got.iteration_ns <= first.iteration_ns


def test_a_memo_of_another_problem_is_not_used():
    p, M = small_problem(0)
    memo = _memo_of(p, M)
    g = p.graph.copy()
    v = next(iter(g.nodes))
    g.nodes[v][TIME_NS] = {t: x + 1 for t, x in g.nodes[v][TIME_NS].items()}  # the model's costs changed
    other = dataclasses.replace(p, graph=g)
    assert problem_fingerprint(other, M) != memo.fingerprint
    assert problem_fingerprint(p, M + 1) != memo.fingerprint  # another batch split
    got = plan_pipelines(other, M, time_limit_s=10, memo=memo)
    assert memo.ignored and got.stats["shapes_from_memo"] == 0
    assert memo.fingerprint == problem_fingerprint(other, M)  # it now records this problem's shapes
    assert not pipelines_violations(other, got, M)


def test_a_memo_that_is_not_one_is_refused_with_where():
    with pytest.raises(HetpartError, match="shapes.json: not a memo of solved shapes"):
        ShapeMemo.from_json({"version": 1, "fingerprint": "x", "plans": {"k": [{"m_ref": 1}]}, "no_plan": {}},
                            "out/ir/shapes.json")
    with pytest.raises(HetpartError, match="shapes.json: version 7"):
        ShapeMemo.from_json({"version": 7}, "out/ir/shapes.json")


@pytest.mark.parametrize("seed", CASES)
def test_a_memo_plan_costs_what_evaluate_says_on_the_new_cluster(seed):
    """The stage costs a memo plan carries (NOTE [shape memo]) equal `evaluate`'s on the re-plan's devices."""
    from hetpart.partitioner.evaluate import evaluate
    from hetpart.partitioner.pipeline_search import Shape, _class_devices, machine_kinds, shape_devices
    from hetpart.partitioner.pipelines import sub_problem
    from hetpart.partitioner.shape_memo import ShapeCodec, seed_candidates

    p, M = small_problem(seed)
    memo = _memo_of(p, M)
    q = _less_one_machine(p) or p
    kinds, _ = machine_kinds(q)
    codec = ShapeCodec(q, kinds, _class_devices, Shape)
    m_of = lambda n: M  # noqa: E731 (the microbatches each was recorded for, here: the same memory)
    cands = seed_candidates(memo, codec, [], lambda s: shape_devices(q, kinds, s), m_of, M, {}, float("inf"))
    for c in cands:
        again = evaluate(sub_problem(q, c.devices, c.m_ref), c.plan.stage_of, list(c.plan.slot_of_stage))
        assert c.plan.stages == again
        assert set(c.plan.slot_of_stage) <= set(c.devices) and {d.name for d in q.devices} >= set(c.devices)


def _stripy_memo():
    """`stripy` (two machines of two devices, whose optimum is two stripes: NOTE [striped pipelines]) and the
    memo its search leaves, carried through JSON as ir/shapes.json carries it."""
    from test_pipeline_stripes import stripy

    p, M = stripy(), 4
    memo = ShapeMemo("")
    plan_pipelines(p, M, time_limit_s=20, memo=memo)
    return p, M, ShapeMemo.from_json(json.loads(json.dumps(memo.to_json())), "memo")


def test_the_memo_keeps_stripes_and_a_search_without_time_for_them_takes_them(monkeypatch):
    """NOTE [shape memo] for stripes: the probe's solved stripe is kept by its machines' kinds and f; a search
    whose probe has no time to solve one (a 2 s re-plan's) still takes it from the memo, and the plan is brute
    force's optimum, valid and costed as `cost_pipelines` says."""
    import time

    from test_pipeline_stripes import no_stripes

    p, M, memo = _stripy_memo()
    assert [json.loads(k)[2] for k in memo.stripes] == [2]  # f = 2 over both machines
    optimum = brute_pipelines(p, M)
    no_stripes(monkeypatch)
    assert plan_pipelines(p, M, time_limit_s=20).iteration_ns == 350  # no stripes solved: the one pipeline
    from hetpart.partitioner import pipeline_stripes

    monkeypatch.setattr(pipeline_search, "stripe_probe", lambda *a, **k: pipeline_stripes.stripe_probe(
        *a[:5], time.perf_counter() - 1.0, **k))  # its end passed: only the memo's stripes are tried
    got = plan_pipelines(p, M, time_limit_s=20, memo=memo)
    assert got.stats["stripes_from_memo"] == 1.0 and got.stats["stripe_taken"] == 1.0
    assert got.iteration_ns == optimum == 302 and not pipelines_violations(p, got, M)
    assert cost_pipelines(p, got.pipelines, solver_status="x").iteration_ns == got.iteration_ns
    assert got.lower_bound_ns <= optimum


def test_a_memo_stripe_maps_onto_a_bigger_cluster_with_evaluates_costs():
    """The stripe's kinds are in a cluster with one more machine of a kind: the seed runs on the first machines of
    each kind, stripe 0's stages cost what `evaluate` says on its devices, and a cluster short of a kind gets none."""
    from hetpart.partitioner import Device, Link
    from hetpart.partitioner.evaluate import evaluate
    from hetpart.partitioner.pipeline_search import Shape, _class_devices, machine_kinds
    from hetpart.partitioner.pipeline_stripes import stripe_devices
    from hetpart.partitioner.pipelines import sub_problem
    from hetpart.partitioner.shape_memo import ShapeCodec, stripe_seeds

    p, M, memo = _stripy_memo()
    q = dataclasses.replace(p, devices=[Device(f"h{i}", "gpu", "m9", 250) for i in range(2)] + list(p.devices),
                            intra_node_links={**p.intra_node_links, "m9": Link(100_000, 0)})
    kinds, _ = machine_kinds(q)
    seeds = stripe_seeds(memo, ShapeCodec(q, kinds, _class_devices, Shape), M)
    assert len(seeds) == 1
    machines, f, plan = seeds[0]
    assert f == 2 and machines == ("m9", "n1")  # the first machine of each kind (m9 sorts before n0)
    group = stripe_devices(q, machines, f)[0]
    assert set(plan.slot_of_stage) <= set(group)
    assert plan.stages == evaluate(sub_problem(q, group, M // f), plan.stage_of, list(plan.slot_of_stage))
    short = dataclasses.replace(p, devices=[d for d in p.devices if d.node == "n0"],
                                intra_node_links={"n0": p.intra_node_links["n0"]})
    kinds, _ = machine_kinds(short)
    assert stripe_seeds(memo, ShapeCodec(short, kinds, _class_devices, Shape), M) == []


def test_a_memo_written_before_stripes_were_kept_is_read():
    memo = ShapeMemo.from_json({"version": 1, "fingerprint": "x", "plans": {}, "no_plan": {}}, "out/ir/shapes.json")
    assert memo.stripes == {} and "stripes" in memo.to_json()


def test_a_memo_written_before_tp_sync_still_matches_its_problem():
    """A problem without a TP sync layout (`Problem.tp_sync` None) keeps the fingerprint it had before that field
    existed, so memos (ir/shapes.json) written then still seed re-plans: the hash below is what hetpart at 9d17809
    computed for this problem (test_replan_pipelines._problem(0), 6 microbatches)."""
    from test_replan_pipelines import _problem

    assert problem_fingerprint(_problem(0), 6) == "a6e95eccad0b26f94a8d13398faf42d5278f75f705b6093d46fed9244b322571"
