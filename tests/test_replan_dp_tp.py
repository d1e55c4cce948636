"""`hetpart replan` of data-parallel pipelines of tensor-parallel stages (NOTE [re-plan of tensor-parallel pipelines]
in hetpart/replan_tp.py), without a run: zoo:gpt-small as 2 pipelines x 2 stages x TP 2 on preset:cpu-8 loses
local/7, whose group local/6+local/7 goes with it; the re-plan is over the TP-2 slots left (pipeline 0's kept by
name, local/6 in none), every candidate's bytes are counted per shard and checked here from the old manifest's
ranks by an independent sum, and a cluster with no whole TP-2 group left is refused (exit 2, nothing written).
The run of a re-plan (resume, --verify): tests/runtime/test_replan_dp_tp_run.py.
"""

from __future__ import annotations

import json

import pytest

from hetpart.cli import main
from hetpart.partitioner.problem_json import problem_from_json
from hetpart.partitioner.replan import state_to_move_bytes

GPT = ["zoo:gpt-small", "--set", "n_layer=2", "--set", "n_embd=64", "--set", "vocab_size=128", "--set", "block_size=32",
       "--batch-size", "8", "--seq-len", "16", "--microbatches", "4", "--no-pt2", "--mode", "training",
       "--schedule", "1f1b", "--tensor-parallel", "2", "--cluster", "preset:cpu-8"]
PIPELINES = "local/0,local/1,local/2,local/3;local/4,local/5,local/6,local/7"
SLOTS = [["local/0+local/1", "local/2+local/3"], ["local/4+local/5", "local/6+local/7"]]


@pytest.fixture(scope="module")
def dp_tp(tmp_path_factory):
    out = tmp_path_factory.mktemp("dptp") / "gpt"
    assert main(["partition", *GPT, "--pipelines", PIPELINES, "--out", str(out)]) == 0
    return out


def _stage_weights(manifest: dict) -> dict[tuple[int, int], set[str]]:
    """(pipeline, stage) -> the weights its ranks hold, read from the old manifest's ranks."""
    out: dict[tuple[int, int], set[str]] = {}
    for r in manifest["ranks"]:
        out.setdefault((r["pipeline"], r["stage"]), set()).update(r["weights"])
    return out


def test_losing_a_device_drops_its_group_keeps_pipeline_0_and_counts_bytes_per_shard(dp_tp, tmp_path, capsys):
    old_pipes = json.loads((dp_tp / "ir" / "pipelines.json").read_text())["pipelines"]
    assert [p["device_of_stage"] for p in old_pipes] == SLOTS
    new = tmp_path / "new"
    assert main(["replan", str(dp_tp), "--lose", "local/7", "--out", str(new), "--time-limit", "10"]) == 0
    out = capsys.readouterr().out
    assert ("tensor parallel 2 kept: 3 group(s) of the new cluster (local/0+local/1 local/2+local/3 local/4+local/5"
            .replace(" local", ", local")) in out, out
    record = json.loads((new / "plan.json").read_text())["replan"]
    assert record["kind"] == "pipelines" and record["lost"] == ["local/7"]
    names = {c["name"]: c for c in record["candidates"]}
    # NOTE [re-plan pipelines] over slots: pipeline 0 kept (all its slots survive), pipeline 1 dropped, or a one-stage
    # pipeline on the slot it has left (its repair there and a new pipeline there are one plan, listed once).
    two = [n for n in names if n.startswith("re-split: kept 0, ")]
    assert "re-split: kept 0" in names and two in (["re-split: kept 0, new (1 stages)"],
                                                    ["re-split: kept 0, 1 repaired (1 stages)"]), list(names)
    # Bytes per shard, by an independent sum over the old ranks: dropping pipeline 1 moves nothing; one stage on
    # local/4+local/5 moves, to each of its 2 ranks, its TP index's part of every weight its old stage 1 held and
    # stage 0 did not, each from local/2 or local/3 (pipeline 0's stage 1 at the same index) or local/6, all
    # within the one machine; nothing from the checkpoint (every shard has a surviving holder).
    stored = problem_from_json(json.loads((dp_tp / "ir" / "analysis.json").read_text())["problem"])
    held = _stage_weights(json.loads((dp_tp / "manifest.json").read_text()))
    moved = held[1, 1] - held[1, 0]
    assert moved and held[0, 1] == held[1, 1]
    assert (names["re-split: kept 0"]["between_machines_bytes"], names["re-split: kept 0"]["within_machines_bytes"]) \
        == (0, 0)
    repaired = names[two[0]]
    assert repaired["between_machines_bytes"] == 0
    assert repaired["within_machines_bytes"] == 2 * sum(state_to_move_bytes(stored, w) for w in moved)
    # The choice is the lexicographic best of the candidates (NOTE [lexicographic re-plan]), and it runs the batch.
    within = [c for c in record["candidates"] if c["iteration_us"] <= record["iteration_limit_us"]]
    best = min(within, key=lambda c: (c["between_machines_bytes"], c["within_machines_bytes"], c["iteration_us"]))
    chosen = record["chosen"]
    assert (best["between_machines_bytes"], best["within_machines_bytes"]) == (
        chosen["between_machines_bytes"], chosen["within_machines_bytes"])
    assert sum(q["microbatches"] for q in chosen["pipelines"]) == 4 and chosen["from_checkpoint_bytes"] == 0
    assert all("local/7" not in s for q in chosen["pipelines"] for s in q["devices"])
    # Written as `partition --parallel data --tensor-parallel 2` writes it: every stage a TP-2 group, the mesh
    # checked by load_manifest; local/6 in no group; the bound the from-scratch plan's, not claimed optimal.
    from hetpart.runtime.artifacts import load_manifest

    plan = json.loads((new / "plan.json").read_text())
    man = load_manifest(new)
    assert all(len(s["devices"]) == 2 for q in plan["pipelines"] for s in q["stages"])
    assert [r["planned_device"] for r in man["ranks"]] == [d for q in plan["pipelines"] for s in q["stages"]
                                                           for d in s["devices"]]
    assert "local/6" in plan["devices_idle"] and plan["solver_status"] != "OPTIMAL"
    assert "re-planned (NOTE [re-plan pipelines])" in plan["bound_note"]
    # the from-scratch plan's note quoted as its own (ux20: "the plan is the megatron baseline's" read as the chosen's)
    assert "the bound is the from-scratch plan's, whose own note reads \"" in plan["bound_note"]
    assert plan["lower_bound_us"] == record["from_scratch"]["lower_bound_us"]
    assert all(c["iteration_us"] >= plan["lower_bound_us"] for c in record["candidates"])  # it bounds every one


def test_a_cluster_with_no_whole_tp_group_left_is_refused(dp_tp, tmp_path, capsys):
    none = tmp_path / "none"
    lose = [a for d in range(1, 8) for a in ("--lose", f"local/{d}")]
    assert main(["replan", str(dp_tp), *lose, "--out", str(none)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hetpart: error: ") and "Traceback" not in err
    assert "no machine of the new cluster has 2 devices of one type left" in err and "can host: 1" in err, err
    assert not none.exists()
