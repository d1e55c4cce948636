"""Issue 21 on data-parallel pipelines of tensor-parallel stages (NOTE [re-plan of tensor-parallel pipelines] in
hetpart/replan_tp.py): zoo:gpt-small as 2 pipelines of one TP-2 stage on preset:cpu-4 trains 2 steps with a
checkpoint, local/3 is lost (and with it pipeline 1's group local/2+local/3), `hetpart replan` re-splits the batch
onto the surviving pipeline, and 2 steps resumed from the checkpoint with --verify equal 4 uninterrupted steps of
the unpartitioned model (loss, gradients, weights; rtol 1e-5). The new ranks read their shards from the old
ranks' checkpoint slices (NOTE [checkpoint slices]). The re-plan's units: tests/test_replan_dp_tp.py.
"""

from __future__ import annotations

import json

from hetpart.cli import main

GPT = ["zoo:gpt-small", "--set", "n_layer=2", "--set", "n_embd=64", "--set", "vocab_size=128", "--set", "block_size=32",
       "--batch-size", "8", "--seq-len", "16", "--microbatches", "4", "--no-pt2", "--mode", "training",
       "--schedule", "1f1b", "--tensor-parallel", "2", "--cluster", "preset:cpu-4"]


def test_two_tp2_pipelines_lose_a_device_replan_and_resume_match_four_steps(tmp_path, capsys):
    old, new, ck = tmp_path / "old", tmp_path / "new", tmp_path / "ck"
    assert main(["partition", *GPT, "--pipelines", "local/0,local/1;local/2,local/3", "--out", str(old)]) == 0
    assert main(["run", str(old), "--mode", "training", "--schedule", "1f1b", "--steps", "2", "--checkpoint-every",
                 "2", "--checkpoint-dir", str(ck)]) == 0
    assert "of 2 pipelines (1 + 1 stages, 2 + 2 microbatches): 4 rank(s)" in capsys.readouterr().out

    assert main(["replan", str(old), "--lose", "local/3", "--out", str(new)]) == 0
    out = capsys.readouterr().out
    assert "tensor parallel 2 kept: 1 group(s) of the new cluster (local/0+local/1)" in out, out
    record = json.loads((new / "plan.json").read_text())["replan"]
    assert record["kind"] == "pipelines" and record["lost"] == ["local/3"]
    # The batch re-split: pipeline 0 kept as it was, running all 4 microbatches (local/2 is in no TP-2 group).
    assert "re-split: kept 0" in [c["name"] for c in record["candidates"]], record["candidates"]
    assert record["chosen"]["pipelines"] == [{"devices": ["local/0+local/1"], "microbatches": 4,
                                              "how": record["chosen"]["pipelines"][0]["how"]}]
    assert (record["chosen"]["between_machines_bytes"], record["chosen"]["within_machines_bytes"],
            record["chosen"]["from_checkpoint_bytes"]) == (0, 0, 0)  # its ranks hold their shards already
    man = json.loads((new / "manifest.json").read_text())
    assert [(e["planned_device"], e["tp"]["rank"]) for e in man["ranks"]] == [("local/0", 0), ("local/1", 1)]

    assert main(["run", str(new), "--mode", "training", "--schedule", "1f1b", "--steps", "2", "--resume", str(ck),
                 "--verify"]) == 0
    ran = capsys.readouterr().out
    assert "resuming from" in ran and "after step 2" in ran and "2 rank(s)" in ran
    assert "verify: PASS" in ran and "max_grad_rel_err=" in ran and "max_weight_rel_err=" in ran, ran
