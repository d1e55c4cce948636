"""`hetpart export` of 3D plans made by `partition` on presets (NOTE [identical replicas], NOTE [one CSV per
pipeline]): equal --pipelines are written as data-parallel replicas, --tensor-parallel 2 as a TP degree, and
asymmetric pipelines, an uneven batch split or TP degrees that differ by stage are refused by name. Each
framework's rank order is recomputed here from its own rule (the axes each cites), not from hetpart's helper."""

from __future__ import annotations

import json
import re
import tomllib

import pytest

from hetpart.cli import main
from tests.export.test_formats import load_with_torch

GPT = ["zoo:gpt-small", "--set", "n_layer=4", "--set", "n_embd=32", "--set", "n_head=2", "--set", "vocab_size=64",
       "--set", "block_size=16", "--seq-len", "8", "--no-pt2", "--time-limit", "3", "--mode", "training",
       "--align", "layers"]
PLANS = {  # name -> the flags beside GPT
    "equal": ["--cluster", "preset:mixed-4", "--pipelines", "a/0,b/0;a/1,b/1", "--microbatches", "4",
              "--batch-size", "8"],
    "uneven": ["--cluster", "preset:mixed-4", "--pipelines", "a/0,b/0;a/1,b/1", "--pipeline-microbatches", "5,3",
               "--microbatches", "8", "--batch-size", "16"],
    "asymmetric": ["--cluster", "preset:mixed-4", "--pipelines", "a/0,a/1,b/0;b/1", "--microbatches", "4",
                   "--batch-size", "8"],
    "tp": ["--cluster", "preset:mixed-4", "--tensor-parallel", "2", "--microbatches", "4", "--batch-size", "8"],
    "tp-dp": ["--cluster", "preset:a100-t4-8", "--tensor-parallel", "2", "--pipelines",
              "a/0,a/1,b/0,b/1;a/2,a/3,b/2,b/3", "--microbatches", "4", "--batch-size", "8"],
    "mixed-tp": ["--cluster", "preset:mixed-4", "--tensor-parallel", "a=2,b=1", "--microbatches", "4",
                 "--batch-size", "8"],
}


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    root = tmp_path_factory.mktemp("export3d")
    for name, flags in PLANS.items():
        assert main(["partition", *GPT, *flags, "--out", str(root / name)]) == 0, name
    return root


def export(plans, capsys, name: str, fmt: str, *out: str) -> tuple[int, str, str]:
    code = main(["export", str(plans / name), "--format", fmt, *out])
    got = capsys.readouterr()
    return code, got.out, got.err


def stage_groups(plans, name: str) -> list[list[list[str]]]:
    """plan.json's pipelines -> stages -> the devices of each stage's TP group."""
    pj = json.loads((plans / name / "plan.json").read_text())
    return [[s["devices"] or [s["device"]] for s in q["stages"]] for q in pj.get("pipelines") or [pj]]


def listed_ranks(err: str) -> list[str]:
    line = next(x for x in err.splitlines() if x.startswith("note: ranks in"))
    return [item.split(" ")[1] for item in line.split(" order: ")[1].split(", ")]


@pytest.mark.parametrize("name, pipelines, degree", [("equal", 2, 1), ("tp", 1, 2), ("tp-dp", 2, 2)])
def test_torchtitan_writes_replicas_and_tp_with_its_mesh_order(plans, capsys, name, pipelines, degree):
    code, out, err = export(plans, capsys, name, "torchtitan")
    assert code == 0, err
    cfg = tomllib.loads(out)
    par, training = cfg["parallelism"], cfg["training"]
    groups = stage_groups(plans, name)
    stages = len(groups[0])
    replicate, shard = par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]
    assert (replicate * shard, par["tensor_parallel_degree"], par["pipeline_parallel_degree"]) == (
        pipelines, degree, stages)  # torchtitan's data-parallel degree is dp_replicate x dp_shard
    world = replicate * shard * degree * stages  # ParallelDims._validate: the product is the world size
    assert world == len({d for q in groups for s in q for d in s})
    # parallelize_llama: DDP (dp_replicate > 1, no FSDP) only as the one parallelism, else "DDP has not supported
    # > 1D parallelism"; torchtitan's job refused what main wrote here (NOTE [torchtitan's data parallelism]).
    assert not (replicate > 1 and shard == 1) or world == replicate
    assert ("replicas are FSDP's" in err) == (shard > 1)
    pj = json.loads((plans / name / "plan.json").read_text())
    share = pj["microbatches"] // pipelines
    # torchtitan's microbatches: local_batch_size / pipeline_parallel_microbatch_size, the plan's share.
    assert training["local_batch_size"] // par["pipeline_parallel_microbatch_size"] == share
    assert training["global_batch_size"] == pj["model"]["batch_size"]
    # ParallelDims' mesh: pp, dp_replicate, (dp_shard, cp,) tp, the last fastest.
    expected = [groups[p][k][t] for k in range(stages) for p in range(pipelines) for t in range(degree)]
    assert listed_ranks(err) == expected and sorted(expected) == sorted(d for q in groups for s in q for d in s)
    assert ("tensor-parallel degree 2" in err) == (degree == 2)


def test_megatron_sizes_and_rank_order(plans, capsys):
    code, out, err = export(plans, capsys, "tp-dp", "megatron")
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("--"))
    arg = lambda flag: int(re.search(rf"{flag} (\d+)", line).group(1))  # noqa: E731
    assert (arg("--tensor-model-parallel-size"), arg("--pipeline-model-parallel-size")) == (2, 2)
    world = 8  # a100-t4-8, every device used
    assert world // (2 * 2) == 2  # Megatron's data-parallel size, implied
    # global / (micro x DP) is each replica's microbatch count: the plan's share.
    assert arg("--global-batch-size") // (arg("--micro-batch-size") * 2) == 2
    groups = stage_groups(plans, "tp-dp")
    # Default order tp-cp-ep-dp-pp (tp fastest): here each machine's ranks are one block, so no mapping flag.
    assert "--use-tp-pp-dp-mapping" not in line
    assert listed_ranks(err) == [groups[p][k][t] for k in range(2) for p in range(2) for t in range(2)]
    assert "torchrun --nnodes 2 --node-rank 0 --nproc-per-node 4" in err


def test_deepspeed_topology_numbers_ranks_on_the_planned_devices(plans, capsys):
    code, out, err = export(plans, capsys, "tp-dp", "deepspeed")
    assert code == 0, err
    data = json.loads(out)
    topo = data["topology"]
    assert topo["class"] == "PipeModelDataParallelTopology" and (topo["num_pp"], topo["num_mp"], topo["num_dp"]) == (
        2, 2, 2)
    ds = data["ds_config"]  # train_batch_size = micro x accumulation x DP
    assert ds["train_batch_size"] == ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * 2 == 8
    groups = stage_groups(plans, "tp-dp")
    import itertools  # ProcessTopology: axes pipe, data, model, ranks in itertools.product order

    coords = list(itertools.product(range(2), range(2), range(2)))
    assert data["rank_devices"] == [groups[data_][pipe][model] for pipe, data_, model in coords]


def test_schedule_csv_writes_one_file_per_pipeline_and_refuses_stdout(plans, capsys, tmp_path):
    for name, shares in (("equal", (2, 2)), ("uneven", (5, 3))):
        out = tmp_path / f"{name}.csv"
        code, _, err = export(plans, capsys, name, "schedule-csv", "--out", str(out))
        assert code == 0, err
        assert not out.exists()  # NOTE [one CSV per pipeline]: no FILE.csv, FILE.pipeline<p>.csv
        for p, m in enumerate(shares):
            load_with_torch(tmp_path / f"{name}.pipeline{p}.csv", 2, m)  # torch's loader and validator
        assert ("weighted by these shares" in err) == (shares[0] != shares[1])
    for out in ([], ["--out", "-"]):
        code, stdout, err = export(plans, capsys, "equal", "schedule-csv", *out)
        assert code == 2 and stdout == "" and "2 data-parallel pipelines, one CSV each" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "equal.pipeline0.csv", "equal.pipeline1.csv", "uneven.pipeline0.csv", "uneven.pipeline1.csv"]


def test_schedule_csv_of_a_tp_plan_names_each_stages_ranks(plans, capsys):
    code, out, err = export(plans, capsys, "tp", "schedule-csv")
    assert code == 0 and len(out.splitlines()) == 2
    assert "stage 0 -> ranks 0..1: b/0+b/1" in err and "stage 1 -> ranks 2..3: a/0+a/1" in err


@pytest.mark.parametrize("fmt", ["torchtitan", "megatron", "deepspeed"])
def test_what_identical_replicas_cannot_express_is_refused_by_name(plans, capsys, tmp_path, fmt):
    target = tmp_path / "cfg"
    code, _, err = export(plans, capsys, "asymmetric", fmt, "--out", str(target))
    assert code == 2 and "pipeline 1 has 1 stage(s) (b/1) where pipeline 0 has 2 (a/0, a/1)" in err
    assert "equal --pipelines groups" in err and "--format schedule-csv" in err
    code, _, err = export(plans, capsys, "uneven", fmt, "--out", str(target))
    assert code == 2 and "splits its 8 microbatches 5/3 over its 2 pipelines" in err
    assert "--pipeline-microbatches 4,4" in err
    pj = json.loads((plans / "uneven" / "plan.json").read_text())
    assert f"against the plan's {pj['iteration_us']:g} us" in err  # the plan's own step, recomputed
    code, _, err = export(plans, capsys, "mixed-tp", fmt, "--out", str(target))
    assert code == 2 and "runs on one device (b/0)" in err and "a TP group of 2 (a/0+a/1)" in err
    assert "--tensor-parallel T" in err
    assert not target.exists() and list(tmp_path.iterdir()) == []


def test_accelerate_refuses_pipelines_and_tp_groups(plans, capsys):
    code, _, err = export(plans, capsys, "equal", "accelerate")
    assert code == 2 and "2 data-parallel pipelines" in err and "one process" in err
    code, _, err = export(plans, capsys, "tp", "accelerate")
    assert code == 2 and "stage 0 runs tensor-parallel on b/0+b/1" in err


def test_out_dash_is_stdout_and_writes_no_file_named_dash(plans, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = export(plans, capsys, "tp", "megatron", "--out", "-")
    assert code == 0 and out.startswith("# hetpart export --format megatron") and "wrote" not in err
    code, out, _ = export(plans, capsys, "tp", "torchtitan", "--out", "-")  # one file: the schedule by name
    assert code == 0 and 'pipeline_parallel_schedule = "GPipe"' in out
    assert list(tmp_path.iterdir()) == []
    code, out, err = export(plans, capsys, "tp", "megatron", "--out", "cfg.txt")  # the control: a file is written
    assert code == 0 and out == "" and (tmp_path / "cfg.txt").read_text().startswith("# hetpart export")
