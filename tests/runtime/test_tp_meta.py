"""Tensor-parallel plans of models traced on meta (issue 20, NOTE [weight manifests]): each TP rank's weights.json
names its part of every split weight, and `hetpart shard-weights` fills it with exactly that part, read as slices of
the checkpoint's whole tensor. zoo:gpt-small as 2 stages x TP 2 on preset:cpu-4: the filled shards equal the plan
traced with weights file for file, tensor for tensor, and train 1F1B equal to the model (that plan's inference:
tests/runtime/test_tp_run.py); a wrongly shaped tensor is refused with nothing written. The mixed-degree plan (TP 2
on one machine, TP 1 on the other: the same code) is filled from a sharded checkpoint index equal to its
weights-traced twin and trains equal.
"""

import json
import shutil
import struct

import pytest
import torch
from safetensors.torch import load_file, save_file, save_model

from hetpart.cli import main
from hetpart.frontend import ModelSpec, load_model
from tests.runtime.test_tp_mixed_run import _cluster

SMALL = ["--batch-size", "4", "--seq-len", "16", "--microbatches", "2", "--no-pt2", "--mode", "training",
         "--schedule", "1f1b"]
GPT = ["zoo:gpt-small", "--set", "n_layer=2", "--set", "n_embd=64", "--set", "vocab_size=128", "--set", "block_size=32"]
TRAIN = ["--mode", "training", "--schedule", "1f1b", "--steps", "2", "--verify"]


def _pair(root, cluster: str, degree: str):
    """The plan traced on meta and the same plan traced with the weights."""
    for name, extra in (("meta", ["--meta"]), ("real", [])):
        assert main(["partition", *GPT, "--cluster", cluster, "--out", str(root / name), *SMALL,
                     "--tensor-parallel", degree, *extra]) == 0
    return root / "meta", root / "real"


def _model(out) -> torch.nn.Module:
    module, _ = load_model(ModelSpec.from_json(json.loads((out / "plan.json").read_text())["model"]))
    return module


def _data_bytes(path) -> int:
    """A safetensors file's size less its header."""
    with open(path, "rb") as f:
        (header,) = struct.unpack("<Q", f.read(8))
    return path.stat().st_size - 8 - header


def _same_files(meta, real) -> None:
    """Every rank's filled weights.safetensors equal, tensor for tensor, to the weights-traced plan's, and its manifest
    entry but for the files (a meta plan's weights.json and constants; what its ranks load, which its runs check)."""
    got_man, want_man = (json.loads((d / "manifest.json").read_text()) for d in (meta, real))
    assert got_man["mesh"] == want_man["mesh"]
    assert [{k: v for k, v in r.items() if k != "files"} for r in got_man["ranks"]] == [
        {k: v for k, v in r.items() if k != "files"} for r in want_man["ranks"]]
    for rank in json.loads((real / "manifest.json").read_text())["ranks"]:
        got = load_file(str(meta / rank["dir"] / "weights.safetensors"))
        want = load_file(str(real / rank["dir"] / "weights.safetensors"))
        assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want), rank["dir"]
        assert (meta / rank["dir"] / "stage.py").read_text() == (real / rank["dir"] / "stage.py").read_text()


@pytest.fixture(scope="module")
def gpt_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("tpmeta")
    meta, real = _pair(root, "preset:cpu-4", "2")
    save_model(_model(meta), str(root / "model.safetensors"))
    return meta, real, root / "model.safetensors"


def test_shard_weights_fills_each_tp_rank_with_its_parts_equal_to_the_traced_plan(gpt_pair, tmp_path, capsys):
    meta, real, ckpt = gpt_pair
    out = tmp_path / "out"
    shutil.copytree(meta, out)
    full = load_file(str(ckpt))
    man = json.loads((out / "manifest.json").read_text())
    split = {n: w for g in man["mesh"]["tensor_parallel"] for n, w in g["weights"].items()}
    assert split and all(w["dim"] in (0, 1) for w in split.values())
    held_split = 0
    for rank in man["ranks"]:
        manifest = json.loads((out / rank["dir"] / "weights.json").read_text())
        parts = {e["key"]: e for e in manifest["tensors"] if "split" in e}
        assert manifest["format_version"] == 2 and set(parts) == set(split) & set(rank["weights"])
        for key, e in parts.items():
            assert e["split"] == {**split[key], "rank": rank["tp"]["rank"], "degree": 2}
            want = list(full[key].shape)
            want[e["split"]["dim"]] //= 2
            assert e["shape"] == want, key  # the part, never the whole
            held_split += full[key].numel() * 4 // 2
    assert main(["shard-weights", str(out), str(ckpt)]) == 0
    assert "wrote weights.safetensors for 4 rank(s)" in capsys.readouterr().out
    _same_files(out, real)
    # Sizes: each rank holds half of each split weight of its stage; TP rank 1 holds nothing else (its
    # replicated weights are stored once, in TP rank 0's file: NOTE [weights stored once]).
    split_bytes = {s: sum(full[n].numel() * 4 for n in g["weights"]) for s, g in
                   enumerate(man["mesh"]["tensor_parallel"])}
    for rank in man["ranks"]:
        got = load_file(str(out / rank["dir"] / "weights.safetensors"))
        assert sum(got[n].numel() * 4 for n in got if n in split) == split_bytes[rank["stage"]] // 2
        if rank["tp"]["rank"] == 1:
            assert _data_bytes(out / rank["dir"] / "weights.safetensors") == split_bytes[rank["stage"]] // 2
    assert held_split == sum(split_bytes.values())  # the manifests' parts: each split weight's two halves
    assert main(["run", str(out), *TRAIN]) == 0
    ran = capsys.readouterr().out
    assert "4 rank(s)" in ran and "verify: PASS" in ran and "max_weight_rel_err=" in ran, ran
    # Inference of the same plan: `_same_files` found its ranks' files and entries equal to the weights-traced plan's
    # but for what they load, which the run above checked; tests/runtime/test_tp_run.py runs that plan's inference.


def test_a_wrongly_shaped_split_tensor_is_refused_and_nothing_is_written(gpt_pair, tmp_path, capsys):
    meta, _, ckpt = gpt_pair
    out = tmp_path / "out"
    shutil.copytree(meta, out)
    before = (out / "manifest.json").read_bytes()
    tensors = load_file(str(ckpt))
    tensors["blocks.1.mlp.fc.weight"] = tensors["blocks.1.mlp.fc.weight"][:-2]  # [254, 64]: not the model's
    save_file(tensors, str(tmp_path / "bad.safetensors"))
    assert main(["shard-weights", str(out), str(tmp_path / "bad.safetensors")]) == 2
    err = capsys.readouterr().err
    assert ("'blocks.1.mlp.fc.weight' has shape [254, 64] in the checkpoint, the plan needs [256, 64] (this rank "
            "holds part 0 of 2 on dim 0: [128, 64])") in err and "nothing was written" in err and "Traceback" not in err
    assert (out / "manifest.json").read_bytes() == before
    assert not list(out.glob("rank*/weights.safetensors")) and not list(out.glob("rank*/.*.tmp"))


def test_mixed_degrees_on_meta_fill_from_a_sharded_index_and_train_equal(tmp_path, capsys):
    # NOTE [mixed-degree pipeline]: stage 0 at TP 2 on machine a, stage 1 whole on b; the same manifests and
    # shard-weights as one degree (tensor_parallel.py's rank graphs record each rank's parts).
    cluster = _cluster(tmp_path / "two.toml", "b", "a", "1.5 MiB", "1.5 MiB")
    meta, real = _pair(tmp_path, str(cluster), "a=2")
    full = {k: v.contiguous() for k, v in _model(meta).state_dict().items()}
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    save_model(_model(meta), str(tmp_path / "whole.safetensors"))
    whole = load_file(str(tmp_path / "whole.safetensors"))
    keys = sorted(whole)
    weight_map = {}
    for i, part in enumerate((keys[::2], keys[1::2])):  # a split weight's rank parts read from either file
        save_file({k: whole[k] for k in part}, str(ckpt / f"model-{i}.safetensors"))
        weight_map |= {k: f"model-{i}.safetensors" for k in part}
    (ckpt / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert main(["shard-weights", str(meta), str(ckpt)]) == 0
    assert "wrote weights.safetensors for 3 rank(s)" in capsys.readouterr().out
    _same_files(meta, real)
    stage1 = load_file(str(meta / "rank2" / "weights.safetensors"))  # TP 1: whole tensors
    assert all(torch.equal(v, full[k]) for k, v in stage1.items() if k in full)
    assert main(["run", str(meta), *TRAIN]) == 0
    ran = capsys.readouterr().out
    assert "3 rank(s)" in ran and "verify: PASS" in ran, ran


def test_pipelines_of_tp_stages_on_meta_fill_equal_to_the_traced_plan_and_train_equal(tmp_path, capsys):
    # NOTE [tensor-parallel pipelines mesh]: two data-parallel pipelines of one TP-2 stage each; each rank's
    # weights.json names its part, and a weight both pipelines hold is stored once (NOTE [weights stored once]).
    pipes = ["--pipelines", "local/0,local/1;local/2,local/3"]
    for name, extra in (("meta", ["--meta"]), ("real", [])):
        assert main(["partition", *GPT, "--cluster", "preset:cpu-4", "--out", str(tmp_path / name), *SMALL,
                     "--tensor-parallel", "2", *pipes, *extra]) == 0
    meta, real = tmp_path / "meta", tmp_path / "real"
    save_model(_model(meta), str(tmp_path / "model.safetensors"))
    assert main(["shard-weights", str(meta), str(tmp_path / "model.safetensors")]) == 0
    assert "wrote weights.safetensors for 4 rank(s)" in capsys.readouterr().out
    _same_files(meta, real)
    assert main(["run", str(meta), *TRAIN]) == 0
    ran = capsys.readouterr().out
    assert "of 2 pipelines" in ran and "verify: PASS" in ran, ran
