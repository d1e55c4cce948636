"""NOTE [checkpoint layout] without torchrun: what a checkpoint holds, when it counts as complete, what
resume refuses, and the reference of a resumed run (N previous steps + M more)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from hetpart.errors import HetpartError
from hetpart.runtime.checkpoint import (
    CheckpointRun, complete_checkpoints, check_checkpoint_dir, check_resume, find_checkpoint, finish_checkpoint, load_rank,
    prepare_run, prune, rank_state, read_checkpoint, save_rank, weight_sources,
)
from hetpart.runtime.optimizers import OptimizerSpec
from hetpart.runtime.resume import resume_commands
from hetpart.runtime.verify import reference_training

NAMES = {"fc1.weight": "fc1.weight", "fc1.bias": "fc1.bias", "fc2.weight": "fc2.weight", "fc2.bias": "fc2.bias"}
MODEL = {"model": "zoo:mlp", "overrides": {}, "seed": 0}
DATA = {"batch_size": 8, "seq_len": 1, "seed": 0, "microbatches": 2}


def _net(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


class _Named(torch.nn.Module):
    def __init__(self, seed: int) -> None:
        super().__init__()
        net = _net(seed)
        self.fc1, self.fc2 = net[0], net[2]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(x)))


def _trained(steps: int = 2) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    module = _Named(0)
    opt = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)  # momentum: real optimizer state tensors
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
    for _ in range(steps):
        opt.zero_grad()
        module(x).square().mean().backward()
        opt.step()
    return module, opt


def _write(ck: Path, step: int, module, opt, entry=None, run: str = "t", keep: int | None = None) -> Path:
    params = list(module.parameters())
    tensors, state = rank_state(module, opt, NAMES, params)
    entry = entry or {"planned_device": "local/0", "machine": "local"}
    save_rank(ck, step, run, 0, entry, tensors, state)
    return finish_checkpoint(ck, step, run, 1, {**DATA, "samples_seen": step * 8}, MODEL, keep=keep)


def test_a_checkpoint_round_trips_weights_and_the_optimizers_state(tmp_path):
    module, opt = _trained()
    path = _write(tmp_path, 2, module, opt)
    assert path == tmp_path / "step-000002" and complete_checkpoints(tmp_path) == [path]
    manifest = json.loads((path / "checkpoint.json").read_text())
    assert manifest["step"] == 2 and manifest["data"]["samples_seen"] == 16
    assert "optimizer/fc1.weight/momentum_buffer" in open(path / "rank0.safetensors", "rb").read(4096).decode("latin1")
    fresh = _Named(5)
    fresh_opt = torch.optim.SGD(fresh.parameters(), lr=0.5)
    load_rank(read_checkpoint(path), {"rank": 0, "planned_device": "local/0", "machine": "local"}, fresh, fresh_opt,
              NAMES, list(fresh.parameters()))
    for a, b in zip(module.state_dict().values(), fresh.state_dict().values()):
        assert torch.equal(a, b)
    want, got = opt.state_dict(), fresh_opt.state_dict()
    assert got["param_groups"][0]["lr"] == 0.1 and got["param_groups"][0]["momentum"] == 0.9
    for i in want["state"]:
        assert torch.equal(want["state"][i]["momentum_buffer"], got["state"][i]["momentum_buffer"])


def test_a_tampered_checkpoint_is_refused(tmp_path):
    path = _write(tmp_path, 1, *_trained(1))
    data = bytearray((path / "rank0.safetensors").read_bytes())
    data[-2] ^= 0xFF
    (path / "rank0.safetensors").write_bytes(bytes(data))
    with pytest.raises(HetpartError, match=r"'rank0.safetensors' has sha256 .* resume from another checkpoint"):
        read_checkpoint(path)
    path = _write(tmp_path, 2, *_trained(1))
    part = json.loads((path / "rank0.json").read_text())
    part["weights"].append("extra")
    (path / "rank0.json").write_text(json.dumps(part))
    with pytest.raises(HetpartError, match="'rank0.json' has sha256"):
        read_checkpoint(path)


def test_a_partial_checkpoint_never_counts_and_pruning_keeps_foreign_files(tmp_path):
    module, opt = _trained(1)
    for step in (1, 2, 3):
        _write(tmp_path, step, module, opt)
    (tmp_path / ".step-000004.x.partial").mkdir()  # a run killed while it wrote step 4
    (tmp_path / "step-000005").mkdir()  # a folder without checkpoint.json
    (tmp_path / "step-000001" / "notes.txt").write_text("mine")  # the user's file in an old checkpoint
    assert find_checkpoint(tmp_path) == tmp_path / "step-000003"
    assert prune(tmp_path, keep=1, run="t") == [tmp_path / "step-000001", tmp_path / "step-000002"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".step-000004.x.partial", "step-000001", "step-000003",
                                                          "step-000005"]
    assert [p.name for p in (tmp_path / "step-000001").iterdir()] == ["notes.txt"]
    with pytest.raises(HetpartError, match="already holds step-000003"):
        check_checkpoint_dir(tmp_path, 2, 2, 1)
    (tmp_path / "link").symlink_to(tmp_path / "step-000003")
    with pytest.raises(HetpartError, match="symbolic link"):
        check_checkpoint_dir(tmp_path / "link", 0, 1, 1)


def test_keep_checkpoints_prunes_only_this_runs_own(tmp_path):
    """--keep-checkpoints N removes this run's older checkpoints only: an earlier run's (even at a later step, even
    of the same model) stay, and this run's newest N stay though an earlier run's step is higher."""
    module, opt = _trained(1)
    _write(tmp_path, 10, module, opt, run="earlier")  # another run, further along
    _write(tmp_path, 1, module, opt, run="earlier")
    for step in (2, 3, 4):
        _write(tmp_path, step, module, opt, run="this", keep=2)
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["step-000001", "step-000003", "step-000004",
                                                                "step-000010"]
    assert prune(tmp_path, keep=1, run="nobody") == []


def test_resume_refuses_another_model_or_batch_and_reads_weights_from_the_nearest_holder(tmp_path):
    ckpt = read_checkpoint(_write(tmp_path, 1, *_trained(1)))
    with pytest.raises(HetpartError, match="checkpoint of zoo:mlp"):
        check_resume(ckpt, {**MODEL, "seed": 1}, DATA)
    with pytest.raises(HetpartError, match="run with --batch-size 8"):
        check_resume(ckpt, MODEL, {**DATA, "batch_size": 16})
    with pytest.raises(HetpartError, match="holds no weight"):
        weight_sources(ckpt, {"rank": 0}, ["head.weight"])
    parts = [{"rank": 0, "device": "a/0", "machine": "a", "weights": ["w"], "file": "0"},
             {"rank": 1, "device": "b/0", "machine": "b", "weights": ["w"], "file": "1"},
             {"rank": 2, "device": "b/1", "machine": "b", "weights": ["w"], "file": "2"}]
    fake = type(ckpt)(tmp_path, 1, DATA, MODEL, parts)
    assert weight_sources(fake, {"rank": 0, "planned_device": "b/1", "machine": "b"}, ["w"])["w"]["rank"] == 2
    assert weight_sources(fake, {"rank": 0, "planned_device": "b/7", "machine": "b"}, ["w"])["w"]["rank"] == 1
    assert weight_sources(fake, {"rank": 0, "planned_device": "c/0", "machine": "c"}, ["w"])["w"]["rank"] == 0
    # A surviving holder (a device of the new plan) before a lost one on the rank's own machine, as the re-plan
    # counts the bytes (the lost b/0's part is the checkpoint's; the surviving a/0 sends).
    new = {"rank": 0, "planned_device": "b/7", "machine": "b"}
    assert weight_sources(fake, new, ["w"], alive=("a/0", "b/7"))["w"]["rank"] == 0
    assert weight_sources(fake, new, ["w"], alive=("a/0", "b/1", "b/7"))["w"]["rank"] == 2
    with pytest.raises(HetpartError, match="need --mode training"):
        prepare_run({"ranks": []}, MODEL, DATA, 1, mode="inference", checkpoint_dir=tmp_path, every=1, keep=None,
                    resume=None)
    with pytest.raises(HetpartError, match="go together"):
        prepare_run({"ranks": []}, MODEL, DATA, 1, mode="training", checkpoint_dir=tmp_path, every=None, keep=None,
                    resume=None)


def test_the_reference_of_a_resumed_run_is_the_same_training_checked_from_its_first_step():
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(2))
    target = torch.randn(8, 3, generator=torch.Generator().manual_seed(3))
    whole = reference_training(_Named(0), (x,), target, 2, 4, OptimizerSpec("sgd", 0.1), 1)
    seen = []
    resumed = reference_training(_Named(0), (x,), target, 2, 4, OptimizerSpec("sgd", 0.1), 1, first_step=2,
                                 at_first_step=lambda: seen.append(True))
    assert seen == [True] and resumed.losses.shape == (2, 2)
    assert torch.equal(resumed.losses, whole.losses[2:])
    assert all(torch.equal(resumed.weights[k], whole.weights[k]) for k in whole.weights)
    assert not torch.equal(resumed.grads["fc1.weight"], whole.grads["fc1.weight"])  # step 2's, not step 0's


def test_verify_of_a_resume_says_cannot_tell_where_a_resume_that_loaded_nothing_would_pass():
    """review23, NOTE [verify a resume]: `run --resume CK --verify` of zoo:llama resumed after 1 step at lr 1e-4
    said PASS with the ranks' checkpoint loading switched off (they trained from the initial weights): the model's
    steps before the checkpoint moved it by less than the tolerance. The reference now says whether a resume that
    loaded nothing would pass, and the weights each rank resumed with are a check of their own."""
    from hetpart.runtime.verify import TensorCheck, Tolerances, Verification

    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(2))
    target = torch.randn(8, 3, generator=torch.Generator().manual_seed(3))
    slow = reference_training(_Named(0), (x,), target, 2, 2, OptimizerSpec("sgd", 1e-7), 1, first_step=1)
    fast = reference_training(_Named(0), (x,), target, 2, 2, OptimizerSpec("sgd", 0.1), 1, first_step=1)
    assert not slow.resume_told and fast.resume_told
    assert sorted(fast.resumed) == sorted(NAMES) and not fast.initial  # the weights before step 1; no AdamW replay
    fresh = reference_training(_Named(0), (x,), target, 2, 2, OptimizerSpec("sgd", 1e-7), 1)
    assert fresh.resume_told and not fresh.resumed  # no resume: nothing to tell
    ok = TensorCheck("fc1.weight (rank 0)", 0.0, 1.0, 0.0, True)
    assert Verification([ok], [ok], Tolerances(), resumed=[ok], resume_told=False).verdict == "CANNOT TELL"
    assert Verification([ok], [ok], Tolerances(), resumed=[ok]).verdict == "PASS"
    bad = TensorCheck("fc1.weight (rank 0)", 1.0, 1.0, 1.0, False)
    report = Verification([ok], [ok], Tolerances(), resumed=[bad]).report()
    assert report[-1].startswith("verify: FAIL") and any("weight resumed from the checkpoint of" in r for r in report)


def test_after_a_rank_died_the_printed_commands_re_plan_only_plans_replan_takes(tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    _write(ck, 2, *_trained(1))
    run = CheckpointRun(save_dir=ck, every=2, token="t")
    flags = ["--schedule 1f1b "]
    text = resume_commands(tmp_path / "out", run, "local/2", 4, flags)
    assert "hetpart replan" in text and "--lose local/2" in text and "--resume" in text and "--steps 2" in text
    # The re-plan counts its bytes from the checkpoint it resumes from (NOTE [bytes from a checkpoint], spot21b).
    assert f"--lose local/2 --checkpoint {ck / 'step-000002'} --out " in text, text
    # A virtual-stage plan: `hetpart replan` refuses it, so the advice is a new partition, then the same resume.
    text = resume_commands(tmp_path / "out", run, "local/2", 4, flags, not_replanned="virtual stages")
    command = text.rsplit("\n", 1)[1].strip()
    assert command.startswith("hetpart run ") and " && " not in command and "--steps 2" in command
    assert "partition the model again" in text and "(without local/2)" in text and "--lose" not in text
    assert "nothing left to train" in resume_commands(tmp_path / "out", run, "local/2", 2, flags, not_replanned="virtual stages")
    # A re-plan left by an earlier failure: `replan --out` would refuse it ("already exists"), so a new name (ux21)
    (tmp_path / "out-replan").mkdir()
    text = resume_commands(tmp_path / "out", run, "local/2", 4, flags)
    assert f"--out {tmp_path / 'out-replan2'} && hetpart run {tmp_path / 'out-replan2'} " in text, text


def test_a_run_the_user_stopped_names_its_last_checkpoint_and_the_resume_on_the_same_plan(tmp_path):
    """Ctrl-C, SIGTERM or SIGHUP in a training run with checkpoints (ux21): the last complete checkpoint and the
    `hetpart run` of the same plan that trains the steps left; nothing where nothing can be resumed."""
    from types import SimpleNamespace

    from hetpart.runtime.resume import stopped_resume

    ck = tmp_path / "ck"
    ck.mkdir()
    opts = SimpleNamespace(schedule="1f1b", microbatches=4, batch_size=None, seq_len=None, steps=6, model=None,
                           trust_model_file=False)
    run = CheckpointRun(save_dir=ck, every=2, token="t")
    assert stopped_resume(tmp_path / "out", run, opts) == ""  # the control: no checkpoint complete yet
    assert stopped_resume(tmp_path / "out", None, opts) == ""  # no checkpoints asked for
    _write(ck, 2, *_trained(1))
    (ck / "step-000004").mkdir()  # an incomplete one (killed while writing): not the last complete
    note = stopped_resume(tmp_path / "out", run, opts)
    assert "the last complete checkpoint is " in note and "step-000002" in note and "(step 2)" in note, note
    command = note.rsplit("\n", 1)[1].strip()
    assert command.startswith(f"hetpart run {tmp_path / 'out'} --mode training --schedule 1f1b ") and " && " not in command
    assert "--microbatches 4" in command and f"--resume {ck / 'step-000002'}" in command and "--steps 4" in command
    assert "replan" not in note  # every device is alive: the same plan goes on
    assert "last step 2" in stopped_resume(tmp_path / "out", run, SimpleNamespace(**{**vars(opts), "steps": 2}))


def test_after_a_failure_the_last_checkpoint_named_is_this_runs_never_an_earlier_runs(tmp_path):
    """review23: a --checkpoint-dir reused by a second run holds the first run's checkpoints too (at other steps:
    the second run refuses only the steps it would write). The failure message named the newest complete
    checkpoint there, the earlier run's step 4 (another lr, further along than this run got), and told to resume it
    for "the 1 step(s) left"; it must name this run's own, else the checkpoint this run resumed from."""
    from types import SimpleNamespace

    from hetpart.runtime.resume import stopped_resume

    ck = tmp_path / "ck"
    ck.mkdir()
    module, opt = _trained(1)
    _write(ck, 4, module, opt, run="earlier")  # the first run's, further along
    _write(ck, 3, module, opt, run="this")
    run = CheckpointRun(save_dir=ck, every=3, token="this")
    text = resume_commands(tmp_path / "out", run, "local/2", 5, ["--schedule gpipe "])
    assert f"--resume {ck / 'step-000003'} --steps 2 " in text and "step-000004" not in text, text
    opts = SimpleNamespace(schedule="gpipe", microbatches=None, batch_size=None, seq_len=None, steps=5, model=None,
                           trust_model_file=False)
    note = stopped_resume(tmp_path / "out", run, opts)
    assert "(step 3)" in note and "step-000004" not in note, note
    # A resumed run that died before it wrote a checkpoint of its own: the one it resumed from, all its steps left.
    resumed = CheckpointRun(save_dir=ck, every=3, token="later", resume=ck / "step-000003", first_step=3)
    text = resume_commands(tmp_path / "out", resumed, "local/2", 4, ["--schedule gpipe "])
    assert f"--resume {ck / 'step-000003'} --steps 4 " in text and "step-000004" not in text, text
    fresh = CheckpointRun(save_dir=ck, every=3, token="other")  # a run that wrote none and resumed none
    assert "no checkpoint was complete" in resume_commands(tmp_path / "out", fresh, "local/2", 5, ["--schedule gpipe "])


@pytest.mark.parametrize("edit, said", [
    (lambda m: m.__setitem__("step", 0), "says step 0, its folder is step-000002"),  # resumed at step 0 before
    (lambda m: m.__setitem__("step", "2"), "has no step count"),
    (lambda m: m.pop("files"), "has no `ranks` list or `files` table"),  # a KeyError traceback before
    (lambda m: m.pop("data"), "has no `data` table"),
    (lambda m: m["files"].__setitem__("../plan.json", "0" * 64), "`files` lists"),  # read outside the checkpoint
    (lambda m: m["ranks"][0].__setitem__("file", "../x.safetensors"), "no part for rank 0"),
])
def test_a_checkpoint_manifest_edited_by_hand_is_refused_with_exit_2_not_a_traceback(tmp_path, edit, said):
    """review23: checkpoint.json is the root of a checkpoint's hashes; its own fields were not checked."""
    path = _write(tmp_path, 2, *_trained(1))
    manifest = json.loads((path / "checkpoint.json").read_text())
    edit(manifest)
    (path / "checkpoint.json").write_text(json.dumps(manifest))
    with pytest.raises(HetpartError, match=re.escape(said)):
        read_checkpoint(path)


def test_a_run_refused_after_the_checkpoint_checks_leaves_no_checkpoint_dir_behind(tmp_path):
    """review23: `run --emulate --checkpoint-dir NEW` without a writable cgroup (exit 2) left NEW behind: the
    checks made the folder. They only check now; the launcher makes it just before the ranks start."""
    from hetpart.runtime.checkpoint import make_checkpoint_dir

    ck = tmp_path / "new" / "ck"
    assert check_checkpoint_dir(ck, 0, 4, 2) == [2, 4]
    assert not (tmp_path / "new").exists()
    make_checkpoint_dir(CheckpointRun(save_dir=ck, every=2))
    assert ck.is_dir()
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(HetpartError, match="cannot create it .* pass another --checkpoint-dir"):
        check_checkpoint_dir(tmp_path / "notes.txt" / "ck", 0, 1, 1)


def test_the_printed_commands_of_a_file_model_repeat_its_model_flags(tmp_path):
    """review23: a file model's run (`--model FILE.py:FN`) that lost a rank printed `hetpart replan ... && hetpart
    run ...` without --model; both refuse a file model they are not told to import, so they failed as printed."""
    from types import SimpleNamespace

    from hetpart.runtime.resume import with_resume_commands
    from hetpart.runtime.launch import RunFailed

    ck = tmp_path / "ck"
    ck.mkdir()
    _write(ck, 2, *_trained(1), run="t")
    run = CheckpointRun(save_dir=ck, every=2, token="t")
    err = RunFailed("rank 1 died")
    err.dead_device = "local/1"
    opts = SimpleNamespace(schedule="gpipe", microbatches=None, batch_size=None, seq_len=None, steps=4,
                           model="/m/my model.py:build", trust_model_file=True)
    replan, resume = str(with_resume_commands(err, tmp_path / "out", run, opts)).rsplit("\n", 1)[1].split(" && ")
    for command in (replan, resume):
        assert "--model '/m/my model.py:build' --trust-model-file " in command, command


def test_a_dangling_link_at_a_step_this_run_writes_is_refused_before_the_run(tmp_path):
    """review23: CK/step-000001 a link to nowhere passed the check (`exists()` follows links), the run trained, and
    rank 0's rename onto the link failed after the step (exit 1, a traceback in its log)."""
    (tmp_path / "step-000001").symlink_to(tmp_path / "nowhere")
    with pytest.raises(HetpartError, match="already holds step-000001"):
        check_checkpoint_dir(tmp_path, 0, 1, 1)
