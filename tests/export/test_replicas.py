"""NOTE [identical replicas] on hand-made plan.json records: what a partition on a preset rarely produces (two
pipelines of the same stage count cut elsewhere, a batch that cannot split evenly, machines that each hold one
pipeline, a plan written before pipelines had `layers`)."""

from __future__ import annotations

import copy
import re

import pytest

from hetpart.errors import HetpartError
from hetpart.export import export_text
from tests.export.test_formats import plan_json

NAMES = ["wte", "wpe", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "ln_f", "lm_head"]


def pipelines_plan(cuts=((0, 0, 0, 0, 1, 1, 1, 1), (0, 0, 0, 0, 1, 1, 1, 1)), shares=(2, 2),
                   machines=(("a", "b"), ("a", "b"))) -> dict:
    """A plan.json of len(cuts) two-stage pipelines, pipeline p on machines[p] (its devices m/p), as partition
    writes one: each pipeline's stages and `layers`, the top-level stages theirs in rank order."""
    pipelines = []
    for p, (cut, share, where) in enumerate(zip(cuts, shares, machines)):
        one = plan_json(names=NAMES, stage_of_layer=cut, machines=where, types_=("a100-80g", "t4-16g"), split=())
        for s in one["stages"]:
            s["device"] = f"{s['machine']}/{2 * p + s['index']}"
            s.update(devices=[s["device"]], pipeline=p, compute_us=90.0 + 10 * s["index"], comm_in_us=1.0,
                     comm_out_us=2.0, memory_bytes=1, capacity_bytes=2)
        one["layers"]["devices"] = [s["device"] for s in one["stages"]]
        pipelines.append({"index": p, "microbatches": share, "stages": one["stages"], "layers": one["layers"]})
    pj = plan_json(names=NAMES, machines=("a", "b"), types_=("a100-80g", "t4-16g"))
    stages = sorted((s for q in pipelines for s in q["stages"]), key=lambda s: s["device"])
    pj["cluster"]["devices"] = [{"name": s["device"], "type": s["device_type"], "machine": s["machine"],
                                 "mem_bytes": 1 << 34} for s in stages]
    pj.update(pipelines=pipelines, stages=[s for q in pipelines for s in q["stages"]], layers=None,
              microbatches=sum(shares), grad_sync_us=10.0)
    return pj


def test_pipelines_cut_elsewhere_are_named_layer_by_layer():
    pj = pipelines_plan(cuts=((0, 0, 0, 0, 1, 1, 1, 1), (0, 0, 0, 1, 1, 1, 1, 1)))
    with pytest.raises(HetpartError, match=re.escape("pipeline 1 cuts the model elsewhere: blocks.1 on stage 1 "
                                                     "(pipeline 0: stage 0)")):
        export_text(pj, "torchtitan")
    export_text(pipelines_plan(), "torchtitan")  # the control: the same cuts are written


def test_a_batch_that_cannot_split_evenly_says_which_microbatches_would():
    with pytest.raises(HetpartError) as err:
        export_text(pipelines_plan(shares=(3, 2)), "megatron")
    assert "5 microbatches do not split evenly over 2 pipelines" in str(err.value)
    assert "partition with --microbatches 6 --pipeline-microbatches 3,3 to plan equal shares" in str(err.value)


def test_megatron_adds_the_mapping_flag_where_each_machine_holds_a_pipeline():
    """Pipeline p on machine m{p}: Megatron's default order (pp outermost) puts stage 0 of both pipelines on ranks 0
    and 1, one on each machine, which torchrun cannot number; --use-tp-pp-dp-mapping (dp outermost) keeps each
    machine's ranks together. Pipelines across both machines (the control) keep the default."""
    own = export_text(pipelines_plan(machines=(("m0", "m0"), ("m1", "m1"))), "megatron")
    assert "--use-tp-pp-dp-mapping" in own.text
    assert any("machine m0: ranks 0..1" in n for n in own.notes) and any("machine m1: ranks 2..3" in n
                                                                           for n in own.notes)
    across = export_text(pipelines_plan(), "megatron")
    assert "--use-tp-pp-dp-mapping" not in across.text and any("machine a: ranks 0..1" in n for n in across.notes)


def test_torchtitan_says_when_torchrun_cannot_number_its_ranks():
    notes = " ".join(export_text(pipelines_plan(machines=(("m0", "m0"), ("m1", "m1"))), "torchtitan").notes)
    assert "ranks in torchtitan's (pp, dp_shard, tp) order: 0 m0/0, 1 m1/2, 2 m0/1, 3 m1/3" in notes
    assert "machine(s) m0, m1 hold ranks that are not one block" in notes and "sets RANK" in notes


def test_a_pipelines_plan_without_per_pipeline_layers_asks_for_a_new_partition():
    pj = pipelines_plan()
    for q in pj["pipelines"]:
        del q["layers"]
    with pytest.raises(HetpartError, match=r"pipeline 0 of plan.json's `pipelines` has no `layers` section \(written "
                                           "by an older hetpart\)"):
        export_text(pj, "deepspeed")


def test_one_pipeline_of_a_data_parallel_search_exports_as_a_plain_pipeline():
    """`--parallel data` may answer with one pipeline: a plan with `pipelines` of one, its top-level `layers` null."""
    pj = pipelines_plan(cuts=((0, 0, 0, 0, 1, 1, 1, 1),), shares=(4,), machines=(("a", "b"),))
    plain = copy.deepcopy(pj)
    plain.update(layers=pj["pipelines"][0]["layers"])
    del plain["pipelines"]
    for fmt in ("torchtitan", "megatron", "deepspeed", "schedule-csv"):
        assert export_text(pj, fmt).text == export_text(plain, fmt).text, fmt


@pytest.mark.parametrize("slow_second_machine", [False, True])
def test_each_pipelines_rounding_is_its_own_even_where_one_rounding_serves_pipelines_alike(slow_second_machine):
    """NOTE [layers per pipeline]: two pipelines of one plan on machines alike share one rounding, renamed; on a
    machine with a slower link (the control) the rounding is costed again. Both equal `round_to_layers` on each."""
    import networkx as nx

    from hetpart.compile_pipelines import _layers_records
    from hetpart.export.layers import MODULE, round_to_layers
    from hetpart.partitioner.pipelines import fixed_pipelines, sub_problem
    from hetpart.partitioner.problem import Device, Link, Problem

    g = nx.path_graph(["a", "b", "c", "d"], create_using=nx.DiGraph)
    nx.set_node_attributes(g, {v: {"gpu": t} for v, t in zip("abcd", (30_000, 50_000, 40_000, 45_000))}, "time_ns")
    nx.set_node_attributes(g, 4000, "out_bytes")
    nx.set_node_attributes(g, {"a": "blocks.0", "b": "blocks.0", "c": "blocks.1", "d": "blocks.1"}, MODULE)
    links = {"n0": Link(1000, 0), "n1": Link(400 if slow_second_machine else 1000, 0)}
    p = Problem(graph=g, weights={}, devices=[Device(f"g{i}", "gpu", f"n{i // 2}", 10**6) for i in range(4)],
                intra_node_links=links, network=Link(10, 0))
    pp = fixed_pipelines(p, [["g0", "g1"], ["g2", "g3"]], [2, 2])
    assert [q.plan.stage_of for q in pp.pipelines][0] == pp.pipelines[1].plan.stage_of  # one plan twice
    got = _layers_records(p, pp.pipelines)
    direct = [round_to_layers(sub_problem(p, q.devices, q.microbatches), q.plan).to_json() for q in pp.pipelines]
    assert got == direct and got[1]["devices"] == ["g2", "g3"]
    assert (got[0]["rounded_stage_us"] != got[1]["rounded_stage_us"]) == slow_second_machine


def test_pipelines_rounded_alike_get_one_note_naming_every_idle_device():
    """On hetero-64 two stripes of 13 stages were rounded alike to 8 (each on its own devices): two notes that
    differed only in the idle devices' names. Now one, with all of them."""
    pj = pipelines_plan(cuts=((0,) * 8, (0,) * 8))
    for q in pj["pipelines"]:
        q["layers"].update(devices=[q["stages"][0]["device"]], rounded_stage_us=[100.0])
    notes = [n for n in export_text(pj, "megatron").notes if "stay idle" in n]
    assert len(notes) == 1 and notes[0].startswith("note: pipeline(s) 0, 1: the plan")
    assert "1 of the plan's 2 stages keep a whole layer: b/1, b/3 would stay idle" in notes[0]


def test_cpu_ranks_get_no_cuda_visible_devices():
    notes = export_text(plan_json(machines=("a",) * 4, types_=("cpu",) * 4), "megatron").notes
    line = next(n for n in notes if n.startswith("note: machine a:"))
    assert line.endswith("--nproc-per-node 4, 4 rank(s) on its CPU") and "CUDA_VISIBLE_DEVICES" not in line
    gpus = export_text(plan_json(machines=("a",) * 4), "megatron").notes  # the control
    assert any(n.endswith("CUDA_VISIBLE_DEVICES=0,1,2,3") for n in gpus)


@pytest.mark.parametrize("fmt", ["torchtitan", "megatron", "deepspeed", "accelerate"])
def test_virtual_stages_are_still_refused_by_the_layer_formats(fmt):
    """The replicas' path (replicas_of) keeps layer_plan's refusal of interleaved plans (NOTE [virtual stages plan])."""
    pj = plan_json()
    pj["virtual_stages"] = 2
    with pytest.raises(HetpartError, match="2 virtual stages per device"):
        export_text(pj, fmt)
    assert export_text(pj, "schedule-csv").text.startswith("0F0,")


def test_torchtitan_replicas_of_one_stage_are_ddp_and_of_a_pipeline_fsdp():
    """NOTE [torchtitan's data parallelism]: torchtitan's DDP refuses a mesh of more than data parallelism ("DDP has not
    supported > 1D parallelism"), so replicas of a 2-stage pipeline are FSDP's shard degree; replicas of one stage
    (every layer rounded onto stage 0, the other device idle) stay DDP's."""
    import tomllib

    piped = export_text(pipelines_plan(), "torchtitan")
    par = tomllib.loads(piped.text)["parallelism"]
    assert (par["pipeline_parallel_degree"], par["data_parallel_replicate_degree"],
            par["data_parallel_shard_degree"]) == (2, 1, 2)
    assert any("replicas are FSDP's" in n for n in piped.notes)
    pj = pipelines_plan(cuts=((0,) * 8, (0,) * 8))
    for q in pj["pipelines"]:
        q["layers"].update(devices=q["layers"]["devices"][:1],  # as the rounding writes it: the idle device left out
                           rounded_stage_us=q["layers"]["rounded_stage_us"][:1])
    alone = export_text(pj, "torchtitan")
    par = tomllib.loads(alone.text)["parallelism"]
    assert (par["pipeline_parallel_degree"], par["data_parallel_replicate_degree"],
            par["data_parallel_shard_degree"]) == (1, 2, 1)
    assert not any("FSDP" in n for n in alone.notes)


def test_the_header_gives_each_replica_its_own_device_type_and_time():
    """A --parallel data plan of one-stage A100 and T4 replicas (equal shares, the same layers) was headed "stage 0:
    a/0 | a/1 | b/0 | b/1 (a100-80g), 353.052 us": the T4s named A100s, with the A100s' time."""
    pj = pipelines_plan()
    slow = pj["pipelines"][1]
    slow["stages"][0]["device_type"] = "t4-16g"
    next(d for d in pj["cluster"]["devices"] if d["name"] == slow["stages"][0]["device"])["type"] = "t4-16g"
    slow["layers"]["rounded_stage_us"] = [150.0, 101.0]
    head = [line for line in export_text(pj, "megatron").text.splitlines() if line.startswith("# stage ")]
    assert head[0].startswith("# stage 0: a/0 (a100-80g, 100 us) | a/2 (t4-16g, 150 us): "), head
    assert head[1].startswith("# stage 1: b/1 | b/3 (t4-16g), 101 us: "), head  # alike: named once
