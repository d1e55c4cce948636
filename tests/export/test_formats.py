"""Each export format against its library's own schema: torch's schedule loader and deadlock check
(installed), and for torchtitan, Megatron-LM and DeepSpeed (not installed here) the rules of the
sources each writer cites (hetpart/export/formats.py)."""

from __future__ import annotations

import functools
import re
import tomllib
import types

import pytest

from hetpart.errors import HetpartError
from hetpart.export import export_text
from hetpart.export.formats import deepspeed_parts, schedule_rows
from hetpart.export.layers import LayerPlan

GPT = ["wte", "wpe", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "blocks.4", "ln_f", "lm_head"]


def plan_json(names=GPT, stage_of_layer=(0, 0, 0, 0, 1, 2, 2, 3, 3), machines=("a", "a", "b", "b"),
              types_=("a100-80g", "a100-80g", "t4-16g", "t4-16g"), split=("blocks.2",), mode="training",
              schedule="1f1b", microbatches=4) -> dict:
    """A plan.json as `partition` writes it, reduced to what export reads."""
    count = {m: 0 for m in machines}
    devices = []
    for m, t in zip(machines, types_):
        devices.append({"name": f"{m}/{count[m]}", "type": t, "machine": m, "mem_bytes": 1 << 34})
        count[m] += 1
    stages = [{"index": k, "device": d["name"], "device_type": d["type"], "machine": d["machine"]}
              for k, d in enumerate(devices)]
    lp = LayerPlan(names=list(names), stage_of_layer=list(stage_of_layer), devices=[d["name"] for d in devices],
                   split_by_plan=list(split), bottleneck_us=100.0, rounded_bottleneck_us=110.0,
                   rounded_stage_us=[100.0 + k for k in range(len(devices))], over_memory_stages=[])
    return {"model": {"model": "zoo:gpt-small"}, "cluster": {"name": "test", "devices": devices}, "mode": mode,
            "schedule": schedule, "microbatches": microbatches, "microbatch_size": 2, "stages": stages,
            "layers": lp.to_json()}


# --- torch.distributed.pipelining: its own loader and deadlock check read the CSV back ---------------

def load_with_torch(path, num_stages: int, microbatches: int):
    """`PipelineScheduleMulti._load_csv` (torch's code) on an object with just the fields it uses: it
    parses every cell with `_Action.from_str` and validates the order (`_validate_schedule`)."""
    from torch.distributed.pipelining.schedules import PipelineScheduleMulti

    stub = types.SimpleNamespace(pipeline_order={}, pp_group_size=num_stages, _num_stages=num_stages,
                                 _n_microbatches=microbatches, _stages=[])
    stub._validate_and_set_stage_mapping = functools.partial(PipelineScheduleMulti._validate_and_set_stage_mapping,
                                                             stub)
    PipelineScheduleMulti._load_csv(stub, str(path))
    return stub


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages, microbatches", [(4, 4), (3, 8), (1, 2)])
def test_schedule_csv_reads_back_with_torch_and_runs_without_deadlock(tmp_path, schedule, stages, microbatches):
    from torch.distributed.pipelining.schedules import _add_send_recv, _simulate_comms_compute

    pj = plan_json(stage_of_layer=[min(k, stages - 1) for k in range(len(GPT))], machines=("a",) * stages,
                   types_=("a100-80g",) * stages, schedule=schedule, microbatches=microbatches)
    pj["stages"] = pj["stages"][:stages]
    out = export_text(pj, "schedule-csv")
    (tmp_path / "s.csv").write_text(out.text)
    stub = load_with_torch(tmp_path / "s.csv", stages, microbatches)
    assert stub.stage_index_to_group_rank == {k: k for k in range(stages)}  # rank k runs stage k
    with_comms = _add_send_recv(stub.pipeline_order, lambda s: s, stages)
    _simulate_comms_compute(with_comms, lambda s: s, stages)  # raises on a deadlock
    assert any("stage 0 -> rank 0: a/0" in n for n in out.notes)


def test_1f1b_rows_hold_at_most_s_minus_k_microbatches_in_flight():
    for k, row in enumerate(schedule_rows(4, 8, "1f1b")):
        in_flight = peak = 0
        for action in row:
            in_flight += 1 if "F" in action else -1
            peak = max(peak, in_flight)
        assert peak == min(4 - k, 8)  # NOTE [training memory]: 1F1B's stash


# --- torchtitan: torchtitan/config/job_config.py, class Parallelism ------------------------------------

def test_torchtitan_parallelism_table(tmp_path):
    from torch.distributed.pipelining.schedules import get_schedule_class

    out = export_text(plan_json(), "torchtitan", tmp_path / "titan.toml")
    par = tomllib.loads(out.text)["parallelism"]
    parts = par["module_fqns_per_model_part"]  # list[list[str]], one list per model part
    assert all(isinstance(p, list) and all(isinstance(f, str) for f in p) for p in parts)
    assert parts == [GPT[:4], ["blocks.2"], ["blocks.3", "blocks.4"], ["ln_f", "lm_head"]]
    assert par["pipeline_parallel_degree"] == len(parts)
    assert par["pipeline_parallel_microbatch_size"] == 2
    # With a CSV the schedule must be PipelineScheduleSingle, PipelineScheduleMulti or _PipelineScheduleRuntime.
    assert get_schedule_class(par["pipeline_parallel_schedule"]).__name__ == "PipelineScheduleMulti"
    assert par["pipeline_parallel_schedule_csv"] == str((tmp_path / "titan.schedule.csv").resolve())
    (tmp_path / "titan.schedule.csv").write_text(out.extra_files[".schedule.csv"])
    load_with_torch(tmp_path / "titan.schedule.csv", len(parts), 4)
    assert any("+10.0%" in n and "blocks.2" in n for n in out.notes)  # what rounding lost


def test_torchtitan_without_out_names_the_schedule():
    from torch.distributed.pipelining.schedules import get_schedule_class

    par = tomllib.loads(export_text(plan_json(schedule="gpipe"), "torchtitan").text)["parallelism"]
    assert "pipeline_parallel_schedule_csv" not in par
    assert get_schedule_class(par["pipeline_parallel_schedule"]).__name__ == "ScheduleGPipe"


# --- Megatron-LM: megatron/core/transformer/pipeline_parallel_layer_layout.py -----------------------

def megatron_parse(layout: str) -> list[list[str]]:
    """`PipelineParallelLayerLayout.parse_str_to_list`'s documented rules: commas are cosmetic,
    `(...)*n` and `x*n` repeat, `|` splits stages, E/t/m/L are the layer types."""
    layout = layout.replace(",", "")
    layout = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), layout)
    layout = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), layout)
    stages = [list(stage) for stage in layout.split("|")]
    assert all(c in "EtmL" for stage in stages for c in stage)
    return stages


def test_megatron_layout_follows_megatrons_rules():
    out = export_text(plan_json(), "megatron")
    line = next(x for x in out.text.splitlines() if x.startswith("--"))
    size = int(re.search(r"--pipeline-model-parallel-size (\d+)", line).group(1))
    num_layers = int(re.search(r"--num-layers (\d+)", line).group(1))
    stages = megatron_parse(re.search(r'--pipeline-model-parallel-layout "([^"]+)"', line).group(1))
    flat = [c for stage in stages for c in stage]
    # validate_layer_layout: stages divisible by PP size, E first and once, L last and once, t == num_layers.
    assert len(stages) % size == 0 and len(stages) == 4
    assert flat[0] == "E" and flat[-1] == "L" and flat.count("E") == flat.count("L") == 1
    assert flat.count("t") == num_layers == 5
    assert [stage.count("t") for stage in stages] == [2, 1, 2, 0]


def test_megatron_refuses_two_stacks_of_blocks():
    names = ["shared", "encoder.block.0", "encoder.block.1", "decoder.block.0", "decoder.block.1", "lm_head"]
    pj = plan_json(names=names, stage_of_layer=[0, 0, 1, 2, 3, 3], split=())
    with pytest.raises(HetpartError, match="one stack of decoder layers"):
        export_text(pj, "megatron")


def test_megatron_first_and_last_stage_counts_when_inner_stages_are_even():
    out = export_text(plan_json(stage_of_layer=[0, 0, 0, 1, 1, 2, 2, 3, 3], split=()), "megatron")
    assert "--decoder-first-pipeline-num-layers 1 --decoder-last-pipeline-num-layers 0" in out.text
    assert "carries over" in out.notes[0]  # an aligned plan loses nothing


# --- DeepSpeed: deepspeed/runtime/pipe/module.py, PipelineModule.parts and stage_owner ----------------

def test_deepspeed_parts_own_each_layer_on_its_stage():
    pj = plan_json()
    layers, parts = deepspeed_parts(LayerPlan.from_json(pj["layers"]))
    assert parts[0] == 0 and parts[-1] == len(layers) and len(parts) == 4 + 1 and parts == sorted(parts)
    stage_of = dict(zip(pj["layers"]["names"], pj["layers"]["stage_of_layer"]))
    for idx, name in enumerate(layers):
        owner = next(s for s in range(4) if parts[s] <= idx < parts[s + 1])  # stage_owner(idx)
        assert owner == stage_of[name]


def test_layer_formats_need_a_layers_section():
    pj = plan_json()
    del pj["layers"]
    with pytest.raises(HetpartError, match="older hetpart"):
        export_text(pj, "deepspeed")
    pj["layers"] = None
    with pytest.raises(HetpartError, match="no submodules"):
        export_text(pj, "accelerate")


# --- accelerate (installed): the device map's values -------------------------------------------------

def test_accelerate_refuses_a_plan_across_machines_and_numbers_gpus_per_machine():
    with pytest.raises(HetpartError, match="spans machines a, b"):
        export_text(plan_json(), "accelerate")
    import json

    # GPUs are numbered per machine, the CPU skipped (here the plan leaves it idle: NOTE [accelerate's cpu]).
    pj = plan_json(machines=("a",) * 4, types_=("a100-80g", "cpu", "t4-16g", "t4-16g"))
    pj["layers"].update(devices=["a/0", "a/2", "a/3"], stage_of_layer=[0, 0, 0, 0, 1, 1, 1, 2, 2],
                        rounded_stage_us=[100.0, 102.0, 103.0])
    dmap = json.loads(export_text(pj, "accelerate").text)
    assert dmap["wte"] == 0 and dmap["blocks.2"] == 1 and dmap["lm_head"] == 2


def test_accelerate_refuses_a_plan_that_computes_on_the_cpu_beside_gpus():
    """review22 (NOTE [accelerate's cpu]): a device_map's "cpu" beside a GPU is offloading (run on the first GPU), so
    the README's box plan ran its CPU stage on the A100 while the note said its predicted time carried over."""
    pj = plan_json(machines=("a",) * 4, types_=("a100-80g", "cpu", "t4-16g", "t4-16g"))
    with pytest.raises(HetpartError, match=r"runs blocks.2 on the CPU beside GPUs.*main_device"):
        export_text(pj, "accelerate")
    import json

    only_cpus = plan_json(machines=("a",) * 4, types_=("cpu",) * 4)  # every module on the CPU: it runs there
    exported = export_text(only_cpus, "accelerate")
    assert set(json.loads(exported.text).values()) == {"cpu"}
    assert any("one after another, not as a pipeline" in note and "added up, 406 us" in note
               for note in exported.notes)  # 100 + 101 + 102 + 103


@pytest.mark.parametrize("edit, says", [
    (lambda lp: lp["stage_of_layer"].__setitem__(0, 9), "a stage outside 0..3"),  # was an IndexError traceback
    (lambda lp: lp.__setitem__("names", lp["names"][:3]), "3 names and 9 stage_of_layer"),  # was a truncated map
    (lambda lp: lp["devices"].__setitem__(0, "zz/9"), "its devices zz/9 run no stage"),  # was a KeyError traceback
    (lambda lp: lp.__setitem__("names", 5), "TypeError"),
])
@pytest.mark.parametrize("fmt", ["torchtitan", "megatron", "deepspeed", "accelerate"])
def test_an_edited_layers_section_is_an_error_not_a_wrong_config(fmt, edit, says):
    """review22: plan.json's `layers` edited (with its sha256): DeepSpeed's `parts` came out with a stage 9 of 4
    (exit 0), fewer names than stages cut the map short, torchtitan and Megatron were tracebacks."""
    pj = plan_json(machines=("a",) * 4)
    edit(pj["layers"])
    with pytest.raises(HetpartError, match=re.escape(says)) as err:
        export_text(pj, fmt)
    assert "was edited or truncated" in str(err.value)


@pytest.mark.parametrize("fmt", ["schedule-csv", "torchtitan"])
def test_an_unknown_schedule_is_an_error_not_a_1f1b_csv(fmt):
    """review22: schedule 'zz' (plan.json edited) wrote a 1F1B CSV (schedule-csv) or a KeyError traceback (torchtitan)."""
    with pytest.raises(HetpartError, match="schedule 'zz' is not one hetpart plans"):
        export_text(plan_json(schedule="zz"), fmt)


@pytest.mark.parametrize("fmt", ["torchtitan", "megatron", "deepspeed"])
def test_a_stage_the_rounding_leaves_without_a_layer_is_named(fmt):
    """review22: a 3-stage plan whose rounding keeps 2 stages was exported as 2 stages without a word (gpt-small with
    2 blocks on mixed-4: a/0 held only parts of blocks)."""
    pj = plan_json(stage_of_layer=(0, 0, 0, 0, 1, 1, 1, 2, 2))
    pj["layers"].update(devices=["a/0", "b/0", "b/1"], rounded_stage_us=[100.0, 102.0, 103.0])
    notes = " ".join(export_text(pj, fmt).notes)
    assert "3 of the plan's 4 stages keep a whole layer: a/1 would stay idle, and the config has 3 stages" in notes
    assert "stay idle" not in " ".join(export_text(plan_json(), fmt).notes)
