"""plan.json as a typed record: written once, read back by one loader that checks every field (NOTE [plan.json fields])."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from hetpart.errors import HetpartError
from hetpart.plan_report import PlanReport, StageReport, load_plan

PATH = Path("art/plan.json")


def _plan_json(stages: int = 2) -> dict:
    """plan.json's contents as `partition` writes them (the fields every reader needs, and some optional ones)."""
    return {
        "format_version": 1, "hetpart_version": "0.0",
        "model": {"model": "zoo:toy", "overrides": {"hidden": 8}, "batch_size": 4, "seq_len": 8, "seed": 0},
        "cluster": {"name": "toy", "devices": [{"name": f"m/{k}", "type": "t4", "machine": "m", "mem_bytes": 1 << 30}
                                               for k in range(stages)]},
        "mode": "training", "schedule": "1f1b", "objective": "throughput", "microbatches": 4, "microbatch_size": 1,
        "bottleneck_us": 12.5, "lower_bound_us": 12, "gap": 0.04, "solver_status": "FEASIBLE", "certificate": None,
        "predicted_samples_per_s": 80000.0,
        "stages": [{"index": k, "device": f"m/{k}", "device_type": "t4", "machine": "m", "slot": f"m/{k}",
                    "devices": [f"m/{k}"], "node_count": 3, "flops": 10**9, "param_bytes": 64,
                    "predicted_time_us": 12.5 - k, "compute_us": 10.0 - k, "comm_in_us": float(k), "comm_out_us": 0.5,
                    "memory_bytes": 3 << 20, "capacity_bytes": 1 << 30, "forward_us": 3.0, "backward_us": 7.0 - k}
                   for k in range(stages)],
        "weights": "included", "dynamic": {"batch": True, "seq_len": False, "why": None}, "outputs": None,
        "optimizer_bytes_per_param": 8, "baselines": [{"name": "equal-layers", "bottleneck_us": 20.0}], "bounds": None,
        "strategy": "optimal", "emulation": {"type_model_us": {"t4": 20.0}, "profiled_types": []},
        "align": "ops", "layers": None,
    }


def test_plan_json_reads_back_as_it_was_written():
    data = _plan_json()
    plan = load_plan(PATH, data)
    assert plan.stages[1].backward_us == 6.0 and plan.stages[1].slot_devices == ["m/1"]
    assert plan.cluster.devices[0].type == "t4" and plan.model.overrides == {"hidden": 8}
    assert plan.training and plan.share_of_bottleneck(plan.stages[1]) == pytest.approx(11.5 / 12.5)
    assert json.dumps(plan.to_json()) == json.dumps(data), "same keys, same order, same values"


def test_optional_fields_of_older_plans_take_their_defaults_and_stay_out_of_the_json():
    data = _plan_json(1)
    for key in ("mode", "schedule", "weights", "dynamic", "optimizer_bytes_per_param", "baselines", "strategy",
                "emulation", "align", "layers"):
        del data[key]
    for key in ("slot", "devices", "forward_us", "backward_us", "param_bytes", "machine"):
        del data["stages"][0][key]
    plan = load_plan(PATH, data)
    assert (plan.mode, plan.schedule, plan.weights, plan.dynamic, plan.baselines, plan.strategy, plan.emulation) == (
        "inference", "gpipe", "included", None, [], "optimal", None)
    stage = plan.stages[0]
    assert stage.slot is None and stage.slot_devices == ["m/0"] and stage.param_bytes == 0
    written = plan.to_json()
    assert "optimizer_bytes_per_param" not in written and "forward_us" not in written["stages"][0]


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d.pop("stages"), "art/plan.json: 'stages' is missing or not a list (got None)"),
    (lambda d: d["stages"][0].update(compute_us="fast"), "stages[0].'compute_us' is missing or not a number (got 'fast')"),
    (lambda d: d["stages"][1].update(flops=True), "stages[1].'flops' is missing or not a number (got True)"),
    (lambda d: d.update(microbatches=4.0), "'microbatches' is missing or not a int (got 4.0)"),
    (lambda d: d["model"].pop("seed"), "model.'seed' is missing or not a int (got None)"),
    (lambda d: d["cluster"]["devices"][0].update(mem_bytes="1G"), "cluster.devices[0].'mem_bytes' is missing"),
    (lambda d: d.update(stages=[]), "'stages' is empty"),
    (lambda d: d["stages"][1].update(index=0), "stages[1].'index' is 0, expected 1"),
    (lambda d: d["stages"][0].update(devices=[3]), "stages[0].'devices' must be device names"),
    (lambda d: d.update(dynamic=[]), "'dynamic' is missing or not a dict or null (got [])"),
    (lambda d: d.update(model="zoo:toy"), "'model' is missing or not a dict (got 'zoo:toy')"),
    (lambda d: d["stages"].append("x"), "stages[2] must be an object"),
    # review22: 0 microbatches was read, and `export --format schedule-csv` wrote an empty CSV (exit 0)
    (lambda d: d.update(microbatches=0), "'microbatches' is 0, expected 1 or more"),
    (lambda d: d.update(microbatch_size=-2), "'microbatch_size' is -2, expected 1 or more"),
    # review22: an edited schedule was "simulate: unknown schedule 'zz'" naming no file; an edited mode read as inference
    (lambda d: d.update(schedule="zz"),
     "art/plan.json: 'schedule' is 'zz', expected one of gpipe, 1f1b, interleaved-1f1b, interleaved-zb"),
    (lambda d: d.update(mode="train"), "art/plan.json: 'mode' is 'train', expected one of inference, training"),
])
def test_a_hand_edited_plan_is_refused_naming_the_field(edit, message):
    data = _plan_json()
    edit(data)
    with pytest.raises(HetpartError, match="the plan was edited or truncated|re-run") as err:
        load_plan(PATH, data)
    assert message in str(err.value)


def test_the_plan_s_schedule_words_are_the_partitioner_s():
    """plan_report.py names the schedules again (it imports nothing above it): the same words, in the same order."""
    from hetpart.partitioner.problem import SCHEDULES
    from hetpart.plan_report import PLAN_SCHEDULES

    assert PLAN_SCHEDULES == SCHEDULES


def test_every_field_has_a_json_type():
    """A field without one would be read unchecked: `load_plan` reads exactly the dataclass fields."""
    for cls in (PlanReport, StageReport):
        for f in dataclasses.fields(cls):
            assert f.metadata.get("kind") is not None, f"{cls.__name__}.{f.name}"


@pytest.mark.parametrize("rate, shown", [(80000.0, "80,000"), (2.8695, "2.87"), (0.6024, "0.602"), (10.24, "10.2")])
def test_the_summary_line_prints_a_small_throughput_to_three_figures(rate, shown):
    """review22: "{:,.0f}" printed a Llama-7B plan's 0.602 samples/s as "1" (and Llama-70B's 2.87 as "3")."""
    from hetpart.report.table import plan_summary

    data = _plan_json()
    data["predicted_samples_per_s"] = rate
    assert f"throughput {shown} samples/s  |" in plan_summary(load_plan(PATH, data))
