"""Issue 21 on tensor-parallel degrees mixed per machine (NOTE [re-plan of mixed degrees]): zoo:gpt-small planned
with `--tensor-parallel a=2` (stage 0 a TP-2 group on machine a, stage 1 on one device of machine b, which has a
spare) trains 2 steps with a checkpoint; the TP-1 rank dies in step 3; `hetpart run` prints the re-plan and resume
commands; the re-plan keeps a's group at TP 2 and moves stage 1 to b's spare device; 2 resumed steps with --verify
equal 4 uninterrupted steps of the unpartitioned model (loss, weights; rtol 1e-5).

Two torchrun launches of 3 ranks (machine a's devices of 1.1 MiB cannot hold the whole model at TP 2, so the re-plan
keeps two stages). Then a device of the TP-2 group is lost (a GPipe plan of 4 microbatches, 2 steps checkpointed):
machine a falls to TP 1, and 2 steps resumed from the shards equal 4 of the model.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from hetpart.cli import main

GPT = ["zoo:gpt-small", "--set", "n_layer=2", "--set", "n_embd=64", "--set", "vocab_size=128", "--set", "block_size=32",
       "--batch-size", "4", "--seq-len", "16", "--no-pt2", "--mode", "training"]
CLUSTER = """[network]
bandwidth_GBps = 1
latency_us = 50
[[nodes]]
name = "a"
devices = [{type = "cpu", mem = "1.1 MiB"}, {type = "cpu", mem = "1.1 MiB"}]
link = { bandwidth_GBps = 2, latency_us = 20 }
[[nodes]]
name = "b"
devices = [{type = "cpu", mem = "1 MiB"}, {type = "cpu", mem = "1 MiB"}]
link = { bandwidth_GBps = 2, latency_us = 20 }
"""


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    root = tmp_path_factory.mktemp("spotmix")
    (root / "four.toml").write_text(CLUSTER)
    old = root / "gpt"
    assert main(["partition", *GPT, "--microbatches", "2", "--schedule", "1f1b", "--cluster", str(root / "four.toml"),
                 "--out", str(old), "--tensor-parallel", "a=2"]) == 0
    plan = json.loads((old / "plan.json").read_text())
    assert [s["devices"] for s in plan["stages"]] == [["a/0", "a/1"], ["b/0"]]
    record = json.loads((old / "ir" / "analysis.json").read_text())["tensor_parallel"]
    assert record["degree_of_place"] == {"a:cpu": 2, "b:cpu": 1} and record["split"]["2"]
    return old


def test_lose_the_tp1_rank_replan_keeping_tp2_and_resume_matches_four_steps(mixed, tmp_path, monkeypatch, capsys):
    ck = tmp_path / "ck"
    capsys.readouterr()
    monkeypatch.setenv("HETPART_TEST_CRASH_RANK", "2")  # stage 1 on b/0
    # The first forward of step 3: one forward to infer shapes, then 2 microbatches a step.
    monkeypatch.setenv("HETPART_TEST_CRASH_AFTER", "6")
    assert main(["run", str(mixed), "--mode", "training", "--steps", "4", "--checkpoint-every", "2",
                 "--checkpoint-dir", str(ck)]) == 1
    err = capsys.readouterr().err
    monkeypatch.delenv("HETPART_TEST_CRASH_RANK")
    assert "rank 2 (stage 1 on b/0) was killed by SIGKILL" in err, err
    assert sorted(p.name for p in ck.iterdir()) == ["step-000002"]
    commands = err.rsplit("train the 2 step(s) left:\n", 1)[1].strip().splitlines()[0].strip()
    replan, run = (shlex.split(c) for c in commands.split(" && "))
    assert replan[:2] == ["hetpart", "replan"] and replan[replan.index("--lose") + 1] == "b/0"
    assert run[:2] == ["hetpart", "run"] and run[run.index("--resume") + 1] == str(ck / "step-000002")

    assert main(replan[1:]) == 0
    out = capsys.readouterr().out
    assert "tensor parallel per machine kept: a (cpu) TP 2, b (cpu) TP 1" in out, out
    assert re.search(r"re-planned in [\d.]+ s from the stored analysis \(no trace\); lost: b/0", out), out
    new = Path(replan[replan.index("--out") + 1])
    plan = json.loads((new / "plan.json").read_text())
    assert [s["devices"] for s in plan["stages"]] == [["a/0", "a/1"], ["b/1"]]
    chosen, scratch = plan["replan"]["chosen"], plan["replan"]["from_scratch"]
    # Stage 0 stays on its group: nothing moves there. Stage 1's weights come from the checkpoint (the lost rank's),
    # but for the tied embedding, which machine a's ranks hold and send: no more than the from-scratch plan moves.
    assert chosen["devices"] == ["a/0+a/1", "b/1"] and chosen["within_machines_bytes"] == 0
    assert 0 < chosen["between_machines_bytes"] <= scratch["between_machines_bytes"]
    assert chosen["from_checkpoint_bytes"] > 0
    assert main([*run[1:], "--verify"]) == 0
    out = capsys.readouterr().out
    assert "resuming from" in out and "after step 2" in out and "3 rank(s)" in out
    assert "verify: PASS" in out, out
    assert sorted(p.name for p in ck.iterdir()) == ["step-000002", "step-000004"]


def test_lose_a_device_of_the_tp2_group_and_machine_a_falls_to_tp1_then_resume(mixed, tmp_path, capsys):
    # 1F1B of 2 microbatches runs at most 2 stages, which a/0 and one device of b cannot hold: refused, clearly.
    assert main(["replan", str(mixed), "--lose", "a/1", "--out", str(tmp_path / "refused")]) == 2
    err = capsys.readouterr().err
    assert "re-plan of the tensor-parallel degrees per machine (a (cpu) TP 1, b (cpu) TP 1)" in err
    assert "no plan fits in memory" in err and "max_stages=2" in err, err
    # GPipe of 4 microbatches: three stages, a/0 at TP 1 beside b's two devices.
    (tmp_path / "four.toml").write_text(CLUSTER)
    old, new = tmp_path / "gpipe", tmp_path / "new"
    assert main(["partition", *GPT, "--microbatches", "4", "--schedule", "gpipe", "--cluster",
                 str(tmp_path / "four.toml"), "--out", str(old), "--tensor-parallel", "a=2"]) == 0
    capsys.readouterr()
    ck = tmp_path / "ck"
    assert main(["run", str(old), "--mode", "training", "--steps", "2", "--checkpoint-every", "2",
                 "--checkpoint-dir", str(ck)]) == 0
    capsys.readouterr()
    assert main(["replan", str(old), "--lose", "a/1", "--out", str(new)]) == 0
    out = capsys.readouterr().out
    assert "note: a:cpu runs TP 1 (was TP 2: 1 device(s) left)" in out, out
    assert "tensor parallel per machine now: a (cpu) TP 1, b (cpu) TP 1" in out, out  # not "kept"
    plan = json.loads((new / "plan.json").read_text())
    assert all(len(s["devices"]) == 1 for s in plan["stages"]) and "a/1" not in plan["replan"]["chosen"]["devices"]
    assert "a/0" in plan["replan"]["chosen"]["devices"] and plan["replan"]["chosen"]["from_checkpoint_bytes"] > 0
    assert "tensor_parallel" not in json.loads((new / "manifest.json").read_text())["mesh"]
    # Every new rank is TP 1: the old TP-2 stage's weights are assembled whole from a/0's half and the lost a/1's
    # (from the checkpoint; NOTE [checkpoint slices]), and training goes on equal to the model.
    assert main(["run", str(new), "--mode", "training", "--resume", str(ck / "step-000002"), "--steps", "2",
                 "--verify"]) == 0
    out = capsys.readouterr().out
    assert "after step 2" in out and "verify: PASS" in out, out
