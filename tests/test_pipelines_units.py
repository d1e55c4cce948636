"""Data-parallel pipelines (issue 19) without torchrun: arguments, the batch split, the mesh, plan.json, the sync.

The end-to-end run is tests/runtime/test_pipelines_run.py.
"""

from __future__ import annotations

import copy
import itertools
import json
import random
from pathlib import Path

import pytest

from hetpart.cli import main
from hetpart.codegen.artifacts import mesh
from hetpart.errors import HetpartError
from hetpart.pipeline_groups import check_pipeline_options, parse_pipeline_microbatches, parse_pipelines, split_by_time
from hetpart.plan_report import PipelineReport, PlanReport, StageReport, as_json, load_plan
from hetpart.runtime.artifacts import _check_mesh, mesh_pipelines, rank_pipeline

DEVICES = [f"local/{i}" for i in range(6)]
PATH = Path("art/manifest.json")


# --pipelines and --pipeline-microbatches

def test_pipelines_parse_into_device_groups():
    assert parse_pipelines(" local/0, local/1 ;local/2,local/3,local/4", DEVICES) == (
        ("local/0", "local/1"), ("local/2", "local/3", "local/4"))


@pytest.mark.parametrize(("text", "message"), [
    ("local/0,local/1;local/7", "unknown device 'local/7' in pipeline 1 (the cluster's devices: local/0, local/1"),
    ("local/0,lcal/1", "did you mean local/1"),
    ("local/0,local/1;local/1,local/2", "device 'local/1' is in pipelines 0 and 1"),
    ("local/0,local/0", "device 'local/0' is in pipeline 0;"),
    ("local/0;;local/1", "pipeline 1 has an empty device name"),
    ("local/0,", "pipeline 0 has an empty device name"),
])
def test_bad_pipelines_are_refused(text, message):
    with pytest.raises(HetpartError) as err:
        parse_pipelines(text, DEVICES)
    assert message in str(err.value)


@pytest.mark.parametrize("text", ["4,0", "4,x", "4,,2", "-1", "2.5"])
def test_bad_pipeline_microbatches_are_refused(text):
    with pytest.raises(HetpartError, match="is not a count >= 1"):
        parse_pipeline_microbatches(text)


@pytest.mark.parametrize(("groups", "counts", "microbatches", "parallel", "message"), [
    ((("a",), ("b",)), (3, 2), 6, "pipeline", "adds up to 5, but --microbatches is 6"),
    ((("a",), ("b",)), (6,), 6, "pipeline", "gives 1 count(s) for 2 pipeline(s)"),
    (None, (3, 3), 6, "pipeline", "pass --pipelines too"),
    ((("a",), ("b",), ("c",)), None, 2, "pipeline", "gives 3 pipelines but --microbatches is 2"),
    ((("a",), ("b",)), None, 6, "data", "pass one of the two"),
    (None, None, 6, "tensor", "--parallel tensor: expected pipeline or data"),
])
def test_pipeline_options_must_fit_together(groups, counts, microbatches, parallel, message):
    with pytest.raises(HetpartError) as err:
        check_pipeline_options(groups, counts, microbatches, parallel)
    assert message in str(err.value)


def test_parallel_data_searches_the_pipelines_and_writes_their_step_bound_and_gap(tmp_path):
    """`--parallel data`: plan_pipelines' answer, even of one pipeline, is written in the pipelines' form with the
    search's bound (NOTE [pipelines bound]) below its step, and passes the independent check."""
    from hetpart.compile import CompileOptions, compile_model
    from hetpart.frontend import ModelSpec
    from hetpart.partitioner.pipelines import pipelines_violations

    check_pipeline_options(None, None, 6, "data")  # the search is there: nothing to refuse
    out = tmp_path / "out"
    opts = CompileOptions(microbatches=8, pt2=False, mode="training", time_limit_s=4, parallel="data")
    result = compile_model(ModelSpec("zoo:mlp", {"hidden": "64", "n_blocks": "4"}, 16, 16, 0), "preset:cpu-6", out,
                           opts, echo=lambda _: None)
    assert pipelines_violations(result.problem, result.pipelines, 8) == []
    plan = json.loads((out / "plan.json").read_text())
    assert len(plan["pipelines"]) == len(result.pipelines.pipelines) >= 1
    assert 0 < plan["lower_bound_us"] <= plan["iteration_us"]
    assert plan["gap"] == pytest.approx(1 - plan["lower_bound_us"] / plan["iteration_us"], abs=1e-5)
    assert sum(q["microbatches"] for q in plan["pipelines"]) == 8
    # The baselines beside it, in the same cost model, none faster (NOTE [baselines as candidates]).
    assert {b["name"] for b in plan["baselines"]} == {"megatron", "metis", "one-pipeline"}
    assert all(b["iteration_us"] is None or b["iteration_us"] >= plan["iteration_us"] for b in plan["baselines"])


# The batch split: NOTE [batch split]

def test_the_batch_split_feeds_every_pipeline_and_refuses_too_few_microbatches():
    assert split_by_time(3, [lambda m: m, lambda m: 1000 * m, lambda m: 1000 * m]) == [1, 1, 1]
    assert split_by_time(4, [lambda m: m] * 3) == [2, 1, 1]  # a tie goes to the earlier pipeline
    # a 3-stage pipeline of fast devices against a 1-stage one: by speed alone (1/b) it took 3 of 4
    assert split_by_time(4, [lambda m: 100 * (m + 2), lambda m: 220 * m]) == [2, 2]  # 400, 440 (3/1: 500)
    with pytest.raises(HetpartError, match="cannot feed 3 pipeline"):
        split_by_time(2, [lambda m: m] * 3)


def test_the_split_minimises_the_slowest_pipeline_by_brute_force():
    rng = random.Random(19)
    for _ in range(400):
        n = rng.randint(1, 4)
        total = rng.randint(n, 10)
        # a pipeline of S stages, bottleneck b, fill f: nondecreasing in m, as the simulator's times are
        shapes = [(rng.randint(1, 5), rng.choice([rng.randint(1, 5), rng.randint(1, 500)]), rng.randint(0, 300))
                  for _ in range(n)]
        times = [lambda m, s=s, b=b, f=f: (m + s - 1) * b + f for s, b, f in shapes]
        got = split_by_time(total, times)
        slowest = lambda shares: max(t(m) for t, m in zip(times, shares))  # noqa: E731
        best = min(slowest(c) for c in itertools.product(range(1, total + 1), repeat=n) if sum(c) == total)
        assert sum(got) == total and min(got) >= 1
        assert slowest(got) == best, (total, shapes, got)


def test_a_long_fast_pipeline_and_a_short_slow_one_get_the_split_that_finishes_first(tmp_path):
    """NOTE [batch split]: 2 stages on the A100s (+ a T4) against one T4, 4 microbatches. In proportion to speed the
    long pipeline took 3 (its equal-share plan then runs them in 722 us against the T4's 358 us: 899 us a step with
    the sync); by the equal-share plans' simulated times 2/2 finishes first (542 and 717 us: 894 us)."""
    gpt = ["zoo:gpt-small", "--set", "n_layer=4", "--set", "n_embd=32", "--set", "n_head=2", "--set", "vocab_size=64",
           "--set", "block_size=16", "--seq-len", "8", "--no-pt2", "--time-limit", "3", "--mode", "training",
           "--cluster", "preset:mixed-4", "--pipelines", "a/0,a/1,b/0;b/1", "--microbatches", "4",
           "--batch-size", "8", "--out", str(tmp_path / "out")]
    assert main(["partition", *gpt]) == 0
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert [q["microbatches"] for q in plan["pipelines"]] == [2, 2]


# The mesh of several pipelines (NOTE [the mesh])

def _ranks(pipelines: list[tuple[int, int, int]]) -> list[dict]:
    """Rank entries of pipelines given as (stages, microbatches, microbatch size)."""
    out, offset = [], 0
    for p, (stages, m, size) in enumerate(pipelines):
        for k in range(stages):
            out.append({"rank": len(out), "stage": k, "pipeline": p, "microbatches": m,
                        "batch_rows": [offset * size, (offset + m) * size]})
        offset += m
    return out


def _manifest(m: dict, ranks: list[dict]) -> dict:
    return {"mesh": m, "ranks": ranks}


def test_two_pipelines_number_ranks_pipeline_major_and_share_weight_groups_across_them():
    # pipeline 0: ranks 0-1 (wte tied into its last stage); pipeline 1: ranks 2-4
    weights = [["wte", "h0"], ["h1", "wte"], ["wte"], ["h0"], ["h1", "wte"]]
    m = mesh(weights, [4, 2], [2, 3])
    assert "stages" not in m
    assert m["pipelines"] == [
        {"index": 0, "group": "pipeline-0", "stages": [[0], [1]], "microbatches": 4, "microbatch_offset": 0},
        {"index": 1, "group": "pipeline-1", "stages": [[2], [3], [4]], "microbatches": 2, "microbatch_offset": 4}]
    pipeline_groups = [g for g in m["groups"] if g["kind"] == "pipeline"]
    assert pipeline_groups == [{"name": "pipeline-0", "kind": "pipeline", "ranks": [0, 1]},
                               {"name": "pipeline-1", "kind": "pipeline", "ranks": [2, 3, 4]}]
    # every rank holding a weight, within and across pipelines, read back from `weights` independently
    held = {w: sorted(r for r, names in enumerate(weights) if w in names) for w in ("wte", "h0", "h1")}
    groups = {tuple(g["ranks"]): g["weights"] for g in m["groups"] if g["kind"] == "weights"}
    assert groups == {tuple(held["wte"]): ["wte"], tuple(held["h0"]): ["h0"], tuple(held["h1"]): ["h1"]}
    ranks = _ranks([(2, 4, 2), (3, 2, 2)])
    _check_mesh(PATH, m, ranks)
    got = mesh_pipelines(_manifest(m, ranks))
    assert [(q.group, q.microbatches, q.microbatch_offset) for q in got] == [("pipeline-0", 4, 0), ("pipeline-1", 2, 4)]
    assert rank_pipeline(_manifest(m, ranks), 3).index == 1


def test_one_pipeline_keeps_todays_mesh():
    weights = [["wte"], ["h"], ["wte"]]
    assert mesh(weights) == {
        "stages": [[0], [1], [2]],
        "groups": [{"name": "pipeline", "kind": "pipeline", "ranks": [0, 1, 2]},
                   {"name": "weights-0", "kind": "weights", "ranks": [0, 2], "weights": ["wte"]}],
        "rank_groups": [["pipeline", "weights-0"], ["pipeline"], ["pipeline", "weights-0"]]}
    ranks = [{"rank": k, "stage": k} for k in range(3)]
    assert [(q.group, q.stages, q.microbatches) for q in mesh_pipelines(_manifest(mesh(weights), ranks))] == [
        ("pipeline", [[0], [1], [2]], None)]


def _set(path: str, value):
    def how(m: dict, ranks: list[dict]) -> None:
        *head, last = path.split(".")
        target = {"mesh": m, "ranks": ranks}
        for key in head:
            target = target[int(key)] if isinstance(target, list) else target[key]
        if isinstance(target, list):
            target[int(last)] = value
        else:
            target[last] = value
    return how


@pytest.mark.parametrize(("how", "message"), [
    (_set("mesh.pipelines.1.microbatch_offset", 3), "mesh.pipelines[1] must be pipeline 1"),
    (_set("mesh.pipelines.0.microbatches", 0), "mesh.pipelines[0] must be pipeline 0"),
    (_set("mesh.pipelines.1.stages", [[2], [4], [3]]), "ranks[3] runs stage 1, which mesh.stages does not give"),
    (_set("mesh.groups.1.ranks", [2, 3]), "one pipeline group per pipeline"),
    (_set("ranks.3.pipeline", 0), "ranks[3] must carry its pipeline's microbatches (4)"),
    (_set("ranks.4.pipeline", 2), "ranks[4] needs its 'pipeline'"),
    (_set("ranks.2.microbatches", 4), "ranks[2] must carry its pipeline's microbatches (2)"),
    (_set("ranks.2.batch_rows", [0, 4]), "batch_rows [start, stop) of whole microbatches at its offset 4"),
    (_set("ranks.0.batch_rows", [0, 4]), "microbatches of different sizes"),  # 4 microbatches of 1 row, the rest 2
])
def test_an_edited_mesh_of_pipelines_is_refused(how, message):
    m, ranks = mesh([["w"], ["w"], ["w"], [], ["w"]], [4, 2], [2, 3]), _ranks([(2, 4, 2), (3, 2, 2)])
    m, ranks = copy.deepcopy(m), copy.deepcopy(ranks)
    how(m, ranks)
    with pytest.raises(HetpartError, match="the manifest was edited or truncated") as err:
        _check_mesh(PATH, m, ranks)
    assert message in str(err.value)


def test_pipelines_must_run_microbatches_of_one_size():
    m = mesh([["w"], ["w"]], [2, 2], [1, 1])
    with pytest.raises(HetpartError, match="microbatches of different sizes"):
        _check_mesh(PATH, m, [{"rank": 0, "stage": 0, "pipeline": 0, "microbatches": 2, "batch_rows": [0, 4]},
                              {"rank": 1, "stage": 0, "pipeline": 1, "microbatches": 2, "batch_rows": [2, 4]}])


def test_run_refuses_a_schedule_or_batch_split_the_pipelines_cannot_run():
    from hetpart.runtime.launch import RunOptions, _check_options

    ranks = _ranks([(2, 4, 2), (3, 2, 2)])
    man = {"mesh": mesh([[]] * 5, [4, 2], [2, 3]), "ranks": ranks, "world_size": 5}
    _check_options(RunOptions(schedule="gpipe"), 12, 5, 6, man)
    _check_options(RunOptions(schedule="1f1b"), 12, 5, 6, {"mesh": mesh([[]] * 5, [3, 3], [2, 3]), "world_size": 5,
                                                           "ranks": _ranks([(2, 3, 2), (3, 3, 2)])})
    with pytest.raises(HetpartError, match="pipeline 1 has 3 stages and 2 microbatch"):
        _check_options(RunOptions(schedule="1f1b"), 12, 5, 6, man)
    with pytest.raises(HetpartError, match=r"split the batch into 6 microbatches \(4 \+ 2\)"):
        _check_options(RunOptions(), 12, 5, 3, man)


# plan.json's pipelines (NOTE [plan.json fields])

def _stage(k: int, device: str, pipeline: int | None = None) -> StageReport:
    return StageReport(index=k, device=device, device_type="cpu", node_count=3, flops=1.0, predicted_time_us=10.0,
                       compute_us=8.0, comm_in_us=1.0, comm_out_us=1.0, memory_bytes=10, capacity_bytes=100,
                       pipeline=pipeline)


def _plan(**fields) -> dict:
    stages = [[_stage(0, "local/0", 0), _stage(1, "local/1", 0)], [_stage(0, "local/2", 1)]]
    pipelines = [PipelineReport(index=p, microbatches=m, devices=[s.device for s in st], time_us=50.0,
                                bottleneck_us=10.0, lower_bound_us=40.0, solver_status="OPTIMAL", stages=st)
                 for p, (m, st) in enumerate(zip([4, 2], stages))]
    base = {"model": {"model": "zoo:mlp", "overrides": {}, "batch_size": 12, "seq_len": 8, "seed": 0},
            "cluster": {"name": "cpu-6", "devices": []}, "microbatches": 6, "microbatch_size": 2,
            "bottleneck_us": 10.0, "lower_bound_us": 40.0, "gap": 0.2, "solver_status": "FIXED",
            "stages": [as_json(s) for st in stages for s in st], "pipelines": [as_json(q) for q in pipelines],
            "iteration_us": 60.0, "grad_sync_us": 10.0, "grad_sync_overlapped_us": 5.0,
            "devices_used": ["local/0", "local/1", "local/2"], "devices_idle": {"local/3": "in no pipeline"}}
    base.update(fields)
    return base


def test_a_plan_of_pipelines_reads_back_typed():
    plan = load_plan(Path("plan.json"), json.loads(json.dumps(_plan())))
    assert [(q.index, q.microbatches, [s.device for s in q.stages]) for q in plan.pipelines] == [
        (0, 4, ["local/0", "local/1"]), (1, 2, ["local/2"])]
    assert [s.pipeline for s in plan.stages] == [0, 0, 1]
    assert plan.devices_idle == {"local/3": "in no pipeline"}
    assert as_json(plan) == _plan() | {"format_version": 1, "hetpart_version": ""} | {
        k: as_json(plan)[k] for k in as_json(plan) if k not in _plan()}


def test_a_plan_of_one_pipeline_writes_none_of_the_new_fields():
    one = PlanReport(**{**load_plan(Path("plan.json"), _plan()).__dict__, "pipelines": None, "iteration_us": None,
                        "grad_sync_us": None, "grad_sync_overlapped_us": None, "devices_used": None,
                        "devices_idle": None, "stages": [_stage(0, "local/0")]})
    written = as_json(one)
    assert not {"pipelines", "iteration_us", "grad_sync_us", "grad_sync_overlapped_us", "devices_used",
                "devices_idle", "search_stats"} & set(written)
    assert "pipeline" not in written["stages"][0]


def test_idle_devices_of_one_reason_are_one_line_and_search_stats_read_back():
    """The CLI prints one line per idle reason (a kind's 16 L4s share one), and plan.json's search_stats
    (NOTE [join probe]'s tries among them) read back as written."""
    from hetpart.report.table import idle_lines, pipelines_lines

    why = "too slow to help: adding one l4-24g machine to pipeline 0 gives 760 ms (+1.7%)"
    idle = {f"l-0/{i}": why for i in range(8)} | {"c/0": "memory: 1 GiB holds no op", "c/1": "in no pipeline"}
    assert idle_lines(idle) == [f"idle: l-0/0 ... l-0/7 (8 devices): {why}", "idle: c/0: memory: 1 GiB holds no op",
                                "idle: c/1: in no pipeline"]
    stats = {"join_tries": 2.0, "join_seconds": 0.5}
    plan = load_plan(Path("plan.json"), json.loads(json.dumps(_plan(devices_idle=idle, search_stats=stats))))
    assert plan.search_stats == stats
    assert [ln for ln in pipelines_lines(plan) if ln.startswith("idle: ")] == idle_lines(idle)


def test_a_pipeline_s_own_bound_is_its_time_on_one_device_its_solve_s_or_none():
    """NOTE [a pipeline's own bound] (ux21: a 1-stage pipeline of a `--parallel data` plan read "(solver
    FEASIBLE)" with bound 0.0): on one device OPTIMAL at its time; solved on its own devices, that solve's bound;
    costed from another plan (the search's, a re-plan's), none: null in plan.json and said so."""
    import networkx as nx

    from hetpart.partitioner.pipelines import Pipeline, fixed_pipelines, own_bound, pipeline_time_ns
    from hetpart.partitioner.problem import Device, Link, Problem
    from hetpart.partitioner.replan_pipelines import pipeline_plan
    from hetpart.report.table import pipelines_lines

    g = nx.path_graph(["a", "b", "c"], create_using=nx.DiGraph)
    nx.set_node_attributes(g, {"a": {"gpu": 30}, "b": {"gpu": 50}, "c": {"gpu": 40}}, "time_ns")
    nx.set_node_attributes(g, {"a": ("w",), "b": (), "c": ()}, "weights")
    p = Problem(graph=g, weights={"w": 1000}, devices=[Device(f"g{i}", "gpu", "n0", 10**6) for i in range(4)],
                intra_node_links={"n0": Link(1000, 0)}, network=Link(100, 0))
    fixed = fixed_pipelines(p, [["g0"], ["g1", "g2"]], [2, 3])
    one, two = fixed.pipelines
    assert fixed.devices_idle == {"g3": "not in any group of --pipelines"}  # was "in no pipeline" (ux22's 'left')
    assert own_bound(one) == (one.time_ns, "OPTIMAL") == (2 * 120, "OPTIMAL")  # its one plan: 2 x (30+50+40)
    assert own_bound(two) == (two.plan.lower_bound_ns, two.plan.solver_status) and 0 < two.plan.lower_bound_ns
    costed = pipeline_plan(p, two.devices, two.plan.stage_of, two.plan.slot_of_stage, 3)  # as a re-plan costs it
    assert costed.lower_bound_ns == 0 and own_bound(Pipeline(1, two.devices, 3, costed, two.time_ns)) == (
        None, "FEASIBLE")
    alone = pipeline_plan(p, ("g3",), dict.fromkeys("abc", 0), ("g3",), 2)
    assert (alone.lower_bound_ns, alone.solver_status) == (0, "FEASIBLE")  # the plan as costed: no bound
    assert own_bound(Pipeline(0, ("g3",), 2, alone, pipeline_time_ns(alone, 2))) == (240, "OPTIMAL")
    data = _plan()
    data["pipelines"][1]["lower_bound_us"] = None
    data["pipelines"][1]["solver_status"] = "FEASIBLE"
    lines = pipelines_lines(load_plan(Path("plan.json"), json.loads(json.dumps(data))))
    assert lines[0].endswith("(solver OPTIMAL)") and lines[1].endswith("(solver FEASIBLE, no bound of its own)")


@pytest.mark.parametrize(("edit", "message"), [
    (lambda p: p["stages"].reverse(), "'stages' must be the pipelines' stages in rank order"),
    (lambda p: p.update(microbatches=5), "the pipelines' microbatches add up to 6, 'microbatches' is 5"),
    (lambda p: p["pipelines"][1].update(index=0), "pipelines[1] must be pipeline 1"),
    (lambda p: p["pipelines"][0]["stages"][1].update(pipeline=1),
     "pipelines[0].stages[1] must be stage 1 of pipeline 0"),
    (lambda p: p["pipelines"][0].update(microbatches="4"), "'microbatches' is missing or not a int"),
])
def test_an_edited_plan_of_pipelines_is_refused(edit, message):
    data = json.loads(json.dumps(_plan()))
    edit(data)
    with pytest.raises(HetpartError, match="re-run `hetpart partition`") as err:
        load_plan(Path("plan.json"), data)
    assert message in str(err.value)


# The gradients (NOTE [pipelines gradients]): divided by the global batch's microbatches; the hook that breaks it

def test_each_rank_divides_its_summed_gradients_by_the_global_microbatches(monkeypatch):
    import torch

    from hetpart.runtime.worker import SharedGrads, sync_gradients

    layer = torch.nn.Linear(2, 1)
    for hook, divisor in ((None, 12), ("scale", 4)):
        if hook:
            monkeypatch.setenv("HETPART_TEST_BREAK_GRAD_SYNC", hook)
        layer.weight.grad = torch.full_like(layer.weight, 12.0)
        sync_gradients(layer, SharedGrads(), microbatches=12, pipeline_microbatches=4)
        assert torch.equal(layer.weight.grad, torch.full_like(layer.weight, 12.0 / divisor))


def test_gradients_are_compared_at_their_largest_element_not_a_cancelled_block():
    import torch

    from hetpart.runtime.verify import Tolerances, check_tensor

    # qkv.bias's gradient: the key third cancels to fp32 noise (NOTE [verify tolerances])
    ref = torch.cat([torch.full((4,), 0.03), torch.full((4,), 2e-9), torch.full((4,), 0.45)])
    rounded = ref + torch.cat([torch.zeros(4), torch.full((4,), 6e-8), torch.zeros(4)])
    assert not check_tensor("g", rounded, ref, Tolerances()).ok  # the outputs' robust scale: 2e-9
    assert check_tensor("g", rounded, ref, Tolerances(), robust=False).ok
    assert not check_tensor("g", ref * torch.tensor([1.0] * 8 + [0.5] * 4), ref, Tolerances(), robust=False).ok


# The CLI's mistakes: exit 2 before tracing, nothing on disk (docs/errors.md, "Data-parallel pipelines")

@pytest.mark.parametrize(("extra", "message"), [
    (["--pipelines", "local/0,local/1;local/9"], "unknown device 'local/9' in pipeline 1"),
    (["--pipelines", "local/0;local/0"], "device 'local/0' is in pipelines 0 and 1"),
    (["--pipelines", "local/0;local/1", "--pipeline-microbatches", "3,2"], "adds up to 5, but --microbatches is 4"),
    (["--pipeline-microbatches", "2,2"], "pass --pipelines too"),
    (["--pipelines", "local/0;local/1", "--parallel", "data"], "pass one of the two"),
    (["--pipelines", "local/0;local/1", "--strategy", "parameters"], "--strategy parameters writes a baseline"),
    (["--pipelines", "local/0,local/2;local/1,local/3", "--tensor-parallel", "2"],  # NOTE [tensor-parallel pipelines]
     "pipeline 0 has local/0, local/2 outside any whole group of --tensor-parallel 2 (the TP groups: local/0+local/1"),
])
def test_partition_refuses_bad_pipelines_with_exit_2(tmp_path, capsys, extra, message):
    out = tmp_path / "out"
    code = main(["partition", "zoo:mlp", "--cluster", "preset:cpu-6", "--out", str(out), *extra])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("hetpart: error: ") and message in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_compiled_pipelines_group_every_holder_of_a_weight_and_store_each_weight_once(tmp_path):
    """compile_model with two pipelines cut alike: the manifest's weights groups are the partitioner's
    `weight_holders` (an independent route: the plan's stages, not the split graphs), and the second
    pipeline's ranks load the first's copies of the weights (NOTE [weights stored once])."""
    from hetpart.compile import CompileOptions, compile_model
    from hetpart.frontend import ModelSpec
    from hetpart.partitioner.pipelines import weight_holders

    out = tmp_path / "out"
    opts = CompileOptions(microbatches=4, pt2=False, mode="training", time_limit_s=5,
                          pipelines=(("local/0", "local/1"), ("local/2", "local/3")), pipeline_microbatches=(2, 2))
    # hidden 512: at 256 a second stage no longer pays its hand-offs' per-tensor latency (NOTE [stage time])
    result = compile_model(ModelSpec("zoo:mlp", {"hidden": "512", "n_blocks": "4"}, 8, 16, 0), "preset:cpu-6", out,
                           opts, echo=lambda _: None)
    man = json.loads((out / "manifest.json").read_text())
    device_rank = {r["planned_device"]: r["rank"] for r in man["ranks"]}
    holders = weight_holders(result.problem, result.pipelines.pipelines)
    grouped = {w: g["ranks"] for g in man["mesh"]["groups"] if g["kind"] == "weights" for w in g["weights"]}
    assert grouped == {w: sorted(device_rank[d] for d in devs) for w, devs in holders.items() if len(devs) > 1}
    assert len({r["pipeline"] for r in man["ranks"]}) == 2
    # NOTE [weights stored once], across pipelines: every weight's bytes in one file, the first rank's that reads
    # it (pipeline 0's); the second pipeline's ranks name those files, with their hashes, in their manifest entries.
    from hetpart.frontend import load_model
    from tests.test_artifacts_speed_weights import tensor_copies

    module, _ = load_model(ModelSpec.from_json(json.loads((out / "plan.json").read_text())["model"]))
    assert tensor_copies(out, module) == {}
    second = [r for r in man["ranks"] if r["pipeline"] == 1]
    assert second and all(any(f.startswith("../rank") for f in r["files"]) for r in second)
    from hetpart.runtime.artifacts import load_manifest

    load_manifest(out)  # the references check out
    plan = json.loads((out / "plan.json").read_text())
    assert plan["devices_idle"] == {"local/4": "not in any group of --pipelines", "local/5": "not in any group of --pipelines"}
    page = (out / "report.html").read_text()  # the slowest pipeline's schedule, stages named p.k
    assert "2 data-parallel pipelines" in page and '></span>1.0</td>' in page
    assert plan["grad_sync_us"] > 0 and plan["iteration_us"] == pytest.approx(
        max(q["time_us"] for q in plan["pipelines"]) + plan["grad_sync_us"], abs=2e-3)
    from hetpart.export import export_plan  # each pipeline's schedule CSV (NOTE [one CSV per pipeline])

    export_plan(out, "schedule-csv", tmp_path / "s.csv")
    assert sorted(p.name for p in tmp_path.glob("s*.csv")) == ["s.pipeline0.csv", "s.pipeline1.csv"]
    with pytest.raises(HetpartError, match="2 data-parallel pipelines, and accelerate's device_map"):
        export_plan(out, "accelerate", tmp_path / "map.json")
    assert not (tmp_path / "map.json").exists()


def test_inference_metadata_of_a_pipelines_last_stage_is_its_own_outputs_not_the_next_pipelines_inputs():
    import torch

    from hetpart.runtime.worker import _static_metadata

    def value(name: str, shape: list) -> dict:
        return {"name": name, "shape": shape, "dtype": "f32"}

    ranks = _ranks([(2, 2, 2), (1, 2, 2)])
    boundaries = [(["s0", 8], ["s0", 4]), (["s0", 4], ["s0", 3]), (["s0", 8], ["s0", 3])]
    for r, (ins, outs) in enumerate(boundaries):
        ranks[r].update(inputs=[value(f"x{r}", ins)], outputs=[value(f"y{r}", outs)])
    man = {"mesh": mesh([[]] * 3, [2, 2], [2, 1]), "ranks": ranks}
    cpu = torch.device("cpu")
    shapes = {r: [tuple(t.shape) for t in _static_metadata(man, ranks[r], {"s0": 2}, cpu)["output_args"]]
              for r in range(3)}
    assert shapes == {0: [(2, 4)], 1: [(2, 3)], 2: [(2, 3)]}  # rank 1 ends pipeline 0: rank 2's inputs are not its


def test_the_bound_note_is_written_and_printed_with_what_the_deadline_cut():
    """plan.json's bound_note says what the pipelines' bound leaves out (parts cut by the time limit among them),
    and the CLI prints it under a gap that is not proven zero (it went unwritten before planfuzz)."""
    from hetpart.report.table import pipelines_lines

    note = ("every partition of the 4 devices into pipelines ...; left out: transfers between stages above the least a "
            "boundary carries, bucket latencies; the gradient-sync floor (past the deadline)")
    plan = load_plan(Path("plan.json"), json.loads(json.dumps(_plan(bound_note=note, solver_status="FEASIBLE",
                                                                    bound_unfinished=["sync"]))))
    assert plan.bound_note == note and plan.bound_unfinished == ["sync"]  # the cut parts, as PipelinesPlan has them
    with pytest.raises(HetpartError, match="bound_unfinished"):
        load_plan(Path("plan.json"), _plan(bound_note=note, bound_unfinished="sync"))
    assert f"lower bound: {note}" in pipelines_lines(plan)
    proven = load_plan(Path("plan.json"), _plan(bound_note=note, solver_status="OPTIMAL", gap=0.0))
    assert not [ln for ln in pipelines_lines(proven) if ln.startswith("lower bound:")]


def test_pipelines_of_tp_stages_are_planned(tmp_path, capsys):
    """`--parallel data --tensor-parallel 2` (NOTE [tensor-parallel pipelines]): the search's pipelines are of TP-2
    slots, each stage one machine's group of two, the manifest's mesh passes `load_manifest` (NOTE [tensor-parallel
    pipelines mesh]). Runs: tests/runtime/test_dp_tp_run.py; their re-plan: tests/test_replan_dp_tp.py."""
    from hetpart.devices import load_cluster
    from hetpart.passes.tp_lower import tp_groups
    from hetpart.runtime.artifacts import load_manifest

    out = tmp_path / "out"
    assert main(["partition", "zoo:gpt-small", "--set", "n_layer=2", "--set", "n_embd=64", "--set", "vocab_size=128",
                 "--set", "block_size=32", "--batch-size", "8", "--seq-len", "16", "--microbatches", "4", "--no-pt2",
                 "--mode", "training", "--tensor-parallel", "2", "--parallel", "data", "--time-limit", "3",
                 "--cluster", "preset:cpu-8", "--out", str(out)]) == 0
    capsys.readouterr()
    plan = json.loads((out / "plan.json").read_text())
    slots = {g.devices for g in tp_groups(load_cluster("preset:cpu-8"), 2)}
    stages = [s for q in plan["pipelines"] for s in q["stages"]]
    assert len(plan["pipelines"]) >= 2 and all(tuple(s["devices"]) in slots for s in stages)
    man = load_manifest(out)
    assert [len(s) for q in man["mesh"]["pipelines"] for s in q["stages"]] == [2] * len(stages)
    assert [r["planned_device"] for r in man["ranks"]] == [d for s in stages for d in s["devices"]]


def test_parallel_data_with_max_tensor_parallel_keeps_the_fastest_degree_and_writes_it(tmp_path, capsys):
    """`--parallel data --max-tensor-parallel 2` (NOTE [tensor-parallel pipelines]): each degree searched, the step
    printed per degree; what is written is the fastest one's (ties: the smaller degree), TP stages or none."""
    import re

    from hetpart.runtime.artifacts import load_manifest

    out = tmp_path / "out"
    assert main(["partition", "zoo:gpt-small", "--set", "n_layer=2", "--set", "n_embd=64", "--set", "vocab_size=128",
                 "--set", "block_size=32", "--batch-size", "8", "--seq-len", "16", "--microbatches", "4", "--no-pt2",
                 "--mode", "training", "--max-tensor-parallel", "2", "--parallel", "data", "--time-limit", "6",
                 "--cluster", "preset:cpu-8", "--out", str(out)]) == 0
    said = capsys.readouterr().out.splitlines()
    line = next(x for x in said if x.startswith("tensor parallel, data-parallel"))
    # NOTE [degrees share the time limit]: degree 1 first, each within what the limit left it.
    parts = next(x for x in said if x.startswith("the degrees' parts of the time limit"))
    given = [(int(t), float(took), float(share)) for t, took, share in
             re.findall(r"degree (\d) ([\d.]+) s of ([\d.]+) s", parts)]
    assert [t for t, _, _ in given] == [1, 2] and given[0][2] <= 6.0 and given[1][2] <= 6.0 - given[0][1] + 0.1
    steps = {int(t): float(us.replace(",", "")) for t, us in re.findall(r"degree (\d): ([\d,.]+) us,", line)}
    assert sorted(steps) == [1, 2]
    chosen = min(steps, key=lambda t: (steps[t], t))
    assert line.endswith(f"chose degree {chosen}")
    plan = json.loads((out / "plan.json").read_text())
    assert abs(plan["iteration_us"] - steps[chosen]) <= 0.1
    man = load_manifest(out)
    assert ("tensor_parallel" in man["mesh"]) == (chosen == 2)
    assert plan["bound_note"].startswith("the least over tensor-parallel degrees 1, 2 ")  # degree 2's: groups
    assert all(len(s["devices"]) == chosen for q in plan.get("pipelines") or [plan] for s in q["stages"])
