"""Virtual stages under torchrun (issue 23): one plan of 4 stages on 2 CPU ranks, trained with interleaved 1F1B
and verified, then with interleaved zero bubble and a gradient broken on purpose, which --verify must catch.

Both launches share one partition (NOTE [shared launches]); the manifest checks need no launch.
"""

import json
import os
import shutil

import pytest

from hetpart.cli import main
from tests.runtime.test_emulate import _writable_cgroup
from tests.shared_runs import GPT_CPU2, cli_output

PLAN = [*GPT_CPU2, "--mode", "training", "--schedule", "interleaved-1f1b", "--virtual-stages", "2"]


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """The one partition both tests read (the second only copies it), and what it printed."""
    out = tmp_path_factory.mktemp("virtual") / "out"
    return out, cli_output(["partition", *PLAN, "--out", str(out)])


def test_interleaved_schedules_train_like_the_model_and_a_broken_gradient_fails(planned, tmp_path, capsys,
                                                                              monkeypatch):
    src, printed = planned
    out = tmp_path / "out"
    shutil.copytree(src, out)
    assert "virtual stages: 4 stages on 2 devices (2 each" in printed and "local/0: stages [0, 2]" in printed
    plan = json.loads((out / "plan.json").read_text())
    assert plan["virtual_stages"] == 2 and [s["device"] for s in plan["stages"]] == ["local/0", "local/1"] * 2
    man = json.loads((out / "manifest.json").read_text())
    assert man["world_size"] == 2 and man["mesh"]["stages"] == [[0], [1], [0], [1]]
    assert [[e["stage"], [v["stage"] for v in e["virtual_stages"]]] for e in man["ranks"]] == [[0, [2]], [1, [3]]]
    # the tied embedding and LM head: stage 0 (rank 0) and stage 3 (rank 1), summed over a weights group
    assert [g["ranks"] for g in man["mesh"]["groups"] if g["kind"] == "weights"] == [[0, 1]]

    assert main(["run", str(out), "--mode", "training", "--verify", "--measure"]) == 0  # the plan's schedule
    ran = capsys.readouterr().out
    assert "training with interleaved-1f1b" in ran and "verify: PASS" in ran and "max_weight_rel_err=" in ran
    # --measure with virtual stages: a rank's row is its stages' forwards, the timeline has each stage's actions
    measured = json.loads((out / "measured.json").read_text())
    stage_us = [s["compute_us"] for s in plan["stages"]]
    assert [r["predicted_compute_us"] for r in measured["stages"]] == pytest.approx(
        [stage_us[0] + stage_us[2], stage_us[1] + stage_us[3]], abs=0.01)
    ranks = measured["timeline"]["ranks"]
    assert [sorted({e["stage"] for e in events if e["kind"] in ("F", "B")}) for events in ranks] == [[0, 2], [1, 3]]
    links = measured["timeline"]["handoff"]["handoff_latency"]  # stage 1 -> 2 runs from rank 1 to rank 0
    assert {"0->1 fwd", "1->0 fwd", "0->1 bwd", "1->0 bwd"} <= set(links)

    # The gradient of each rank's second stage counted twice (NOTE [test-only crash hook]): only those fail.
    monkeypatch.setenv("HETPART_TEST_BREAK_GRAD_SYNC", "virtual")
    assert main(["run", str(out), "--mode", "training", "--verify", "--schedule", "interleaved-zb"]) == 1
    broken = capsys.readouterr().out
    assert "training with interleaved-zb" in broken and "verify: FAIL" in broken
    assert "max_abs_diff=0 " in broken or "max_abs_diff=" in broken.split("FAIL")[0]  # outputs are still right
    later = {w for e in man["ranks"] for v in e["virtual_stages"] for w in v["weights"]}
    first = {w for e in man["ranks"] for w in e["weights"]} - later
    failed = {line.split(" of ", 1)[1].split(" (rank")[0] for line in broken.splitlines()
              if line.startswith("  gradient of ") and line.endswith("FAIL")}
    assert failed and failed <= later and not failed & first, (failed, later)


def test_virtual_stage_manifests_are_checked_before_anything_runs(planned, tmp_path, capsys):
    out = planned[0]
    assert main(["run", str(out), "--schedule", "gpipe"]) == 2  # one stage per rank: refused, with what to do
    assert "run with --schedule interleaved-1f1b or interleaved-zb" in capsys.readouterr().err
    assert main(["run", str(out), "--schedule", "interleaved-1f1b", "--microbatches", "5", "--batch-size", "10"]) == 2
    assert "multiple of" in capsys.readouterr().err  # torch's rounds rule, before torchrun starts

    edited = tmp_path / "edited"
    shutil.copytree(out, edited)
    man = json.loads((edited / "manifest.json").read_text())
    man["mesh"]["stages"] = [[0], [1], [1], [0]]  # stage 2 moved to rank 1
    (edited / "manifest.json").write_text(json.dumps(man))
    assert main(["run", str(edited)]) == 2
    assert "mesh.stages must give stage k of 4 to rank k mod 2" in capsys.readouterr().err

    tampered = tmp_path / "tampered"
    shutil.copytree(out, tampered)
    with open(tampered / "rank3" / "stage.py", "a") as f:  # a virtual stage's code, run by rank 1
        f.write("\n# edited\n")
    assert main(["run", str(tampered)]) == 2
    assert "rank3/stage.py' does not match its sha256" in capsys.readouterr().err


@pytest.mark.skipif(_writable_cgroup() is not None, reason=f"cgroups are not writable here: {_writable_cgroup()}")
def test_an_emulated_virtual_stage_plan_throttles_each_rank_once_and_verifies(planned, tmp_path, capsys):
    # NOTE [emulated devices]: one slot per rank (2), not per stage (4); the run still trains like the model.
    from pathlib import Path

    out = tmp_path / "out"
    shutil.copytree(planned[0], out)
    assert main(["run", str(out), "--mode", "training", "--verify", "--emulate"]) == 0
    ran = capsys.readouterr().out
    assert "emulating 2 device(s)" in ran and "rank 1 (local/1, cpu)" in ran and "rank 2" not in ran
    assert "training with interleaved-1f1b" in ran and "verify: PASS" in ran
    mine = f"hetpart-emulate-{os.getpid()}-rank*"  # this process launched the run (another test's may be running)
    assert not [p for root in (Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup")) for p in root.glob(mine)]


def test_zero_bubble_trains_a_stage_whose_input_depends_on_no_weight():
    """OwnOutputs (NOTE in its docstring): a stage that holds only the model's input sends it on requiring grad,
    so the next stage's split backward (torch's own input and weight steps, no launch) finds its weights; a
    plain copy requires no grad and its weights got no gradient (zoo:mlp's interleaved plan on cpu-4)."""
    import torch
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

    from hetpart.runtime.schedules import OwnOutputs

    class PassOn(torch.nn.Module):
        def forward(self, x: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x, ids

    x, ids = OwnOutputs(PassOn())(torch.randn(4, 8), torch.arange(4))
    assert x.requires_grad and not ids.requires_grad  # integers never do
    with torch.no_grad():
        assert not OwnOutputs(PassOn())(torch.randn(4, 8), torch.arange(4))[0].requires_grad
    linear = torch.nn.Linear(8, 3)
    out = linear(x)
    _, groups = stage_backward_input([out], [torch.ones_like(out)], [x], iter(linear.parameters()))
    stage_backward_weight(iter(linear.parameters()), groups)
    assert linear.weight.grad is not None and torch.allclose(linear.weight.grad, torch.ones(3, 4) @ x.detach())
    assert torch.allclose(linear.bias.grad, torch.full((3,), 4.0))


def test_replan_refuses_a_virtual_stage_plan_clearly(planned, tmp_path, capsys):
    # NOTE [re-plan of tensor-parallel plans] says why; the checkpoint still resumes into a plan made from scratch.
    out, _ = planned
    assert main(["replan", str(out), "--lose", "local/1", "--out", str(tmp_path / "new")]) == 2
    err = capsys.readouterr().err
    assert "runs 2 virtual stages per device (an interleaved schedule), which `hetpart replan` does not re-plan" in err
    assert "partition from scratch for the new cluster; `run --resume` reads this checkpoint into it" in err
    assert not (tmp_path / "new").exists()
