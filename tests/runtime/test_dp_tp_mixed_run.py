"""Data-parallel pipelines at different tensor-parallel degrees under one torchrun (NOTE [mixed-degree gradient sync]
in partitioner/tp_sync.py, NOTE [mixed-degree pipelines mesh] in codegen/tp.py).

Machine a of 4 CPU devices at TP 2, machine b of 2 at TP 1, each device of 1.5 MiB so that no one slot holds the
model: `--pipelines a/0..a/3;b/0,b/1 --tensor-parallel a=2` runs zoo:gpt-small (2 layers) as one pipeline of two
TP-2 stages and one of two TP-1 stages (6 ranks). Every split weight's gradient is summed slice by slice (a TP-1
rank joins both slices' groups, a TP-2 rank one), every replicated one over every holder with each TP-2 copy
halved; it trains 2 steps of 1F1B and infers equal to the model (outputs, loss, every gathered gradient and updated
weight, rtol 1e-5), and fails `--verify` with the halving left out. `hetpart replan` refuses it (exit 2, NOTE [re-plan
of tensor-parallel pipelines] in replan_tp.py); its checkpoint resumes on a new partition equal to 4 model steps.
An edited mesh is refused before any rank starts. (preset:cpu-8 is one machine, whose devices take one degree:
hence the two machines here.)
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
       "--schedule", "1f1b", "--tensor-parallel", "a=2"]


def _cluster(path, b=2):
    dev = '{type = "cpu", mem = "1.5 MiB"}'
    path.write_text("[network]\nbandwidth_GBps = 1\nlatency_us = 50\n" + "".join(
        f'[[nodes]]\nname = "{m}"\ndevices = [{", ".join([dev] * n)}]\nlink = {{ bandwidth_GBps = 2, latency_us = 20 }}\n'
        for m, n in (("a", 4), ("b", b))))
    return path


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    root = tmp_path_factory.mktemp("dptpmix")
    out = root / "gpt"
    assert main(["partition", *GPT, "--cluster", str(_cluster(root / "two.toml")), "--out", str(out),
                 "--pipelines", "a/0,a/1,a/2,a/3;b/0,b/1", "--pipeline-microbatches", "2,2"]) == 0
    return out


def _shapes(path) -> dict[str, list[int]]:
    with safe_open(str(path), "pt") as f:
        return {k: list(f.get_slice(k).get_shape()) for k in f.keys()}


def test_the_mesh_sums_each_slice_over_the_ranks_holding_it(mixed):
    man = json.loads((mixed / "manifest.json").read_text())
    mesh = man["mesh"]
    assert man["format_version"] == 3 and mesh["tp_boundaries"] == "leaders" and man["world_size"] == 6
    assert [(q["group"], q["stages"]) for q in mesh["pipelines"]] == [("pipeline-0", [[0, 1], [2, 3]]),
                                                                      ("pipeline-1", [[4], [5]])]
    assert [(e["pipeline"], e["degree"], e["group"]) for e in mesh["tensor_parallel"]] == [
        (0, 2, "tp-0-0"), (0, 2, "tp-0-1"), (1, 1, None), (1, 1, None)]
    weights = [g for g in mesh["groups"] if g["kind"] == "weights"]
    by_weight: dict[str, list[tuple[list[int], dict | None]]] = {}
    for g in weights:
        for w in g["weights"]:
            by_weight.setdefault(w, []).append((g["ranks"], g["slices"].get(w)))
    # A split weight: slice j of 2 over TP-2 rank j and the TP-1 rank holding it whole.
    assert by_weight["blocks.0.attn.qkv.weight"] == [
        ([0, 4], {"index": 0, "of": 2, "dim": 0, "chunks": 3}), ([1, 4], {"index": 1, "of": 2, "dim": 0, "chunks": 3})]
    assert by_weight["blocks.1.mlp.proj.weight"] == [
        ([2, 5], {"index": 0, "of": 2, "dim": 1, "chunks": 1}), ([3, 5], {"index": 1, "of": 2, "dim": 1, "chunks": 1})]
    # A replicated one: every holder at once (the tied embedding and LM head: all six ranks).
    assert by_weight["blocks.0.ln_1.weight"] == [([0, 1, 4], None)]
    assert by_weight["lm_head.weight"] == [([0, 1, 2, 3, 4, 5], None)]
    # Every weight two stages hold is summed; TP-2 ranks hold half of each split weight, TP-1 ranks the whole.
    holders: dict[str, set[int]] = {}
    for r in man["ranks"]:
        for w in r["weights"]:
            holders.setdefault(w, set()).add(r["pipeline"])
    assert {w for w, ps in holders.items() if len(ps) > 1} == set(by_weight)
    qkv = {r["rank"]: _shapes(mixed / r["dir"] / "weights.safetensors").get("blocks.0.attn.qkv.weight")
           for r in man["ranks"]}
    assert qkv == {0: [96, 64], 1: [96, 64], 2: None, 3: None, 4: [192, 64], 5: None}


def test_pipelines_of_tp2_and_tp1_stages_train_1f1b_infer_and_resume_on_a_new_partition(mixed, tmp_path, capsys):
    ck, new = tmp_path / "ck", tmp_path / "new"
    assert main(["run", str(mixed), "--mode", "training", "--schedule", "1f1b", "--steps", "2", "--verify",
                 "--checkpoint-every", "2", "--checkpoint-dir", str(ck)]) == 0
    out = capsys.readouterr().out
    assert "2 pipelines (2 + 2 stages, 2 + 2 microbatches): 6 rank(s)" in out and "verify: PASS" in out
    assert "max_weight_rel_err" in out and "max_grad_rel_err" in out
    assert main(["run", str(mixed), "--mode", "inference", "--verify"]) == 0
    assert "verify: PASS" in capsys.readouterr().out
    # b/1 lost: what `replan` advises (NOTE [re-plan of tensor-parallel pipelines]) -- partition for the devices
    # left, resume -- equals 4 steps of the model; the checkpoint's TP-1 wholes and TP-2 slices read into TP 2.
    assert main(["partition", *GPT, "--cluster", str(_cluster(tmp_path / "lost.toml", b=1)), "--out", str(new),
                 "--pipelines", "a/0,a/1;a/2,a/3", "--pipeline-microbatches", "2,2"]) == 0
    capsys.readouterr()
    assert main(["run", str(new), "--mode", "training", "--schedule", "1f1b", "--steps", "2", "--resume", str(ck),
                 "--verify"]) == 0
    ran = capsys.readouterr().out
    assert "after step 2" in ran and "4 rank(s)" in ran and "verify: PASS" in ran and "max_weight_rel_err=" in ran


def test_replan_refuses_pipelines_of_mixed_degrees_and_says_what_to_do(mixed, tmp_path, capsys):
    assert main(["replan", str(mixed), "--lose", "b/1", "--out", str(tmp_path / "new")]) == 2
    err = capsys.readouterr().err
    assert f"{mixed} runs data-parallel pipelines planned over tensor-parallel slots of degrees [1, 2]" in err, err
    assert "does not re-plan" in err and "partition the model again for the new cluster" in err and "--resume" in err
    assert "Traceback" not in err and not (tmp_path / "new").exists()
    # After a rank dies, `run` advises the same (a partition, then --resume), not the replan command.
    from hetpart.runtime.artifacts import read_plan
    from hetpart.runtime.launch import _not_replanned

    man = load_manifest(mixed)
    assert _not_replanned(read_plan(mixed, man), man) == "data-parallel pipelines at different tensor-parallel degrees"


def test_replicated_copies_not_divided_by_their_degree_fail_verify(mixed, monkeypatch, capsys):
    monkeypatch.setenv("HETPART_TEST_BREAK_GRAD_SYNC", "degree")  # NOTE [test-only crash hook] in worker.py
    assert main(["run", str(mixed), "--mode", "training", "--schedule", "1f1b", "--steps", "1", "--verify"]) == 1
    out = capsys.readouterr().out
    assert "verify: FAIL" in out


def _swap_slices(m):  # slice 0 of blocks.0's split weights summed with TP rank 1's part, slice 1 with rank 0's
    g = next(g for g in m["mesh"]["groups"] if g["kind"] == "weights" and g["ranks"] == [0, 4])
    h = next(g for g in m["mesh"]["groups"] if g["kind"] == "weights" and g["ranks"] == [1, 4])
    g["ranks"], h["ranks"] = [1, 4], [0, 4]
    m["mesh"]["rank_groups"] = [[x["name"] for x in m["mesh"]["groups"] if r in x["ranks"]] for r in range(6)]


def _drop_copy(m):  # a TP-2 rank's copy of a norm left out of its sum
    g = next(g for g in m["mesh"]["groups"] if g["kind"] == "weights" and g["ranks"] == [0, 1, 4])
    g["ranks"] = [0, 4]
    m["mesh"]["rank_groups"] = [[x["name"] for x in m["mesh"]["groups"] if r in x["ranks"]] for r in range(6)]


@pytest.mark.parametrize("edit, message", [
    (_swap_slices, r"the weights group of ranks \[0, 4\] must sum \['blocks.0.attn.proj.weight'"),
    (_drop_copy, r"the weights group of ranks \[0, 1, 4\] must sum \['blocks.0.attn.proj.bias'"),
    (lambda m: m["mesh"]["groups"][0].update(ranks=[0, 3]), r"needs pipeline-0 holding ranks \[0, 2\]"),
])
def test_an_edited_mesh_is_refused(mixed, tmp_path, edit, message):
    with pytest.raises(HetpartError, match=message):
        load_manifest(edited_copy(mixed, tmp_path / "bad", edit))


def test_parallel_data_searches_pipelines_at_the_given_degrees(tmp_path, capsys):
    out = tmp_path / "gpt"
    assert main(["partition", *GPT, "--cluster", str(_cluster(tmp_path / "two.toml")), "--out", str(out),
                 "--parallel", "data", "--time-limit", "20"]) == 0
    plan = json.loads((out / "plan.json").read_text())
    degrees = {len(s["devices"]) for q in plan["pipelines"] for s in q["stages"]}
    assert plan["grad_sync_us"] > 0 and degrees <= {1, 2}
    man = json.loads((out / "manifest.json").read_text())
    assert (man["format_version"] == 3) == (len(degrees) > 1)  # leaders where the degrees differ
