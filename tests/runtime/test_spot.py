"""Issue 21's CPU done-when: train on 4 ranks with checkpoints, lose a rank mid-run, re-plan onto the 3 devices
left with the commands `hetpart run` prints, resume, and match 4 uninterrupted steps of the unpartitioned model.

Two torchrun launches: the 4-rank run that dies in step 3 (rank 2 SIGKILLed after its 9th forward, by
NOTE [test-only crash hook] in hetpart/runtime/worker.py) after its checkpoint of step 2, and the 3-rank
resume with --verify (loss and weights against the model trained 4 steps from the same initial weights).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

from hetpart.cli import main

MLP4 = ["zoo:mlp", "--set", "hidden=384", "--set", "n_blocks=4", "--batch-size", "64", "--microbatches", "4",
        "--no-pt2", "--mode", "training", "--cluster", "preset:cpu-4"]


def test_lose_a_rank_replan_onto_three_and_resume_matches_four_steps(tmp_path, monkeypatch, capsys):
    old, ck = tmp_path / "mlp", tmp_path / "ck"
    assert main(["partition", *MLP4, "--out", str(old)]) == 0
    assert len(json.loads((old / "plan.json").read_text())["stages"]) == 4
    capsys.readouterr()
    monkeypatch.setenv("HETPART_TEST_CRASH_RANK", "2")
    # The first forward of step 3: pipelining runs one forward to infer shapes, then 4 microbatches a step.
    monkeypatch.setenv("HETPART_TEST_CRASH_AFTER", "10")
    assert main(["run", str(old), "--mode", "training", "--steps", "4", "--checkpoint-every", "2",
                 "--checkpoint-dir", str(ck)]) == 1
    err = capsys.readouterr().err
    monkeypatch.delenv("HETPART_TEST_CRASH_RANK")
    assert "rank 2 (stage 2 on local/2) was killed by SIGKILL" in err, err
    assert f"the last complete checkpoint is {ck / 'step-000002'} (step 2)" in err, err
    assert sorted(p.name for p in ck.iterdir()) == ["step-000002"]  # no partial step 4: it never started
    commands = err.rsplit("train the 2 step(s) left:\n", 1)[1].strip().splitlines()[0].strip()
    replan, run = (shlex.split(c) for c in commands.split(" && "))
    assert replan[:2] == ["hetpart", "replan"] and "--lose" in replan and replan[replan.index("--lose") + 1] == "local/2"
    assert run[:2] == ["hetpart", "run"] and run[run.index("--resume") + 1] == str(ck / "step-000002")

    # The printed commands, as printed (run with --verify added).
    assert main(replan[1:]) == 0
    out = capsys.readouterr().out
    new = Path(replan[replan.index("--out") + 1])
    record = json.loads((new / "plan.json").read_text())["replan"]
    assert record["lost"] == ["local/2"] and len(record["chosen"]["devices"]) <= 3
    assert "local/2" not in record["chosen"]["devices"]
    assert re.search(r"re-planned in [\d.]+ s from the stored analysis \(no trace\); lost: local/2", out), out
    # Only the lost rank's state comes from the checkpoint; nothing moves between the survivors' devices
    # that the from-scratch plan would not move too.
    assert record["chosen"]["within_machines_bytes"] <= record["from_scratch"]["within_machines_bytes"]
    assert record["chosen"]["from_checkpoint_bytes"] > 0
    # Counted from the checkpoint the printed command names (`--checkpoint`, spot21b): the lost rank's tensors, SGD's
    # (no optimizer state), byte for byte; the plan's 8 B/param of Adam state counted 3x that.
    lost = ck / "step-000002" / "rank2.safetensors"
    with lost.open("rb") as f:
        header = int.from_bytes(f.read(8), "little")
    assert record["chosen"]["from_checkpoint_bytes"] == lost.stat().st_size - 8 - header
    assert record["bytes_counted"]["from"] == "checkpoint" and record["bytes_counted"]["optimizer"] == "SGD"
    assert main([*run[1:], "--verify"]) == 0
    out = capsys.readouterr().out
    assert "resuming from" in out and "after step 2" in out
    assert "verify: PASS" in out, out
    assert sorted(p.name for p in ck.iterdir()) == ["step-000002", "step-000004"]

    # A tampered checkpoint is refused before anything runs, with exit status 2.
    bad = tmp_path / "bad"
    shutil.copytree(ck / "step-000002", bad)
    data = bytearray((bad / "rank1.safetensors").read_bytes())
    data[-1] ^= 1
    (bad / "rank1.safetensors").write_bytes(bytes(data))
    assert main(["run", str(new), "--mode", "training", "--resume", str(bad), "--steps", "1"]) == 2
    refused = capsys.readouterr()
    assert "'rank1.safetensors' has sha256" in refused.err and "resume from another checkpoint" in refused.err
    assert "launching" not in refused.out  # refused before any rank started
