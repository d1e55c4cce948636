"""NOTE [bytes from a checkpoint] (hetpart/replan_checkpoint.py): `replan --checkpoint CK` counts the bytes to move
from what a run's checkpoint holds, and says how it counted them without one; a checkpoint another plan's run wrote is
refused. The checkpoints are written here as a run's ranks write them (`save_rank`, `finish_checkpoint`, the
artifacts' own weights), without torchrun."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hetpart.cli import main
from hetpart.errors import HetpartError
from hetpart.partitioner.replan_holdings import state_to_move_bytes
from hetpart.runtime.checkpoint import finish_checkpoint, model_record, save_rank
from hetpart.units import format_bytes

# Two stages on cpu-2 in training (tests/test_safety_writes.py's MLP_2RANK at batch 256): each rank holds two blocks.
MLP = ["zoo:mlp", "--set", "hidden=256", "--set", "n_blocks=4", "--batch-size", "256", "--microbatches", "2",
       "--cluster", "preset:cpu-2", "--no-pt2", "--mode", "training", "--time-limit", "5"]


@pytest.fixture(scope="module")
def old(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ckreplan") / "old"
    assert main(["partition", *MLP, "--out", str(out)]) == 0
    assert len(json.loads((out / "manifest.json").read_text())["ranks"]) == 2
    return out


def write_checkpoint(old: Path, ck: Path, optimizer: str = "SGD", step: int = 2, edit=None) -> Path:
    """A checkpoint of `step` as a run of `old` writes it: each rank's weights (the artifacts'), and AdamW's two
    moments and step count per weight; `edit(rank, entry)` changes what a rank records (another plan's)."""
    manifest = json.loads((old / "manifest.json").read_text())
    plan = json.loads((old / "plan.json").read_text())
    ck.mkdir(exist_ok=True)
    weights = {k: t for e in manifest["ranks"] for k, t in load_file(old / e["dir"] / "weights.safetensors").items()}
    for entry in manifest["ranks"]:
        entry = dict(edit(entry["rank"], entry) if edit else entry)
        tensors = {f"weight/{k}": weights[k] for k in entry["weights"]}
        if optimizer == "AdamW":
            for key, t in list(tensors.items()):
                fqn = key.split("/", 1)[1]
                tensors[f"optimizer/{fqn}/exp_avg"] = torch.zeros_like(t)
                tensors[f"optimizer/{fqn}/exp_avg_sq"] = torch.zeros_like(t)
                tensors[f"optimizer/{fqn}/step"] = torch.tensor(float(step))
        params = sorted(k.split("/", 1)[1] for k in tensors if k.startswith("weight/"))
        state = {"type": optimizer, "param_groups": [{"lr": 0.001, "params": params}], "state": {}}
        save_rank(ck, step, "t", entry["rank"], entry, tensors, state)
    data = {"batch_size": 256, "seq_len": plan["model"]["seq_len"], "seed": 0, "microbatches": 2,
            "samples_seen": step * 256}
    return finish_checkpoint(ck, step, "t", len(manifest["ranks"]), data, model_record(plan["model"]), keep=None)


def data_bytes(path: Path) -> int:
    """A safetensors file's tensor data: its size less the 8-byte length and the JSON header."""
    with path.open("rb") as f:
        (header,) = struct.unpack("<Q", f.read(8))
    return path.stat().st_size - 8 - header


def test_replan_counts_what_the_checkpoint_holds_and_says_what_it_assumes_without_one(old, tmp_path, capsys):
    capsys.readouterr()
    # Without --checkpoint: as the plan costs them (8 B/param for Adam's moments), and it says so.
    assert main(["replan", str(old), "--lose", "local/1", "--out", str(tmp_path / "plan-costed")]) == 0
    out = capsys.readouterr().out
    assert "bytes as the plan costs them: value + 8 B/param of optimizer state" in out, out
    assert "--checkpoint CK counts what it holds" in out
    record = json.loads((tmp_path / "plan-costed" / "plan.json").read_text())["replan"]
    assert record["bytes_counted"] == {"from": "plan", "optimizer_bytes_per_param": 8}
    planned = record["chosen"]["from_checkpoint_bytes"]

    # With an SGD checkpoint (`run`'s default: no optimizer state): the lost rank's file, byte for byte.
    ck = write_checkpoint(old, tmp_path / "ck")
    lost = data_bytes(ck / "rank1.safetensors")
    assert planned == 3 * lost  # fp32 values + 8 B/param: the old figure was 3x what the checkpoint holds
    assert main(["replan", str(old), "--lose", "local/1", "--out", str(tmp_path / "new"),
                 "--checkpoint", str(tmp_path / "ck")]) == 0
    out = capsys.readouterr().out
    record = json.loads((tmp_path / "new" / "plan.json").read_text())["replan"]
    assert record["chosen"]["from_checkpoint_bytes"] == lost
    assert record["chosen"]["links"] == [{"link": "checkpoint -> local", "bytes": lost,
                                         "time_us": record["chosen"]["links"][0]["time_us"]}]
    assert f"chosen plan's link checkpoint -> local: {format_bytes(lost)}," in out, out
    counted = record["bytes_counted"]
    assert counted["from"] == "checkpoint" and counted["step"] == 2 and counted["optimizer"] == "SGD"
    assert counted["optimizer_bytes"] == 0
    assert counted["value_bytes"] == data_bytes(ck / "rank0.safetensors") + lost
    assert f"bytes as checkpoint {ck} holds them (step 2, SGD)" in out, out


def test_an_adamw_checkpoints_bytes_are_its_moments_and_step_counts_as_written(old, tmp_path):
    from hetpart.codegen.analysis import ANALYSIS
    from hetpart.partitioner.problem_json import problem_from_json
    from hetpart.plan_report import as_json
    from hetpart.replan_checkpoint import read_held_state
    from hetpart.runtime.artifacts import load_manifest, read_plan

    ck = write_checkpoint(old, tmp_path / "ck", "AdamW")
    manifest = load_manifest(old)
    stored = problem_from_json(json.loads((old / ANALYSIS).read_text())["problem"])
    held = read_held_state(ck, old, manifest, as_json(read_plan(old, manifest).model), stored)
    assert held.optimizer == "AdamW" and held.step == 2
    stored.checkpoint_state = held
    for entry in manifest["ranks"]:  # every weight's value, two moments and a 4-byte step: the rank's file
        assert sum(state_to_move_bytes(stored, w) for w in entry["weights"]) == \
            data_bytes(ck / f"rank{entry['rank']}.safetensors")
    for w in stored.weights:
        assert held.optimizer_bytes[w] == 2 * held.value_bytes[w] + 4
    # A TP rank's shard moves its share of the checkpoint's bytes (NOTE [re-plan by shard]), and the 4-byte step
    # whole: every rank reads it (rev25: it was a share too).
    w = max(stored.weights, key=stored.weights.get)
    assert held.value_bytes[w] == stored.weights[w] and held.scalar_bytes[w] == 4
    assert held.moved_bytes(w, stored.weights[w] // 2) == (held.whole_bytes(w) - 4) // 2 + 4


def _other_device(rank: int, entry: dict) -> dict:
    return {**entry, "planned_device": "local/1" if rank == 0 else "local/0"}


def _fewer_weights(rank: int, entry: dict) -> dict:
    return entry if rank == 0 else {**entry, "weights": entry["weights"][1:]}


@pytest.mark.parametrize("edit, said", [(_other_device, "rank 0 held"), (_fewer_weights, "rank 1 held")])
def test_a_checkpoint_of_another_plan_is_refused_with_exit_2_and_nothing_written(old, tmp_path, capsys, edit, said):
    write_checkpoint(old, tmp_path / "ck", edit=edit)
    capsys.readouterr()
    new = tmp_path / "new"
    assert main(["replan", str(old), "--lose", "local/1", "--out", str(new), "--checkpoint", str(tmp_path / "ck")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hetpart: error: --checkpoint ") and "Traceback" not in err, err
    assert said in err and "it is another plan's checkpoint" in err and f"`hetpart run {old} --checkpoint-dir CK`" in err
    assert not new.exists()


def test_a_checkpoint_of_another_model_or_no_checkpoint_is_refused(old, tmp_path, capsys):
    from hetpart.replan_checkpoint import check_belongs
    from hetpart.runtime.checkpoint import read_checkpoint

    ckpt = read_checkpoint(write_checkpoint(old, tmp_path / "ck"))
    manifest = json.loads((old / "manifest.json").read_text())
    model = json.loads((old / "plan.json").read_text())["model"]
    with pytest.raises(HetpartError, match=r"is a checkpoint of zoo:mlp .* is a plan of zoo:mlp \{'hidden': '128'"):
        check_belongs(ckpt, tmp_path / "ck", old, manifest, {**model, "overrides": {"hidden": "128"}})
    capsys.readouterr()
    assert main(["replan", str(old), "--lose", "local/1", "--out", str(tmp_path / "new"),
                 "--checkpoint", str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"hetpart: error: --checkpoint {tmp_path / 'nothing'}: no such directory"), err
    assert not (tmp_path / "new").exists()


def _as_float64(ck: Path) -> None:  # the file rewritten whole, its header consistent: twice the bytes per element
    from safetensors.torch import save_file

    tensors = load_file(ck / "rank1.safetensors")
    save_file({k: t.double() for k, t in tensors.items()}, str(ck / "rank1.safetensors"))


def _symlink(ck: Path) -> None:  # rank 0's file in rank 1's place
    (ck / "rank1.safetensors").unlink()
    (ck / "rank1.safetensors").symlink_to(ck / "rank0.safetensors")


@pytest.mark.parametrize("change, said", [(_as_float64, "'rank1.safetensors' has sha256"),
                                          (_symlink, "'rank1.safetensors' is a symbolic link"),
                                          (lambda ck: (ck / "rank1.safetensors").unlink(),
                                           "'rank1.safetensors' is missing")])
def test_a_tensor_file_changed_after_the_run_is_refused_before_its_header_is_read(old, tmp_path, capsys, change, said):
    """rev25: `replan --checkpoint` read the tensor files' headers before (and without) checking their sha256: a file
    rewritten in float64 gave twice its values' bytes with exit 0, a symbolic link was followed (and named "holds no
    tensor"), and a missing file was "not found; pass a .safetensors file" (shard-weights' wording). Every file's
    hash is checked first now, as `run --resume` does (NOTE [bytes from a checkpoint])."""
    ck = write_checkpoint(old, tmp_path / "ck")
    change(ck)
    capsys.readouterr()
    new = tmp_path / "new"
    assert main(["replan", str(old), "--lose", "local/1", "--out", str(new), "--checkpoint", str(ck)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert err.startswith(f"hetpart: error: --checkpoint {ck}: ") and said in err and "Traceback" not in err, err
    assert "changed or truncated after hetpart wrote it" in err
    assert not new.exists()


def _rewrite_rank1(ck: Path, edit) -> None:
    """rank1.json changed by `edit` and checkpoint.json re-hashed to match: a checkpoint edited consistently."""
    import hashlib

    part = json.loads((ck / "rank1.json").read_text())
    edit(part)
    (ck / "rank1.json").write_text(json.dumps(part))
    manifest = json.loads((ck / "checkpoint.json").read_text())
    manifest["ranks"][1] = part
    manifest["files"]["rank1.json"] = hashlib.sha256((ck / "rank1.json").read_bytes()).hexdigest()
    (ck / "checkpoint.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("edit", [lambda p: p.pop("device"), lambda p: p["weights"].append(3),
                                  lambda p: p["optimizer"].update(type=["SGD"])],
                         ids=["no-device", "a-weight-name-no-string", "optimizer-type-a-list"])
def test_a_rank_part_edited_and_re_hashed_is_refused_with_exit_2_not_a_traceback(old, tmp_path, capsys, edit):
    """rev25: rank<k>.json and checkpoint.json edited together (their hashes agree) with a part that has no `device`,
    a weight name that is no string, or an optimizer type that is a list: `replan --checkpoint` ended in a KeyError
    or TypeError traceback (exit 1). `read_checkpoint` checks those fields now (`check_manifest_fields`)."""
    ck = write_checkpoint(old, tmp_path / "ck")
    _rewrite_rank1(ck, edit)
    capsys.readouterr()
    new = tmp_path / "new"
    assert main(["replan", str(old), "--lose", "local/1", "--out", str(new), "--checkpoint", str(ck)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "has no part for rank 1 at place 1 of `ranks`" in err and "Traceback" not in err, err
    assert not new.exists()


def test_a_partial_folder_is_never_taken_as_a_checkpoint_even_with_its_manifest(old, tmp_path, capsys):
    """rev25: a run killed between writing checkpoint.json and the rename leaves `.step-<N>.<run>.partial` holding
    all of it; README and NOTE [checkpoint layout] say such a folder is never taken as a checkpoint, but `replan
    --checkpoint` (and `run --resume`) named directly took it. `find_checkpoint` refuses it now."""
    ck = write_checkpoint(old, tmp_path / "ck")
    partial = ck.rename(tmp_path / "ck" / ".step-000002.t.partial")
    capsys.readouterr()
    new = tmp_path / "new"
    assert main(["replan", str(old), "--lose", "local/1", "--out", str(new), "--checkpoint", str(partial)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert err.startswith(f"hetpart: error: --checkpoint {partial}: a checkpoint a run did not finish writing"), err
    assert not new.exists()
    with pytest.raises(HetpartError, match="a checkpoint a run did not finish writing"):
        from hetpart.runtime.checkpoint import find_checkpoint
        find_checkpoint(partial)


def test_the_printed_replan_after_a_resumed_runs_failure_runs(old, tmp_path, capsys):
    """rev25: a run resumed from another plan's checkpoint (the plan it was re-planned from) that died before it
    wrote one of its own printed `hetpart replan OUT --checkpoint <that checkpoint>`, which `replan --checkpoint`
    refuses (another plan's): the printed command failed with exit 2. It passes --checkpoint only with a checkpoint
    this run wrote now; the re-plan then counts as the plan costs them, and says so."""
    import shlex

    from hetpart.runtime.checkpoint import CheckpointRun
    from hetpart.runtime.resume import resume_commands

    earlier = write_checkpoint(old, tmp_path / "ck", edit=_other_device)  # the plan before the re-plan wrote it
    run = CheckpointRun(save_dir=tmp_path / "ck", every=2, token="this", resume=earlier, first_step=2)
    text = resume_commands(old, run, "local/1", 4, ["--schedule gpipe "])
    replan = shlex.split(text.rsplit("\n", 1)[1].split(" && ")[0])
    assert replan[:2] == ["hetpart", "replan"], text
    replan[replan.index("--out") + 1] = str(tmp_path / "new")
    capsys.readouterr()
    assert main(replan[1:]) == 0, capsys.readouterr().err
    assert "bytes as the plan costs them" in capsys.readouterr().out and "--checkpoint" not in replan
    # A checkpoint this run wrote: --checkpoint, as before (tests/runtime/test_checkpoint.py).
    own = write_checkpoint(old, tmp_path / "ck", step=4)
    (own / "checkpoint.json").write_text((own / "checkpoint.json").read_text().replace('"run": "t"', '"run": "this"'))
    assert f"--checkpoint {own} " in resume_commands(old, run, "local/1", 6, ["--schedule gpipe "])
