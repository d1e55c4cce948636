"""Two data-parallel pipelines of 1 and 2 stages under one torchrun (issue 19): train 2 steps, infer, verify, break the sync.

The one torchrun-based test of the data-parallel pipelines; the fast ones are tests/test_pipelines_units.py.
"""

import json

from hetpart.cli import main

# A GPT whose blocks cost enough against the loopback link that the 2-device group plans 2 stages; 3 ranks
# (not the README's 2 + 3) keep the two launches affordable.
MODEL = ["zoo:gpt-small", "--set", "n_layer=4", "--set", "n_embd=128", "--set", "vocab_size=256",
         "--set", "block_size=16", "--batch-size", "24", "--seq-len", "16", "--microbatches", "12"]
GROUPS = "local/0;local/1,local/2"


def test_two_pipelines_train_two_steps_equal_to_the_model_and_a_broken_sync_fails(tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    assert main(["partition", *MODEL, "--cluster", "preset:cpu-6", "--mode", "training", "--pipelines", GROUPS,
                 "--out", str(out), "--no-pt2"]) == 0
    printed = capsys.readouterr().out
    assert "2 data-parallel pipelines" in printed
    assert "idle: local/3, local/4, local/5: not in any group of --pipelines" in printed
    plan = json.loads((out / "plan.json").read_text())
    assert [[s["device"] for s in q["stages"]] for q in plan["pipelines"]] == [["local/0"], ["local/1", "local/2"]]
    shares = [q["microbatches"] for q in plan["pipelines"]]
    assert sum(shares) == 12 and shares[0] < shares[1], "the faster (2-stage) pipeline gets more of the batch"
    assert plan["iteration_us"] >= max(q["time_us"] for q in plan["pipelines"]) + plan["grad_sync_us"] - 1e-3
    man = json.loads((out / "manifest.json").read_text())
    # ranks pipeline-major; every weight's group is every rank holding it, read back from the ranks' own lists
    assert [(r["planned_device"], r["pipeline"], r["stage"]) for r in man["ranks"]] == [
        ("local/0", 0, 0), ("local/1", 1, 0), ("local/2", 1, 1)]
    holders: dict[str, list[int]] = {}
    for r in man["ranks"]:
        for w in r["weights"]:
            holders.setdefault(w, []).append(r["rank"])
    grouped = {w: g["ranks"] for g in man["mesh"]["groups"] if g["kind"] == "weights" for w in g["weights"]}
    assert grouped == holders and all(len({man["ranks"][r]["pipeline"] for r in rs}) == 2 for rs in holders.values())
    assert "--nproc-per-node 3" in (out / "launch.sh").read_text()
    assert main(["inspect", str(out), "--stage", "2"]) == 0  # --stage K names rank K
    assert capsys.readouterr().out.startswith("# rank 2, stage 1 of pipeline 1: planned on local/2")
    assert main(["run", str(out), "--microbatches", "6"]) == 2  # the split is the plan's: refused before torchrun
    assert f"this plan's 2 pipelines split the batch into 12 microbatches ({shares[0]} + {shares[1]})" in (
        capsys.readouterr().err)

    assert main(["run", str(out), "--mode", "training", "--steps", "2", "--verify"]) == 0
    ran = capsys.readouterr().out
    assert "of 2 pipelines (1 + 2 stages" in ran and "verify: PASS" in ran
    assert "max_weight_rel_err=" in ran and "max_loss_rel_err=" in ran
    # Inference on the same artifacts: each pipeline's rows of the batch, put back in order, equal the model's.
    assert main(["run", str(out), "--mode", "inference", "--verify"]) == 0
    ran = capsys.readouterr().out
    assert "verify: PASS" in ran and "outputs: 24x16x256" in ran

    # Each pipeline's own mean instead of the global batch's (NOTE [pipelines gradients]): --verify must fail.
    monkeypatch.setenv("HETPART_TEST_BREAK_GRAD_SYNC", "scale")
    assert main(["run", str(out), "--mode", "training", "--verify"]) == 1
    broken = capsys.readouterr().out
    assert "verify: FAIL" in broken and "max_abs_diff=0 " in broken  # the first step's outputs are still right
    assert "  gradient of " in broken and "weight after the last step of " in broken
