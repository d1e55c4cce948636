"""NOTE [idle reasons]: every reason a device of a `--parallel data` plan is idle, one small problem each, and
the GPipe refusal that names 1F1B when 1F1B fits."""

from __future__ import annotations

import re

import networkx as nx
import pytest

from hetpart.errors import HetpartError
from hetpart.partitioner import MEM_BYTES, OUT_BYTES, PIN, PIN_FIRST, PIN_LAST, TIME_NS, WEIGHTS, Device, Link
from hetpart.partitioner.pipeline_search import plan_pipelines, plan_with_baselines
from hetpart.partitioner.pipelines import pipelines_violations
from hetpart.partitioner.problem import Problem, Training
from hetpart.partitioner.solve import SolveOptions


def _chain(out_bytes: int = 0, mem_bytes: int = 0) -> nx.DiGraph:
    """a -> b -> c, 40/60/50 ns, a weight of 100 bytes each (test_copies_of_one_machine's model)."""
    g = nx.path_graph(["a", "b", "c"], create_using=nx.DiGraph)
    nx.set_node_attributes(g, {"a": {"gpu": 40}, "b": {"gpu": 60}, "c": {"gpu": 50}}, TIME_NS)
    nx.set_node_attributes(g, {"a": ("wa",), "b": ("wb",), "c": ("wc",)}, WEIGHTS)
    nx.set_node_attributes(g, {"a": PIN_FIRST, "b": None, "c": PIN_LAST}, PIN)
    nx.set_node_attributes(g, {"a": out_bytes, "b": out_bytes, "c": 0}, OUT_BYTES)
    nx.set_node_attributes(g, dict.fromkeys(g, mem_bytes), MEM_BYTES)
    return g


def _machines(count: int, network: Link, g: nx.DiGraph, extra: list[Device] = ()) -> Problem:
    """`count` machines of two 200-byte GPUs (each pipeline needs both: the weights are 300 bytes), 1F1B."""
    devices = [Device(f"g{i}", "gpu", f"n{i // 2}", 200) for i in range(2 * count)] + list(extra)
    return Problem(graph=g, weights={"wa": 100, "wb": 100, "wc": 100}, devices=devices,
                   intra_node_links={d.node: Link(1000, 0) for d in devices}, network=network,
                   training=Training("1f1b", 1, {}))


def _reasons(plan) -> set[str]:
    return {why.split(":")[0] for why in plan.devices_idle.values()}


def test_memory_microbatches_and_every_idle_device_explained():
    """Four machines, 3 microbatches: one 2-stage 1F1B pipeline takes 2 of them, so no second pipeline fits
    the batch (microbatches); a 50-byte device holds no op with its 100-byte weight (memory)."""
    tiny = Device("t0", "gpu", "n9", 50)
    p = _machines(4, Link(1000, 0), _chain(), [tiny])
    plan = plan_pipelines(p, 3, time_limit_s=10)
    assert not pipelines_violations(p, plan, 3)
    assert len(plan.pipelines) == 1
    used = {d for q in plan.pipelines for s in q.plan.stages for d in s.devices}
    assert set(plan.devices_idle) == {d.name for d in p.devices} - used
    assert plan.devices_idle["t0"].startswith("memory: ")
    assert {why for d, why in plan.devices_idle.items() if d != "t0" and d not in plan.pipelines[0].devices} \
        and all(why.startswith("microbatches: ") for d, why in plan.devices_idle.items()
                if d != "t0" and d not in plan.pipelines[0].devices)
    # With a batch large enough for two pipelines, they are both used and nothing says "microbatches".
    assert "microbatches" not in _reasons(plan_pipelines(p, 8, time_limit_s=10))


def test_link_when_the_sync_costs_more_than_a_pipeline_saves():
    """Two machines, a network of one byte per microsecond: the second machine's pipeline would halve the
    pipelines' time (hundreds of ns), but all-reducing 150 bytes over that network costs 150 us."""
    p = _machines(2, Link(1, 1000), _chain(out_bytes=1000))
    plan = plan_pipelines(p, 4, time_limit_s=10)
    assert not pipelines_violations(p, plan, 4)
    assert len(plan.pipelines) == 1 and len(plan.devices_idle) == 2
    assert _reasons(plan) == {"link"}, plan.devices_idle
    # The same cluster for inference (no gradient sync): both machines run a pipeline.
    inference = Problem(graph=p.graph, weights=p.weights, devices=p.devices, intra_node_links=p.intra_node_links,
                        network=p.network)
    assert not plan_pipelines(inference, 4, time_limit_s=10).devices_idle


def test_gpipe_refusal_names_1f1b_when_it_fits():
    """Activations of 100 bytes per op and microbatch, 250-byte devices, 4 microbatches: GPipe stashes all
    four on every stage (400 bytes), 1F1B's first stage of two keeps two (200): the refusal says so."""
    g = _chain(mem_bytes=100)
    p = Problem(graph=g, weights={"wa": 1, "wb": 1, "wc": 1},
                devices=[Device(f"g{i}", "gpu", "n0", 250) for i in range(3)],
                intra_node_links={"n0": Link(1000, 0)}, network=Link(1000, 0), training=Training("gpipe", 4, {}))
    with pytest.raises(HetpartError, match=r"with --schedule 1f1b .* a plan of \d stages fits: pass --schedule 1f1b") as e:
        plan_with_baselines(p, 4, SolveOptions(time_limit_s=10), baseline_limit_s=5)
    assert "has a plan whose every stage fits" in str(e.value)  # every shape tried: memory, not time
    # When 1F1B does not fit either, the refusal does not suggest it.
    small = Problem(graph=g, weights=p.weights, devices=[Device(f"g{i}", "gpu", "n0", 150) for i in range(3)],
                    intra_node_links=p.intra_node_links, network=p.network, training=p.training)
    with pytest.raises(HetpartError) as refused:
        plan_with_baselines(small, 4, SolveOptions(time_limit_s=10), baseline_limit_s=5)
    assert "1f1b" not in str(refused.value)


def test_the_no_shape_refusal_and_the_baselines_hint_advise_1f1b_once():
    """NOTE [no shape holds the stash] (ux21): 4 devices of 700 B hold one copy of a chain of 4 ops but not GPipe's
    stash of 8 microbatches, so the search has no shape; its refusal advised --schedule 1f1b, and the baselines'
    hint that follows it ("a plan of 2 stages fits") advised it again."""
    g = nx.path_graph(["v0", "v1", "v2", "v3"], create_using=nx.DiGraph)
    nx.set_node_attributes(g, dict.fromkeys(g, {"gpu": 50}), TIME_NS)
    nx.set_node_attributes(g, {v: (f"w{v}",) for v in g}, WEIGHTS)
    nx.set_node_attributes(g, {"v0": PIN_FIRST, "v1": None, "v2": None, "v3": PIN_LAST}, PIN)
    nx.set_node_attributes(g, {"v0": 10, "v1": 10, "v2": 10, "v3": 0}, OUT_BYTES)
    nx.set_node_attributes(g, dict.fromkeys(g, 100), MEM_BYTES)
    p = Problem(graph=g, weights={f"w{v}": 100 for v in g}, devices=[Device(f"d{j}", "gpu", f"m{j}", 700)
                                                                     for j in range(4)],
                intra_node_links={f"m{j}": Link(100, 1) for j in range(4)}, network=Link(10, 10),
                training=Training("gpipe", 8, {f"w{v}": 50 for v in g}))
    with pytest.raises(HetpartError) as refused:
        plan_with_baselines(p, 8, SolveOptions(time_limit_s=5), baseline_limit_s=2)
    said = str(refused.value)
    assert said.count("pass --schedule 1f1b") == 1, said
    assert re.search(r"a plan of \d stages fits: pass --schedule 1f1b$", said), said  # the hint: a plan was solved
    assert "no plan fits whatever the --time-limit; pass a smaller --batch-size" in said  # the refusal's own words
    with pytest.raises(HetpartError) as alone:  # the control: the search's refusal alone still advises it
        plan_pipelines(p, 8, time_limit_s=5)
    assert str(alone.value).count("pass --schedule 1f1b") == 1 and "none of the baselines" not in str(alone.value)


def test_a_batch_no_mix_of_shapes_can_run_is_refused_for_memory():
    """NOTE [outer program]: two machines, one shape of one machine whose plan holds the stash of at most 2
    microbatches: 4 fit, 5 are proven impossible (not 'raise --time-limit')."""
    from hetpart.partitioner.pipeline_outer import Candidate, solve_outer
    from hetpart.partitioner.pipeline_search import MachineKind, Shape

    kinds = [MachineKind("k0", (("gpu", 200),), (2,), ("n0", "n1"))]
    shape = Candidate(Shape(machines=(1,)), ("g0", "g1"), None, 2, 1, 2, 300, 100, [0, 0, 10, 10])
    got = solve_outer(kinds, [shape], 4, 2, 5.0)
    assert got is not None and got.copies == [2] and got.microbatches == [4]
    with pytest.raises(HetpartError, match="no mix of the 1 solved pipeline shapes runs the 5 microbatches"):
        solve_outer(kinds, [shape], 5, 2, 5.0)


def test_outer_horizon_admits_a_candidate_at_its_most_microbatches():
    """NOTE [outer horizon]: one machine, one shape whose plan runs all 8 microbatches (GPipe: hi = 8), times in units
    of 10 ns where the step's rounding per term (up(sum - b) + 8 up(b) = 0 + 16 units) exceeds the step rounded once
    (up(11 + 7 * 11) = 9 units). The batch runs on that one pipeline; before, the model was INFEASIBLE and the batch
    refused for memory. Negative control: 9 microbatches, more than its plan holds, are still refused."""
    from hetpart.partitioner.pipeline_outer import Candidate, solve_outer
    from hetpart.partitioner.pipeline_search import MachineKind, Shape

    kinds = [MachineKind("k0", (("gpu", 200),), (2,), ("n0",))]
    shape = Candidate(Shape(machines=(1,)), ("g0", "g1"), None, 8, 1, 8, 11, 11, [0, 0])
    got = solve_outer(kinds, [shape], 8, 1, 5.0, unit_ns=10)
    assert got is not None and got.copies == [1] and got.microbatches == [8]
    assert got.step_units * got.unit_ns >= 11 + 7 * 11  # the model never underestimates the step
    with pytest.raises(HetpartError, match="no mix of the 1 solved pipeline shapes runs the 9 microbatches"):
        solve_outer(kinds, [shape], 9, 1, 5.0, unit_ns=10)


def test_reason_numbers_are_those_of_an_independent_evaluation(monkeypatch):
    """NOTE [idle reasons] with NOTE [join probe]: the slow machine of `joinable(2000)` cannot help (the mixes
    hidden, as in test_pipeline_search). Its reason quotes the fastest pipeline with it at its fewest microbatch
    (only the slow machine: 3,000 ns, by brute force over the plans of its two devices), the plan's step (650 ns),
    and what joining it to pipeline 0 gives (brute force over that grouping's plans and splits: 650 ns, +0.0%:
    nothing, its plan leaving the machine out)."""
    import re

    from hetpart.partitioner.certificate import valid_plans
    from hetpart.partitioner.pipelines import sub_problem
    from tests.partitioner.test_pipeline_search import JOINS, brute_groups, joinable, one_kind_shapes_only

    one_kind_shapes_only(monkeypatch)
    p, M = joinable(2000), 12
    plan = plan_pipelines(p, M, time_limit_s=20)
    assert set(plan.devices_idle) == {"s0", "s1"} and plan.devices_idle["s0"] == plan.devices_idle["s1"]
    why = plan.devices_idle["s0"]
    alone = min(sum(s.time_ns for s in stages) for _, _, stages in valid_plans(sub_problem(p, ("s0", "s1"), 1)))
    joined = brute_groups(p, JOINS[0], M)
    number = r"([\d,.]+ [nu]s)"

    def ns(text: str) -> float:
        value, unit = text.split()
        return float(value.replace(",", "")) * {"ns": 1, "us": 1000}[unit]

    assert why.startswith("too slow to help: ")
    assert ns(re.search("takes at least " + number, why).group(1)) == alone == 3000
    assert ns(re.search("plan's whole " + number, why).group(1)) == plan.iteration_ns == 650
    assert ns(re.search(r"only slow machines \(2 devices\) takes " + number, why).group(1)) == alone
    got = re.search(r"adding one slow machine to pipeline 0 adds nothing: the joined devices' plan leaves it out \("
                    + number + r", ([+-][\d.]+)%\)", why)
    assert ns(got.group(1)) == joined == 650 and float(got.group(2)) == 100 * (joined - 650) / 650


def test_memory_reason_says_how_many_devices_the_model_needs():
    """A device kind whose machines alone cannot hold the model: its reason counts the devices it would take
    (`need_bytes` over its capacity) and how many the cluster has."""
    from hetpart.partitioner.pipeline_bounds import need_bytes

    small = [Device(f"s{i}", "slow", "n9", 120) for i in range(2)]  # 240 bytes, the model needs 300
    g = _chain()
    nx.set_node_attributes(g, {"a": {"gpu": 40, "slow": 4000}, "b": {"gpu": 60, "slow": 6000},
                               "c": {"gpu": 50, "slow": 5000}}, TIME_NS)
    p = _machines(2, Link(1000, 0), g, small)
    plan = plan_pipelines(p, 4, time_limit_s=10)
    assert not pipelines_violations(p, plan, 4)
    why = plan.devices_idle["s0"]
    need = need_bytes(p)
    assert f"need at least {-(-need // 120)} devices of its 120 B, the cluster has 2" in why, why


def test_a_device_left_out_at_1f1b_s_stage_limit_says_so_not_too_slow():
    """A pipeline at 1F1B's limit (as many stages as microbatches) leaves devices out for that limit, which more
    microbatches or GPipe lift; an OPTIMAL plan under no limit is "too slow to help"; a FEASIBLE one says unproven."""
    import dataclasses

    from hetpart.partitioner.pipelines import Pipeline, cost_pipelines, left_out_reason, sub_problem
    from hetpart.partitioner.problem import Training
    from hetpart.partitioner.solve import solve

    g = nx.path_graph(["a", "b", "c", "d"], create_using=nx.DiGraph)
    for v in g.nodes:
        g.nodes[v].update({TIME_NS: {"cpu": 100}, MEM_BYTES: 1, OUT_BYTES: 1, WEIGHTS: ()})
    devices = [Device(f"m/{k}", "cpu", "m", 10**6) for k in range(4)]
    base = Problem(graph=g, weights={}, devices=devices, intra_node_links={"m": Link(10**6, 0)},
                   network=Link(10**6, 0))
    p = dataclasses.replace(base, training=Training("1f1b", 2, {}))
    names = tuple(d.name for d in devices)
    plan = solve(sub_problem(p, names, 2), time_limit_s=10)
    assert len(plan.stages) == 2  # 1F1B with 2 microbatches: at most 2 stages of the 4 devices
    pipe = Pipeline(0, names, 2, plan, 0)
    idle = cost_pipelines(p, [pipe], solver_status="OPTIMAL").devices_idle
    assert len(idle) == 2 and all(r.startswith("stage limit:") and "--schedule gpipe" in r for r in idle.values())
    gp = dataclasses.replace(base, training=Training("gpipe", 2, {}), max_stages=2)
    plan = solve(sub_problem(gp, names, 2), time_limit_s=10)
    assert left_out_reason(gp, Pipeline(0, names, 2, plan, 0)).startswith("stage limit:") and "--max-stages" in \
        left_out_reason(gp, Pipeline(0, names, 2, plan, 0))
    one = base  # inference: no stage limit
    solved = solve(one, time_limit_s=10)
    plan = dataclasses.replace(solved, stages=solved.stages[:1], solver_status="OPTIMAL")
    assert left_out_reason(one, Pipeline(0, names, 1, plan, 0)).startswith("too slow to help:")
    plan = dataclasses.replace(plan, solver_status="FEASIBLE")
    assert "not proven optimal" in left_out_reason(one, Pipeline(0, names, 1, plan, 0))


def test_two_machine_kinds_of_one_device_type_are_named_apart_in_the_reasons():
    """Kinds differ by capacity, count or link; the reasons' numbers are per kind, so two kinds of the same device
    type must not print under one name (seed 15: one 'fast' kind cannot hold the model, the other runs it alone)."""
    from test_pipeline_search import small_problem

    from hetpart.partitioner.pipeline_search import _plan_and_facts

    clashes = 0
    for seed in (1, 15):
        p, M = small_problem(seed)
        plan, facts = _plan_and_facts(p, M, time_limit_s=3)
        assert len(set(facts.kind_names)) == len(facts.kind_names), facts.kind_names
        clashes += any("(kind of " in n for n in facts.kind_names)
        for d, reason in plan.devices_idle.items():
            own = facts.kind_names[facts.kind_of_machine[p.device(d).node]]
            named = [n for n in facts.kind_names if f" {n} machine" in reason]  # "a K machine", "only K machines"
            assert named in ([], [own]), (d, reason)
    assert clashes == 2



def test_a_baselines_plan_taken_without_search_facts_says_so():
    """The 405B x hetero-256 row printed 'in no pipeline' for 56 devices when the search found no plan and a
    baseline's was taken: the reason now says where the plan came from and why nothing more is known."""
    from hetpart.partitioner.pipeline_baselines import pipeline_baselines
    from hetpart.partitioner.pipeline_idle import idle_reasons

    p = _machines(4, Link(1000, 0), _chain())
    p = Problem(graph=p.graph, weights=p.weights, devices=[Device(d.name, d.type, d.node, 400) for d in p.devices],
                intra_node_links=p.intra_node_links, network=p.network, training=p.training)  # one GPU holds all
    got = next(b.plan for b in pipeline_baselines(p, 2, time_limit_s=10, single=False) if b.plan is not None)
    idle = idle_reasons(p, got, 2, None)
    outside = {d.name for d in p.devices} - {d for q in got.pipelines for d in q.devices}
    assert outside and set(idle) >= outside
    assert all("the search found no plan of its own" in idle[d] for d in outside), idle


def _one_kind_facts(p: Problem, fewest_ns: int, bottleneck_ns: int):
    """NOTE [idle reasons]'s facts as a search that solved one two-device shape of the one machine kind would
    leave them: its plan runs a stage on the kind, `fewest_ns` for its fewest microbatch, `bottleneck_ns`."""
    from hetpart.partitioner.pipeline_idle import ShapeFacts

    facts = ShapeFacts(kind_of_machine={d.node: 0 for d in p.devices}, in_shape={0}, tried={0}, solved={0},
                       best={0: (1, bottleneck_ns, 2, fewest_ns)}, kind_names=["gpu"], tried_count={0: 1})
    facts.runs_count, facts.planned_count = {0: 1}, {0: 1}  # (set apart: the tests also run on the code before)
    return facts


def test_an_idle_device_a_faster_plan_uses_is_not_called_too_slow_to_help():
    """idle19: when a pipeline with the idle kind runs its fewest microbatches within the plan's step, there are
    microbatches for it and no sync forbids it, only the search's reach left it idle; llama-70b on hetero-256
    read "too slow to help" for 192 A100s that a plan 13.7% faster (same cost model) runs. Here one pipeline on
    machine n0 runs the 8 microbatches; two pipelines (n0 and n1) run them faster, so n1's devices help."""
    from hetpart.partitioner.pipeline_idle import idle_reasons
    from hetpart.partitioner.pipelines import fixed_pipelines

    t = _machines(2, Link(1000, 0), _chain())
    p = Problem(graph=t.graph, weights=t.weights, devices=t.devices, intra_node_links=t.intra_node_links,
                network=t.network)  # inference: no sync
    chosen = fixed_pipelines(p, [["g0", "g1"]], [8])
    faster = fixed_pipelines(p, [["g0", "g1"], ["g2", "g3"]], [4, 4])
    assert not pipelines_violations(p, faster, 8) and faster.iteration_ns < chosen.iteration_ns
    alone = fixed_pipelines(p, [["g2", "g3"]], [1])
    facts = _one_kind_facts(p, alone.iteration_ns, alone.pipelines[0].plan.bottleneck_ns)
    why = idle_reasons(p, chosen, 8, facts)
    assert set(why) == {"g2", "g3"}
    assert all(not w.startswith("too slow to help") for w in why.values()), why
    assert why["g2"].startswith("not shown to help: no plan the search found with it has a lower step")
    assert "a plan using it may be faster" in why["g2"]


def test_too_slow_to_help_claims_only_the_shapes_the_search_solved():
    """idle19: "every pipeline with a a100-80g machine takes at least 9,156 ms for its fewest microbatches" was read
    from 3 solved shapes (llama-70b on hetero-1024) while other pipelines with one take less. Here the search's one
    solved shape with the kind (as `facts` say) is slower than the step, but the pipeline on n1 is not: the reason
    says it speaks of the shapes the search solved, and how many."""
    from hetpart.partitioner.pipeline_idle import idle_reasons
    from hetpart.partitioner.pipelines import fixed_pipelines

    t = _machines(2, Link(1000, 0), _chain())
    p = Problem(graph=t.graph, weights=t.weights, devices=t.devices, intra_node_links=t.intra_node_links,
                network=t.network)
    chosen = fixed_pipelines(p, [["g0", "g1"]], [8])
    alone = fixed_pipelines(p, [["g2", "g3"]], [1])
    assert alone.iteration_ns < chosen.iteration_ns  # a pipeline with the kind under the step at its fewest
    facts = _one_kind_facts(p, 10 * chosen.iteration_ns, chosen.iteration_ns)
    why = idle_reasons(p, chosen, 8, facts)["g2"]
    assert why.startswith("not shown to help: every pipeline shape the search solved whose plan runs a stage on a gpu "
                          "machine (1 shape(s)) takes at least "), why
    # NOTE [device join] gave one to the slowest pipeline and its planner ran no stage on it: too slow to help.
    from hetpart.partitioner.pipeline_device_join import DeviceTry

    facts.device_tries = {("gpu", 200): DeviceTry(1, chosen.iteration_ns, None, None, (("g0", "g1"),))}
    why = idle_reasons(p, chosen, 8, facts)["g2"]
    assert why.startswith("too slow to help: every pipeline shape the search solved whose plan runs a stage on a gpu "
                          "machine (1 shape(s)) takes at least "), why
    assert why.endswith("; 1 gpu device(s) more in the slowest pipeline, planned again, runs no stage on them"), why


def test_a_kind_whose_solved_shapes_leave_it_out_is_not_called_too_slow_to_help():
    """idle19: llama-70b on hetero-64 read "too slow to help: every plan of a pipeline shape with a l4-24g machine
    leaves its devices out (a stage on one would make that pipeline slower)", while its pipeline planned again with
    one L4 added is 0.9% faster. Here the solved shapes with the kind (as `facts` say) leave it out, and one more
    device as a third stage takes the 8 microbatches' bottleneck from 110 to 60 ns."""
    from hetpart.partitioner.pipeline_idle import ShapeFacts, idle_reasons
    from hetpart.partitioner.pipelines import fixed_pipelines

    g = _chain()  # a -> b -> c -> out, the output pinned last (a stage of it alone holds nothing)
    g.add_edge("c", "out")
    nx.set_node_attributes(g, {"c": None, "out": PIN_LAST}, PIN)
    nx.set_node_attributes(g, {"out": {"gpu": 0}}, TIME_NS)
    nx.set_node_attributes(g, {"out": (), "c": ("wc",)}, WEIGHTS)
    nx.set_node_attributes(g, {"out": 0}, OUT_BYTES)
    nx.set_node_attributes(g, {"out": 0}, MEM_BYTES)
    t = _machines(2, Link(1000, 0), g)
    p = Problem(graph=t.graph, weights=t.weights, devices=t.devices, intra_node_links=t.intra_node_links,
                network=t.network)
    chosen = fixed_pipelines(p, [["g0", "g1"]], [8])
    joined = fixed_pipelines(p, [["g0", "g1", "g2"]], [8])
    assert "g2" in joined.used_devices and joined.iteration_ns < chosen.iteration_ns
    facts = ShapeFacts(kind_of_machine={d.node: 0 for d in p.devices}, in_shape={0}, tried={0}, solved={0},
                       kind_names=["gpu"], tried_count={0: 1})
    facts.planned_count = {0: 1}
    why = idle_reasons(p, chosen, 8, facts)["g2"]
    assert why.startswith("not shown to help: every plan of the 1 pipeline shape(s) with a gpu machine that the "
                          "search solved leaves its devices out"), why
    # The plan runs stages on two devices of g2's kind (as NOTE [device join] leaves llama-70b on hetero-64: one L4
    # taken, 15 idle): "a stage on fewer of its devices was not tried" would be false (lead, twenty-fourth stop).
    assert "the plan runs stages on 2 of its kind's devices" in why and "was not tried" not in why, why
    other = ShapeFacts(kind_of_machine={"n0": 0, "n1": 1}, in_shape={0, 1}, tried={0, 1}, solved={0, 1},
                       kind_names=["gpu", "gpu-b"], tried_count={0: 1, 1: 1})
    other.planned_count = {0: 1, 1: 1}
    why = idle_reasons(p, chosen, 8, other)["g2"]
    assert "a stage on fewer of its devices was not tried: a plan using one may be faster" in why, why


def test_a_device_join_whose_planner_found_no_plan_shows_nothing():
    """NOTE [device join] (rev26): when the planner given the slowest pipeline's devices plus an idle one returns no
    plan (its time ran out), the try shows nothing: the reason read "too slow to help: ...; 1 gpu device(s) more in
    the slowest pipeline, planned again, runs no stage on them", of a plan that was never found."""
    import time

    from hetpart.partitioner.pipeline_device_join import device_join
    from hetpart.partitioner.pipeline_idle import idle_reasons
    from hetpart.partitioner.pipelines import fixed_pipelines

    t = _machines(2, Link(1000, 0), _chain())
    p = Problem(graph=t.graph, weights=t.weights, devices=t.devices, intra_node_links=t.intra_node_links,
                network=t.network)
    chosen = fixed_pipelines(p, [["g0", "g1"]], [8])
    facts = _one_kind_facts(p, 10 * chosen.iteration_ns, chosen.iteration_ns)
    best, stats, facts.device_tries = device_join(p, chosen, 8, lambda devs, m, s: None, lambda n: 1.0,
                                                  lambda n: 0.0, time.perf_counter() + 60)
    assert best is chosen and stats["device_join_tries"] == 2
    why = idle_reasons(p, chosen, 8, facts)["g2"]
    assert why.startswith("not shown to help: every pipeline shape the search solved"), why
    assert "runs no stage" not in why and "planned again" not in why, why
