"""Plans traced on meta: per-rank weight manifests, and `hetpart shard-weights` filling them."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file, save_model

from hetpart.cli import main
from hetpart.codegen.weights import WeightEntry, write_safetensors_streaming
from hetpart.frontend import ModelSpec, load_model
from hetpart.runtime.artifacts import load_manifest, load_stage

GPT = ["--set", "n_layer=2", "--set", "n_embd=64", "--set", "n_head=4", "--set", "vocab_size=128",
       "--set", "block_size=16"]
LLAMA = ["--set", "num_hidden_layers=2", "--set", "hidden_size=64", "--set", "intermediate_size=128",
         "--set", "num_attention_heads=4", "--set", "num_key_value_heads=2", "--set", "vocab_size=128"]


def partition(out, model: str, sets: list[str], *extra: str) -> None:
    assert main(["partition", model, *sets, "--cluster", "preset:mixed-4", "--out", str(out), "--batch-size", "4",
                 "--seq-len", "16", "--time-limit", "5", *extra]) == 0


def run_stages(out) -> tuple[torch.Tensor, ...]:
    """The stages back to back in this process on the plan's example inputs, and the original's outputs."""
    plan = json.loads((out / "plan.json").read_text())
    module, inputs = load_model(ModelSpec.from_json(plan["model"]))
    values = inputs
    with torch.no_grad():
        for entry in load_manifest(out)["ranks"]:
            values = tuple(load_stage(out, entry)(*values))
        expected = module(*inputs)
    return values, tuple(expected) if isinstance(expected, (tuple, list)) else (expected,)


@pytest.fixture(scope="module")
def gpt_meta(tmp_path_factory):
    out = tmp_path_factory.mktemp("meta") / "out"
    partition(out, "zoo:gpt-small", GPT, "--meta")
    return out


def test_meta_plan_has_manifests_not_weights(gpt_meta, capsys):
    plan = json.loads((gpt_meta / "plan.json").read_text())
    assert plan["weights"] == "manifest"
    manifest = load_manifest(gpt_meta)
    total = 0
    for entry in manifest["ranks"]:
        rank_dir = gpt_meta / entry["dir"]
        assert not (rank_dir / "weights.safetensors").exists() and not (rank_dir / "stage.pt2").exists()
        manifest_json = json.loads((rank_dir / "weights.json").read_text())
        tensors, shared = manifest_json["tensors"], manifest_json.get("shared", {})
        assert {t["key"] for t in tensors} | set(shared) == set(entry["weights"])
        assert not {t["key"] for t in tensors} & set(shared)
        total += sum(WeightEntry.from_json(t).nbytes for t in tensors if t["required"])
    # every parameter of the model is in one rank's manifest (the tied head once: NOTE [weights stored once])
    module, _ = load_model(ModelSpec.from_json(plan["model"]))
    assert total == sum(p.numel() * 4 for p in module.parameters())
    assert main(["run", str(gpt_meta)]) == 2
    assert "shard-weights" in capsys.readouterr().err


def test_shard_weights_from_sharded_index_runs_like_the_original(gpt_meta, tmp_path, capsys):
    out = tmp_path / "out"
    shutil.copytree(gpt_meta, out)
    module, _ = load_model(ModelSpec.from_json(json.loads((out / "plan.json").read_text())["model"]))
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    save_model(module, str(ckpt / "full.safetensors"))  # tied weights stored once, as HF does
    full = load_file(str(ckpt / "full.safetensors"))
    (ckpt / "full.safetensors").unlink()
    keys = sorted(full)
    weight_map = {}
    for i, part in enumerate((keys[: len(keys) // 2], keys[len(keys) // 2:])):
        save_file({k: full[k] for k in part}, str(ckpt / f"model-{i}.safetensors"))
        weight_map.update({k: f"model-{i}.safetensors" for k in part})
    (ckpt / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert main(["shard-weights", str(out), str(ckpt)]) == 0
    printed = capsys.readouterr().out
    assert "wrote weights.safetensors for" in printed
    from hetpart.units import format_bytes

    # Sizes as every message prints them (units.format_bytes): this model's ~0.1 MB once printed as "0.1 MB".
    total = sum(WeightEntry.from_json(t).nbytes for e in load_manifest(out)["ranks"]
                for t in json.loads((out / e["dir"] / "weights.json").read_text())["tensors"])
    assert f"tensor(s), {format_bytes(total)}, " in printed, printed
    got, expected = run_stages(out)
    assert len(got) == len(expected) and all(torch.equal(a, b) for a, b in zip(got, expected))
    from tests.test_artifacts_speed_weights import tensor_copies

    assert tensor_copies(out, module) == {}, "the tied head is filled once (NOTE [weights stored once])"
    ranks = load_manifest(out)["ranks"]
    assert ranks[-1]["files"]["../rank0/weights.safetensors"] == ranks[0]["files"]["weights.safetensors"]


def test_hf_checkpoint_names_and_non_persistent_buffers(tmp_path):
    """hf:llama: the checkpoint names weights without the wrapper's `model.` prefix, and RoPE's
    non-persistent inv_freq is in no checkpoint: it ships in constants.safetensors."""
    out = tmp_path / "out"
    partition(out, "hf:llama", LLAMA, "--meta")
    constants = {k for e in load_manifest(out)["ranks"] for k in load_file(str(out / e["dir"] / "constants.safetensors"))}
    assert any(k.endswith("inv_freq") for k in constants)
    module, _ = load_model(ModelSpec.from_json(json.loads((out / "plan.json").read_text())["model"]))
    save_model(module.model, str(tmp_path / "model.safetensors"))
    assert main(["shard-weights", str(out), str(tmp_path / "model.safetensors")]) == 0
    got, expected = run_stages(out)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))


def test_mismatched_checkpoint_is_refused_and_nothing_written(gpt_meta, tmp_path, capsys):
    wrong, _ = load_model(ModelSpec("zoo:gpt-small", {"n_layer": "2", "n_embd": "32", "n_head": "4",
                                                      "vocab_size": "128", "block_size": "16"}, seq_len=16))
    save_model(wrong, str(tmp_path / "wrong.safetensors"))
    assert main(["shard-weights", str(gpt_meta), str(tmp_path / "wrong.safetensors")]) == 2
    err = capsys.readouterr().err
    assert "has shape [128, 32] in the checkpoint, the plan needs [128, 64]" in err and "nothing was written" in err
    assert not list(gpt_meta.glob("rank*/weights.safetensors"))
    partial = {k: v for k, v in load_file(str(tmp_path / "wrong.safetensors")).items() if "blocks.1" not in k}
    save_file(partial, str(tmp_path / "partial.safetensors"))
    assert main(["shard-weights", str(gpt_meta), str(tmp_path / "partial.safetensors")]) == 2
    assert "'blocks.1.attn.qkv.weight' is not in the checkpoint" in capsys.readouterr().err


def test_dtype_mismatch_needs_allow_cast(gpt_meta, tmp_path, capsys):
    out = tmp_path / "out"
    shutil.copytree(gpt_meta, out)
    module, _ = load_model(ModelSpec.from_json(json.loads((out / "plan.json").read_text())["model"]))
    save_model(module.to(torch.bfloat16), str(tmp_path / "bf16.safetensors"))
    assert main(["shard-weights", str(out), str(tmp_path / "bf16.safetensors")]) == 2
    assert "is BF16 in the checkpoint, the plan traced F32" in capsys.readouterr().err
    assert main(["shard-weights", str(out), str(tmp_path / "bf16.safetensors"), "--allow-cast"]) == 0
    assert "converted" in capsys.readouterr().out
    w = load_file(str(out / "rank0" / "weights.safetensors"))
    assert all(t.dtype == torch.float32 for t in w.values())


def test_streaming_writer_matches_safetensors(tmp_path):
    tensors = {"a": torch.randn(3, 5), "b": torch.arange(7), "c": torch.randn(4, 2).to(torch.bfloat16),
               "d": torch.zeros(0, 3), "e": torch.tensor(True)}
    entries = [WeightEntry(k, tuple(t.shape), n, (), True) for k, t, n in
               zip(tensors, tensors.values(), ["F32", "I64", "BF16", "F32", "BOOL"])]
    with (tmp_path / "w.safetensors").open("wb") as f:
        digest = write_safetensors_streaming(f, entries, lambda e: tensors[e.key])
    assert digest == hashlib.sha256((tmp_path / "w.safetensors").read_bytes()).hexdigest()
    back = load_file(str(tmp_path / "w.safetensors"))
    assert set(back) == set(tensors) and all(torch.equal(back[k], tensors[k]) for k in tensors)


def test_auto_meta_when_weights_exceed_memory(tmp_path, monkeypatch):
    from hetpart.frontend import load

    monkeypatch.setattr(load, "available_memory_bytes", lambda: 1 << 16)  # 64 KiB "free": the model is bigger
    out = tmp_path / "out"
    partition(out, "zoo:gpt-small", GPT)
    assert json.loads((out / "plan.json").read_text())["weights"] == "manifest"
    monkeypatch.setattr(load, "available_memory_bytes", lambda: 1 << 40)
    partition(tmp_path / "out2", "zoo:gpt-small", GPT, "--no-pt2")
    assert json.loads((tmp_path / "out2" / "plan.json").read_text())["weights"] == "included"


def test_meta_only_zoo_model_costs_no_weight_memory(tmp_path):
    """zoo:llama-7b with one layer is 1.2 GB of fp32 parameters: partitioning it in a fresh process
    must not allocate them (its peak RSS stays far below), and the plan lists them in manifests."""
    out = tmp_path / "out"
    code = (
        "import sys\nfrom hetpart.cli import main\n"
        f"rc = main(['partition', 'zoo:llama-7b', '--set', 'n_layers=1', '--cluster', 'preset:a100-t4-8', "
        f"'--out', {str(out)!r}, '--batch-size', '2', '--microbatches', '1', '--seq-len', '16', '--time-limit', '5'])\n"
        "hwm = next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).split()[1]\n"
        "print('HWM', int(hwm) * 1024)\nsys.exit(rc)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    assert proc.returncode == 0, proc.stderr
    peak = int(proc.stdout.split("HWM")[-1])
    required = sum(WeightEntry.from_json(t).nbytes for e in load_manifest(out)["ranks"]
                   for t in json.loads((out / e["dir"] / "weights.json").read_text())["tensors"] if t["required"])
    assert required > 1_200_000_000  # embeddings, one layer and the head, listed for shard-weights
    assert peak < required * 0.8, f"peak RSS {peak / 1e9:.2f} GB: the weights were allocated"


def test_shard_weights_bad_paths(gpt_meta, tmp_path, capsys):
    assert main(["shard-weights", str(gpt_meta), str(tmp_path / "missing.safetensors")]) == 2
    assert "checkpoint" in capsys.readouterr().err and not list(gpt_meta.glob("rank*/weights.safetensors"))
    (tmp_path / "junk.safetensors").write_bytes(b"\xff" * 64)
    assert main(["shard-weights", str(gpt_meta), str(tmp_path / "junk.safetensors")]) == 2
    assert "not a safetensors file" in capsys.readouterr().err
    full = tmp_path / "full"
    assert main(["partition", "zoo:mlp", "--set", "hidden=16", "--cluster", "preset:cpu-2", "--out", str(full),
                 "--no-pt2", "--time-limit", "5"]) == 0
    capsys.readouterr()
    assert main(["shard-weights", str(full), str(tmp_path / "junk.safetensors")]) == 2
    assert "shard-weights fills plans made with `partition --meta`" in capsys.readouterr().err
