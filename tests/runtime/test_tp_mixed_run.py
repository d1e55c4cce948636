"""Stages of different tensor-parallel degrees in one pipeline (issue 20, NOTE [mixed-degree pipeline]) under torchrun.

Two machines, `a` of 2 CPU devices and `b` of 1, each device of 1.5 MiB so that no one slot holds the model: with
`--tensor-parallel a=2` zoo:gpt-small (2 layers) plans stage 0 at TP 2 on a and stage 1 at TP 1 on b (3 ranks),
trains 1F1B equal to the model (outputs, every gathered gradient and weight, rtol 1e-5) and checkpoints each rank's
layout, and runs inference equal to it; each rank holds only its shards; an edited mesh is refused. zoo:llama
with the TP-2 stage last (its followers compute the loss, its vocab-parallel head gathers) trains equal to it.
"""

import json
import math

import pytest
from safetensors import safe_open

from hetpart.cli import main
from hetpart.errors import HetpartError
from hetpart.runtime.artifacts import load_manifest
from tests.runtime import edited_copy

SMALL = ["--batch-size", "4", "--seq-len", "16", "--microbatches", "2", "--no-pt2", "--mode", "training",
         "--schedule", "1f1b"]
GPT = ["zoo:gpt-small", "--set", "n_layer=2", "--set", "n_embd=64", "--set", "vocab_size=128", "--set", "block_size=32"]
LLAMA = ["zoo:llama", "--set", "n_layers=2", "--set", "dim=64", "--set", "vocab_size=128", "--set", "ffn_hidden=96",
         "--set", "n_heads=4", "--set", "n_kv_heads=2"]


def _cluster(path, one: str, two: str, mem_one: str, mem_two: str):
    """Machine `two` of 2 CPU devices, machine `one` of 1 (listed first when `one` is "a")."""
    nodes = {one: f'[{{type = "cpu", mem = "{mem_one}"}}]',
             two: f'[{{type = "cpu", mem = "{mem_two}"}}, {{type = "cpu", mem = "{mem_two}"}}]'}
    text = "[network]\nbandwidth_GBps = 1\nlatency_us = 50\n" + "".join(
        f'[[nodes]]\nname = "{n}"\ndevices = {nodes[n]}\nlink = {{ bandwidth_GBps = 2, latency_us = 20 }}\n'
        for n in sorted(nodes))
    path.write_text(text)
    return path


def _shapes(path) -> dict[str, list[int]]:
    with safe_open(str(path), "pt") as f:
        return {k: list(f.get_slice(k).get_shape()) for k in f.keys()}


@pytest.fixture(scope="module")
def gpt_mixed(tmp_path_factory):
    root = tmp_path_factory.mktemp("tpmix")
    cluster = _cluster(root / "two.toml", "b", "a", "1.5 MiB", "1.5 MiB")
    out = root / "gpt"
    assert main(["partition", *GPT, "--cluster", str(cluster), "--out", str(out), *SMALL,
                 "--tensor-parallel", "a=2"]) == 0
    return out


def test_stage_0_at_tp2_and_stage_1_at_tp1_each_rank_holds_only_its_shards(gpt_mixed):
    man = json.loads((gpt_mixed / "manifest.json").read_text())
    assert man["format_version"] == 3 and man["world_size"] == 3
    mesh = man["mesh"]
    assert mesh["stages"] == [[0, 1], [2]] and mesh["tp_boundaries"] == "leaders"
    assert [(e["degree"], e["group"]) for e in mesh["tensor_parallel"]] == [(2, "tp-0"), (1, None)]
    assert {g["name"]: g["ranks"] for g in mesh["groups"] if g["kind"] != "weights"} == {"pipeline": [0, 2],
                                                                                         "tp-0": [0, 1]}
    tied = [g for g in mesh["groups"] if g["kind"] == "weights"]  # the tied embedding / LM head: every holder
    assert [g["ranks"] for g in tied] == [[0, 1, 2]]
    plan = json.loads((gpt_mixed / "plan.json").read_text())
    assert [s["devices"] for s in plan["stages"]] == [["a/0", "a/1"], ["b/0"]]
    anywhere = {w: shape for e in man["ranks"]
                for w, shape in _shapes(gpt_mixed / e["dir"] / "weights.safetensors").items()}
    for k, stage in enumerate(plan["stages"]):  # the weight bytes one rank of the stage holds (a tied one stored once)
        first = man["ranks"][mesh["stages"][k][0]]
        held = anywhere | _shapes(gpt_mixed / first["dir"] / "weights.safetensors")
        assert stage["param_bytes"] == 4 * sum(math.prod(held[w]) for w in set(first["weights"])), k
    full = {"attn.qkv.weight": [192, 64], "attn.proj.weight": [64, 64], "mlp.fc.weight": [256, 64],
            "mlp.proj.weight": [64, 256]}
    split = mesh["tensor_parallel"][0]["weights"]
    for entry in man["ranks"]:
        held = _shapes(gpt_mixed / entry["dir"] / "weights.safetensors")
        for name, shape in full.items():
            if entry["stage"] == 0:  # TP 2: half of each split weight, never the whole tensor
                want = list(shape)
                want[split[f"blocks.0.{name}"]["dim"]] //= 2
                assert held[f"blocks.0.{name}"] == want, (entry["rank"], name)
                assert f"blocks.1.{name}" not in held
            else:  # TP 1: the whole tensors of its own stage
                assert held[f"blocks.1.{name}"] == shape and f"blocks.0.{name}" not in held
    text = [(gpt_mixed / e["dir"] / "stage.py").read_text() for e in man["ranks"]]
    assert "tp_all_reduce(" in text[0] and "tp_all_reduce(" in text[1] and "tp_all_reduce(" not in text[2]


@pytest.mark.parametrize("edit, message", [
    (lambda m: m.update(format_version=2), r"tp_boundaries is 'leaders' exactly in a manifest of format version 3"),
    (lambda m: m["mesh"]["groups"][0].update(ranks=[1, 2]), r"needs pipeline holding ranks \[0, 2\]"),
    (lambda m: m["mesh"]["tensor_parallel"][1].update(group="tp-0"), r"mesh.tensor_parallel\[1\] must be stage 1"),
    (lambda m: m["ranks"][2]["tp"].update(degree=2), r"ranks\[2\]\.tp must be TP rank 0 of 1 in None"),
    (lambda m: (m["mesh"].pop("tp_boundaries"), m.update(format_version=2)),
     r"mesh.stages must give each stage its ranks in order, every rank once, all of one degree"),
])
def test_an_edited_mixed_mesh_is_refused(gpt_mixed, tmp_path, edit, message):
    with pytest.raises(HetpartError, match=message):
        load_manifest(edited_copy(gpt_mixed, tmp_path / "bad", edit))


def test_an_interleaved_schedule_is_refused_before_any_rank_starts(gpt_mixed, capsys):
    # Uniform TP plans crashed in every rank here (torch's interleaved schedule found no forward for its stage).
    assert main(["run", str(gpt_mixed), "--mode", "training", "--schedule", "interleaved-1f1b"]) == 2
    assert "tensor-parallel groups of one stage per rank: run with --schedule gpipe or 1f1b" in capsys.readouterr().err


def test_gpt_tp2_then_tp1_trains_1f1b_equal_to_the_model_and_checkpoints_each_rank_s_layout(gpt_mixed, tmp_path,
                                                                                           capsys):
    """2 steps with a checkpoint: the TP-2 ranks write their shards, the TP-1 rank whole tensors (NOTE [checkpoint
    slices]). Resuming it (into this plan, a plain one and a uniform TP one) verified by hand: docs/benchmarks.md
    "Mixed degrees written and run"; the reader of layouts is tests/runtime/test_checkpoint_slices.py's."""
    ck = tmp_path / "ck"
    assert main(["run", str(gpt_mixed), "--mode", "training", "--steps", "2", "--verify", "--checkpoint-every", "2",
                 "--checkpoint-dir", str(ck)]) == 0
    ran = capsys.readouterr().out
    assert "3 rank(s)" in ran and "1f1b" in ran and "verify: PASS" in ran and "max_weight_rel_err=" in ran, ran
    step = ck / "step-000002"
    layout = {r: json.loads((step / f"rank{r}.json").read_text())["layout"] for r in range(3)}
    assert layout[1]["weight/blocks.0.attn.qkv.weight"] == {"shape": [192, 64], "dim": 0,
                                                             "slices": [[32, 64], [96, 128], [160, 192]]}
    assert _shapes(step / "rank1.safetensors")["weight/blocks.0.attn.qkv.weight"] == [96, 64]
    assert layout[2]["weight/blocks.1.attn.qkv.weight"] == {"shape": [192, 64], "replicated": True}
    assert _shapes(step / "rank2.safetensors")["weight/blocks.1.attn.qkv.weight"] == [192, 64]


def test_gpt_tp2_then_tp1_inference_equals_the_model_and_is_measured_per_rank(gpt_mixed, capsys):
    assert main(["run", str(gpt_mixed), "--verify", "--measure", "--steps", "2"]) == 0
    ran = capsys.readouterr().out
    assert "3 rank(s)" in ran and "inference" in ran and "verify: PASS" in ran
    measured = json.loads((gpt_mixed / "measured.json").read_text())  # each rank on its own stage's device
    assert [s["device"] for s in measured["stages"]] == ["a/0", "a/1", "b/0"]
    timeline = measured["timeline"]
    # every all-reduce of the TP-2 stage recorded on both ranks, none on the TP-1 one (NOTE [collective skew])
    calls = [[e for e in events if e["kind"] == "collective"] for events in timeline["ranks"]]
    assert calls[0] and len(calls[0]) == len(calls[1]) and not calls[2]
    assert {(e["op"], tuple(e["group"])) for e in calls[0] + calls[1]} == {("all_reduce", (0, 1))}
    assert [e["bytes"] for e in calls[0]] == [e["bytes"] for e in calls[1]]
    split = timeline["collectives"]  # the measured step's forwards, 2 microbatches: the medians are means
    assert [r["rank"] for r in split] == [0, 1]
    for r in split:
        assert r["collectives_per_forward"] == len(calls[0]) / 4  # 2 steps of 2 microbatches
        assert r["ops_wall_us"] > 0 and r["ops_cpu_us"] > 0 and r["skew_us"] >= 0 and r["itself_us"] > 0
        assert r["ops_wall_us"] + r["skew_us"] + r["itself_us"] == pytest.approx(r["forward_us"], abs=0.01)


def test_llama_tp1_then_tp2_trains_1f1b_equal_to_the_model(tmp_path, capsys):
    # Machine a (1 device of 0.5 MiB) can hold only the embedding: the TP-2 stage is last, its follower computes
    # the loss on its own replicated outputs and the vocab-parallel head gathers its logits.
    cluster = _cluster(tmp_path / "two.toml", "a", "b", "0.5 MiB", "0.9 MiB")
    out = tmp_path / "llama"
    assert main(["partition", *LLAMA, "--cluster", str(cluster), "--out", str(out), *SMALL,
                 "--tensor-parallel", "b=2"]) == 0
    man = json.loads((out / "manifest.json").read_text())
    assert [e["degree"] for e in man["mesh"]["tensor_parallel"]] == [1, 2]
    assert "output.weight" in man["mesh"]["tensor_parallel"][1]["weights"]  # the LM head, vocab-parallel
    capsys.readouterr()
    assert main(["run", str(out), "--mode", "training", "--verify"]) == 0
    ran = capsys.readouterr().out
    assert "3 rank(s)" in ran and "verify: PASS" in ran and "max_grad_rel_err=" in ran, ran
