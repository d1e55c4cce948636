"""Tensor-parallel stages under torchrun (issue 20): zoo:gpt-small, zoo:llama and hf:llama as 2 stages x TP 2 on
preset:cpu-4 train 1F1B equal to the model (outputs, every gathered gradient and weight, rtol 1e-5) and run
inference equal to it; a doubled shard gradient fails --verify; gpt-small checkpoints its shards and resumes
from them equal to the model (NOTE [checkpoint slices]).

The fast tests (the sharding, the shards, the costs) are tests/test_tensor_parallel.py.
"""

import json
import shutil

import pytest
from safetensors import safe_open

from hetpart.cli import main
from hetpart.errors import HetpartError
from hetpart.runtime.artifacts import load_manifest

SMALL = ["--batch-size", "4", "--seq-len", "16", "--microbatches", "2", "--no-pt2", "--mode", "training",
         "--schedule", "1f1b", "--tensor-parallel", "2"]
GPT = ["zoo:gpt-small", "--set", "n_layer=2", "--set", "n_embd=64", "--set", "vocab_size=128", "--set", "block_size=32"]
LLAMA = ["zoo:llama", "--set", "n_layers=2", "--set", "dim=64", "--set", "vocab_size=128", "--set", "ffn_hidden=96",
         "--set", "n_heads=4", "--set", "n_kv_heads=2"]
HF_LLAMA = ["hf:llama", "--set", "num_hidden_layers=2", "--set", "hidden_size=64", "--set", "intermediate_size=128",
            "--set", "num_attention_heads=4", "--set", "num_key_value_heads=2", "--set", "vocab_size=128"]


def _shapes(path) -> dict[str, list[int]]:
    with safe_open(str(path), "pt") as f:
        return {k: list(f.get_slice(k).get_shape()) for k in f.keys()}


def _partition(out, model: list[str], cluster: str) -> None:
    assert main(["partition", *model, "--cluster", cluster, "--out", str(out), *SMALL]) == 0


@pytest.fixture(scope="module")
def gpt_tp(tmp_path_factory):
    out = tmp_path_factory.mktemp("tp") / "gpt"
    _partition(out, GPT, "preset:cpu-4")
    return out


def test_each_rank_holds_only_its_shards_and_the_manifest_records_the_groups(gpt_tp, tmp_path, capsys):
    man = json.loads((gpt_tp / "manifest.json").read_text())
    assert man["mesh"]["stages"] == [[0, 1], [2, 3]]
    tp = man["mesh"]["tensor_parallel"]
    assert [(g["stage"], g["ranks"], g["degree"]) for g in tp] == [(0, [0, 1], 2), (1, [2, 3], 2)]
    assert tp[0]["weights"]["blocks.0.attn.qkv.weight"] == {"dim": 0, "chunks": 3}
    assert tp[1]["weights"]["blocks.1.mlp.proj.weight"] == {"dim": 1, "chunks": 1}
    full = {"blocks.{b}.attn.qkv.weight": [192, 64], "blocks.{b}.attn.proj.weight": [64, 64],
            "blocks.{b}.mlp.fc.weight": [256, 64], "blocks.{b}.mlp.proj.weight": [64, 256]}
    split = {n for g in tp for n in g["weights"]}
    for entry in man["ranks"]:
        held = _shapes(gpt_tp / entry["dir"] / "weights.safetensors")
        b, dims = entry["stage"], tp[entry["stage"]]["weights"]
        for name, shape in full.items():
            name = name.format(b=b)
            want = list(shape)
            want[dims[name]["dim"]] //= 2
            assert held[name] == want, (entry["rank"], name)  # half of it, never the whole tensor
        assert not split - set(dims) & set(held), "a rank holds another stage's split weight"
        assert "tp_all_reduce(" in (gpt_tp / entry["dir"] / "stage.py").read_text()
    # load_manifest checks the TP record: a rank moved to another place of its group is refused.
    bad = tmp_path / "bad"
    shutil.copytree(gpt_tp, bad)
    man["ranks"][1]["tp"]["rank"] = 0
    (bad / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(HetpartError, match=r"ranks\[1\]\.tp must be TP rank 1 of 2 in tp-0"):
        load_manifest(bad)


def test_gpt_two_stages_by_tp2_train_1f1b_equal_to_the_model_checkpoint_resume_and_replan(gpt_tp, tmp_path, capsys):
    """2 steps with a checkpoint (each rank its shards, NOTE [checkpoint slices]), equal to the model. Then issue 21
    on a TP plan (NOTE [re-plan of tensor-parallel plans]): local/3 is lost, `hetpart replan` keeps TP 2 on the group
    that survives whole (one stage, 2 ranks), and 2 steps resumed from the checkpoint equal 4 of the model from the
    same initial weights. (TP ranks resuming their own shards in the same layout under torchrun:
    tests/runtime/test_replan_dp_tp_run.py, whose kept pipeline moves no byte.)"""
    ck = tmp_path / "ck"
    train = ["run", str(gpt_tp), "--mode", "training", "--schedule", "1f1b", "--steps", "2", "--verify"]
    assert main([*train, "--checkpoint-every", "2", "--checkpoint-dir", str(ck)]) == 0
    ran = capsys.readouterr().out
    assert "4 rank(s)" in ran and "verify: PASS" in ran and "max_grad_rel_err=" in ran
    assert "max_weight_rel_err=" in ran
    step = ck / "step-000002"
    part = json.loads((step / "rank1.json").read_text())  # TP rank 1 of stage 0
    assert part["layout"]["weight/blocks.0.attn.qkv.weight"] == {
        "shape": [192, 64], "dim": 0, "slices": [[32, 64], [96, 128], [160, 192]]}  # its half of q, of k, of v
    assert part["layout"]["weight/blocks.0.mlp.proj.weight"] == {"shape": [64, 256], "dim": 1, "slices": [[128, 256]]}
    assert part["layout"]["weight/blocks.0.ln_1.weight"] == {"shape": [64], "replicated": True}
    assert _shapes(step / "rank1.safetensors")["weight/blocks.0.attn.qkv.weight"] == [96, 64]  # never the whole
    # A changed byte in one rank's shards: refused before any rank starts.
    bad = tmp_path / "bad"
    shutil.copytree(step, bad)
    data = bytearray((bad / "rank3.safetensors").read_bytes())
    data[len(data) // 2] ^= 1
    (bad / "rank3.safetensors").write_bytes(bytes(data))
    assert main([*train, "--resume", str(bad)]) == 2
    assert "'rank3.safetensors' has sha256" in capsys.readouterr().err

    new = tmp_path / "new"
    assert main(["replan", str(gpt_tp), "--lose", "local/3", "--out", str(new)]) == 0
    out = capsys.readouterr().out
    assert "tensor parallel 2 kept: 1 group(s) of the new cluster (local/0+local/1)" in out, out
    plan = json.loads((new / "plan.json").read_text())
    chosen = plan["replan"]["chosen"]
    assert chosen["devices"] == ["local/0+local/1"]
    assert chosen["bottleneck_us"] == plan["bottleneck_us"]  # the stored TP costs equal the new lowering's
    # By shard (NOTE [re-plan by shard]): stage 1's index-0 shards and replicated weights come from local/2
    # within the machine; its index-1 shards, which only the lost local/3 held, from the checkpoint.
    assert chosen["between_machines_bytes"] == 0 and 0 < chosen["from_checkpoint_bytes"] < chosen[
        "within_machines_bytes"]
    man = json.loads((new / "manifest.json").read_text())
    assert man["mesh"]["stages"] == [[0, 1]] and [e["planned_device"] for e in man["ranks"]] == ["local/0", "local/1"]
    assert main(["run", str(new), "--mode", "training", "--schedule", "1f1b", "--steps", "2", "--resume", str(ck),
                 "--verify"]) == 0
    ran = capsys.readouterr().out
    assert "after step 2" in ran and "2 rank(s)" in ran and "verify: PASS" in ran, ran
    # One device left: no TP-2 group can run; said before anything is written.
    one = tmp_path / "one"
    assert main(["replan", str(gpt_tp), "--lose", "local/1", "--lose", "local/2", "--lose", "local/3",
                 "--out", str(one)]) == 2
    err = capsys.readouterr().err
    assert "no machine of the new cluster has 2 devices of one type left" in err and "can host: 1" in err, err
    assert not one.exists()


@pytest.fixture(scope="module", params=["zoo:llama", "hf:llama"])
def llama_tp(request, tmp_path_factory):
    out = tmp_path_factory.mktemp("tp") / request.param.replace(":", "-")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        _partition(out, LLAMA if request.param == "zoo:llama" else HF_LLAMA, "preset:cpu-4")
    return out


def test_llamas_two_stages_by_tp2_train_1f1b_equal_to_the_model(llama_tp, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert len(json.loads((llama_tp / "manifest.json").read_text())["mesh"]["tensor_parallel"]) == 2
    assert main(["run", str(llama_tp), "--mode", "training", "--schedule", "1f1b", "--verify"]) == 0
    ran = capsys.readouterr().out
    assert "4 rank(s)" in ran and "verify: PASS" in ran and "max_weight_rel_err=" in ran


def _inference_passes(out, capsys) -> None:
    assert main(["run", str(out), "--verify"]) == 0  # the training plan's artifacts, run for inference
    ran = capsys.readouterr().out
    assert "4 rank(s)" in ran and "inference" in ran and "verify: PASS" in ran


def test_gpt_tp2_inference_equals_the_model(gpt_tp, capsys):
    _inference_passes(gpt_tp, capsys)


def test_llamas_tp2_inference_equals_the_model(llama_tp, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _inference_passes(llama_tp, capsys)


def test_hf_llama_with_a_wrong_shard_gradient_fails_verify_on_exactly_the_split_weights(tmp_path, capsys,
                                                                                        monkeypatch):
    """hf:llama (2 layers, from config) as one stage x TP 2 on preset:cpu-2 (2 ranks: the cheaper launch); TP
    rank 1 doubles its shards' gradients: the outputs and every replicated weight's gradient still agree with
    the model, every failure is a split weight's."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "hf"
    _partition(out, HF_LLAMA, "preset:cpu-2")
    split = set(json.loads((out / "manifest.json").read_text())["mesh"]["tensor_parallel"][0]["weights"])
    assert len(split) == 15  # q, k, v, o, gate, up, down of 2 layers, and the LM head (vocab-parallel)
    monkeypatch.setenv("HETPART_TEST_BREAK_TP", "shard")
    assert main(["run", str(out), "--mode", "training", "--schedule", "1f1b", "--verify"]) == 1
    broken = capsys.readouterr().out
    assert "verify: FAIL" in broken and "logits=4x16x128" in broken
    failed = [line for line in broken.splitlines() if line.endswith("FAIL") and line.startswith("  ")]
    assert failed and not any(line.lstrip().startswith("output") for line in failed)
    named = {line.split(" of ", 1)[1].split(" (rank")[0] for line in failed if "gradient of " in line}
    assert named and named <= split, named - split
