"""Data-parallel pipelines of tensor-parallel stages under one torchrun (issues 19 and 20 composed): zoo:gpt-small
as 2 pipelines x 2 stages x TP 2 on preset:cpu-8 trains 2 steps of 1F1B equal to the model on the global batch
(outputs, loss, every gathered gradient and updated weight, rtol 1e-5); each rank holds only its shards; pipelines
of 1 and 2 TP-2 stages train GPipe and infer equal to the model too (the 6-rank plan runs the inference: its
pipelines hold one TP stage and two, the 8-rank plan's two each); a mesh edited to disagree (a
gradient group mixing shard indices, a lane or a pipeline moved) is refused with exit 2 before any rank starts
(NOTE [tensor-parallel pipelines mesh] in codegen/tp.py).
"""

import json

import pytest
from safetensors import safe_open

from hetpart.cli import main
from hetpart.errors import HetpartError
from hetpart.runtime.artifacts import load_manifest
from tests.runtime import edited_copy

GPT = ["zoo:gpt-small", "--set", "n_layer=2", "--set", "n_embd=64", "--set", "vocab_size=128", "--set", "block_size=32",
       "--batch-size", "8", "--seq-len", "16", "--microbatches", "4", "--no-pt2", "--mode", "training",
       "--schedule", "1f1b", "--tensor-parallel", "2", "--cluster", "preset:cpu-8"]
PIPELINES = "local/0,local/1,local/2,local/3;local/4,local/5,local/6,local/7"


@pytest.fixture(scope="module")
def dp_tp(tmp_path_factory):
    out = tmp_path_factory.mktemp("dptp") / "gpt"
    assert main(["partition", *GPT, "--pipelines", PIPELINES, "--out", str(out)]) == 0
    return out


def _shapes(path) -> dict[str, list[int]]:
    with safe_open(str(path), "pt") as f:
        return {k: list(f.get_slice(k).get_shape()) for k in f.keys()}


def test_inspect_names_each_rank_s_pipeline_stage_and_tp_place(dp_tp, capsys):
    assert main(["inspect", str(dp_tp), "--stage", "5"]) == 0  # --stage K names rank K
    assert capsys.readouterr().out.startswith("# rank 5, stage 0 of pipeline 1, TP rank 1 of 2: planned on "
                                              "local/4+local/5 (cpu/tp2)")
    assert main(["inspect", str(dp_tp), "--json"]) == 0
    stages = json.loads(capsys.readouterr().out)["stages"]  # each stage's row: its TP rank 0's directory
    assert [(s["pipeline"], s["index"], s["dir"]) for s in stages] == [(0, 0, "rank0"), (0, 1, "rank2"),
                                                                       (1, 0, "rank4"), (1, 1, "rank6")]
    assert [i["name"] for i in stages[1]["inputs"]] != ["idx"]  # stage 1 receives, it does not read the tokens


def test_the_mesh_places_every_rank_and_sums_each_shard_over_its_tp_index_across_pipelines(dp_tp):
    man = json.loads((dp_tp / "manifest.json").read_text())
    mesh = man["mesh"]
    assert [(q["stages"], q["lanes"], q["microbatches"]) for q in mesh["pipelines"]] == [
        ([[0, 1], [2, 3]], ["pipeline-0-tp0", "pipeline-0-tp1"], 2),
        ([[4, 5], [6, 7]], ["pipeline-1-tp0", "pipeline-1-tp1"], 2)]
    assert [(r["pipeline"], r["stage"], r["tp"]["rank"], r["batch_rows"]) for r in man["ranks"]] == [
        (p, k, j, [4 * p, 4 * p + 4]) for p in range(2) for k in range(2) for j in range(2)]
    assert [r["planned_device"] for r in man["ranks"]] == [f"local/{i}" for i in range(8)]
    # Read back from the ranks' own weight lists: every weight that several ranks of one TP index hold is summed
    # over exactly those ranks, across both pipelines (an independent route from the codegen's grouping).
    holders: dict[tuple[int, str], list[int]] = {}
    for r in man["ranks"]:
        for w in r["weights"]:
            holders.setdefault((r["tp"]["rank"], w), []).append(r["rank"])
    grouped = {(man["ranks"][g["ranks"][0]]["tp"]["rank"], w): g["ranks"]
               for g in mesh["groups"] if g["kind"] == "weights" for w in g["weights"]}
    assert grouped == {k: v for k, v in holders.items() if len(v) > 1}
    assert all(len({man["ranks"][r]["pipeline"] for r in rs}) == 2 for rs in grouped.values())
    split = {(e["pipeline"], e["stage"]): e["weights"] for e in mesh["tensor_parallel"]}
    assert split[0, 0] == split[1, 0] and split[0, 0]["blocks.0.attn.qkv.weight"] == {"dim": 0, "chunks": 3}
    # Each rank's file holds half of each split weight along its dim, never the whole tensor.
    whole = {"blocks.{b}.attn.qkv.weight": [192, 64], "blocks.{b}.attn.proj.weight": [64, 64],
             "blocks.{b}.mlp.fc.weight": [256, 64], "blocks.{b}.mlp.proj.weight": [64, 256]}
    for r in man["ranks"]:
        held, dims = _shapes(dp_tp / r["dir"] / "weights.safetensors"), split[r["pipeline"], r["stage"]]
        for name, shape in whole.items():
            name, want = name.format(b=r["stage"]), list(shape)
            want[dims[name]["dim"]] //= 2
            assert held[name] == want, (r["rank"], name)
    plan = json.loads((dp_tp / "plan.json").read_text())
    assert [[s["devices"] for s in q["stages"]] for q in plan["pipelines"]] == [
        [["local/0", "local/1"], ["local/2", "local/3"]], [["local/4", "local/5"], ["local/6", "local/7"]]]
    assert plan["devices_used"] == [f"local/{i}" for i in range(8)] and plan["devices_idle"] == {}


def _mix_shards(m):  # shard 0 of blocks.0 on pipeline 0 summed with shard 1 of it on pipeline 1
    g = next(g for g in m["mesh"]["groups"] if g["kind"] == "weights" and g["ranks"] == [0, 4])
    h = next(g for g in m["mesh"]["groups"] if g["kind"] == "weights" and g["ranks"] == [1, 5])
    g["ranks"], h["ranks"] = [0, 5], [1, 4]
    m["mesh"]["rank_groups"] = [[x["name"] for x in m["mesh"]["groups"] if r in x["ranks"]] for r in range(8)]


def _drop_group(m):  # lane 1's copies of blocks.1 never summed across the pipelines
    m["mesh"]["groups"] = [g for g in m["mesh"]["groups"] if g["ranks"] != [3, 7]]
    m["mesh"]["rank_groups"] = [[x["name"] for x in m["mesh"]["groups"] if r in x["ranks"]] for r in range(8)]


@pytest.mark.parametrize("edit, message", [
    (_mix_shards, r"weights group weights-tp0-1 must hold ranks of one TP index"),
    (_drop_group, r"'blocks.1.attn.proj.bias' at TP index 1 must be summed over one weights group of the ranks "
                  r"holding it \(\[3, 7\]\)"),
    (lambda m: m["mesh"]["groups"][1].update(ranks=[1, 7]), r"needs pipeline-0-tp1 holding ranks \[1, 3\]"),
    (lambda m: m["ranks"][5].update(pipeline=0, batch_rows=[0, 4]),
     r"ranks\[5\]\.tp must be TP rank 1 of 2 in tp-1-0, running stage 0 of pipeline 1"),
    (lambda m: m["mesh"]["tensor_parallel"][2].update(pipeline=0),
     r"mesh.tensor_parallel\[2\] must be stage 0 of pipeline 1's TP group"),
    (lambda m: m["mesh"]["pipelines"][1]["lanes"].pop(), r"pipeline lacks a lane"),
])
def test_an_edited_mesh_is_refused(dp_tp, tmp_path, edit, message):
    with pytest.raises(HetpartError, match=message):
        load_manifest(edited_copy(dp_tp, tmp_path / "bad", edit))


def test_a_gradient_group_mixing_shard_indices_stops_run_with_exit_2(dp_tp, tmp_path, capsys):
    bad = edited_copy(dp_tp, tmp_path / "bad", _mix_shards)
    assert main(["run", str(bad), "--mode", "training", "--verify"]) == 2
    err = capsys.readouterr().err
    assert "must hold ranks of one TP index" in err and "Traceback" not in err and not (bad / "logs").exists()


def test_two_pipelines_of_tp2_stages_train_1f1b_equal_to_the_model(dp_tp, capsys):
    assert main(["run", str(dp_tp), "--mode", "training", "--schedule", "1f1b", "--steps", "2", "--verify"]) == 0
    ran = capsys.readouterr().out
    assert "of 2 pipelines (2 + 2 stages, 2 + 2 microbatches): 8 rank(s)" in ran and "verify: PASS" in ran
    assert "max_grad_rel_err=" in ran and "max_weight_rel_err=" in ran and "max_loss_rel_err=" in ran


def test_pipelines_of_one_and_two_tp2_stages_train_gpipe_and_infer_equal_to_the_model(tmp_path, capsys):
    """Pipelines whose cuts do not line up: pipeline 0 one TP-2 stage, pipeline 1 two; shard j of a weight is summed
    between TP rank j of pipeline 0's stage and TP rank j of whichever stage of pipeline 1 holds it. Inference on the
    same artifacts: each pipeline's rows of the batch, through its TP stages, put back in order."""
    out = tmp_path / "out"
    args = [a if a != "1f1b" else "gpipe" for a in GPT]
    assert main(["partition", *args, "--pipelines", "local/0,local/1;local/2,local/3,local/4,local/5",
                 "--out", str(out)]) == 0
    man = json.loads((out / "manifest.json").read_text())
    assert [q["stages"] for q in man["mesh"]["pipelines"]] == [[[0, 1]], [[2, 3], [4, 5]]]
    qkv = {j: next(g["ranks"] for g in man["mesh"]["groups"]
                   if g["kind"] == "weights" and "blocks.1.attn.qkv.weight" in g["weights"]
                   and man["ranks"][g["ranks"][0]]["tp"]["rank"] == j) for j in range(2)}
    assert qkv[0][0] == 0 and qkv[1][0] == 1 and {man["ranks"][r]["pipeline"] for r in qkv[0]} == {0, 1}
    capsys.readouterr()
    assert main(["run", str(out), "--mode", "training", "--schedule", "gpipe", "--steps", "2", "--verify"]) == 0
    ran = capsys.readouterr().out
    assert "of 2 pipelines (1 + 2 stages, 2 + 2 microbatches): 6 rank(s)" in ran and "verify: PASS" in ran
    assert main(["run", str(out), "--mode", "inference", "--verify"]) == 0
    ran = capsys.readouterr().out
    assert "verify: PASS" in ran and "outputs: 8x16x128" in ran
