"""Each weight's bytes are in one file of an output directory (NOTE [weights stored once]), and the rank that
reads a weight another rank stores loads it from there, checked by hash."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from hetpart.cli import main
from hetpart.errors import HetpartError
from hetpart.frontend import ModelSpec, load_model
from hetpart.runtime.artifacts import load_manifest, load_stage
from hetpart.runtime.pt2 import load_pt2
from tests.codegen.test_pt2_weights import corrupted_copy, pt2_tensors, safetensors_tensors

# GPT-2-like, its LM head tied to the token embedding: stage 0 and the last stage read one weight.
GPT = ["zoo:gpt-small", "--set", "n_layer=2", "--set", "n_embd=32", "--set", "n_head=2", "--set", "vocab_size=64",
       "--set", "block_size=16", "--seq-len", "16", "--batch-size", "4", "--cluster", "preset:mixed-4"]


@pytest.fixture(scope="module")
def tied_out(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tied") / "out"
    assert main(["partition", *GPT, "--out", str(out), "--time-limit", "2"]) == 0
    return out


def _tensor_bytes_by_file(out: Path) -> dict[str, list[str]]:
    """sha256 of a tensor's bytes -> the files (and keys) holding them, over every file of `out`."""
    found: dict[str, list[str]] = {}
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        tensors = (safetensors_tensors(path) if path.suffix == ".safetensors"
                   else pt2_tensors(path) if path.suffix == ".pt2" else {})
        for key, raw in tensors.items():
            if raw:
                found.setdefault(hashlib.sha256(raw).hexdigest(), []).append(f"{path.relative_to(out)}:{key}")
    return found


def tensor_copies(out: Path, module: torch.nn.Module) -> dict[str, list[str]]:
    """Each weight of `module` whose bytes are in more or fewer than one file of `out` -> where they are.
    Constant-filled tensors (LayerNorm's ones, zero biases) are equal by value, not copies: left out."""
    found = _tensor_bytes_by_file(out)
    copies = {}
    for key, t in module.state_dict().items():
        if t.numel() > 1 and not (t == t.flatten()[0]).all():
            where = found.get(hashlib.sha256(t.detach().contiguous().numpy().tobytes()).hexdigest(), [])
            if len(where) != 1:
                copies[key] = where
    return copies


def test_no_tensor_bytes_appear_in_two_files(tied_out):
    module, _ = load_model(ModelSpec.from_json(json.loads((tied_out / "plan.json").read_text())["model"]))
    tied = module.lm_head.weight
    assert tied is module.wte.weight
    manifest = load_manifest(tied_out)
    holders = [e["rank"] for e in manifest["ranks"] if "lm_head.weight" in e["weights"]]
    assert len(holders) >= 2, "the plan should put the embedding and the LM head on different ranks"
    assert tensor_copies(tied_out, module) == {}
    assert _tensor_bytes_by_file(tied_out)[hashlib.sha256(tied.detach().numpy().tobytes()).hexdigest()] == [
        f"rank{holders[0]}/weights.safetensors:lm_head.weight"]


def test_the_later_rank_loads_the_one_copy(tied_out):
    manifest = load_manifest(tied_out)
    first, last = manifest["ranks"][0], manifest["ranks"][-1]
    assert "lm_head.weight" in last["weights"]
    assert last["files"]["../rank0/weights.safetensors"] == first["files"]["weights.safetensors"]
    from_py = load_stage(tied_out, last)
    from_pt2 = load_pt2(tied_out, last)
    stored = safetensors_tensors(tied_out / "rank0" / "weights.safetensors")["lm_head.weight"]
    for module in (from_py, from_pt2):
        weights = [t for t in module.state_dict().values() if t.shape == (64, 32)]
        assert [w.numpy().tobytes() for w in weights] == [stored]
    x = torch.randn(3, 16, 32)
    with torch.no_grad():
        torch.testing.assert_close(from_pt2(x), from_py(x), rtol=0, atol=0)


def test_a_changed_copy_is_refused_by_the_rank_that_reads_it(tied_out, tmp_path):
    out = corrupted_copy(tied_out, tmp_path, "rank0/weights.safetensors")
    last = load_manifest(out)["ranks"][-1]
    for load in (load_stage, load_pt2):
        with pytest.raises(HetpartError, match=r"rank3/\.\./rank0/weights\.safetensors' does not match its sha256"):
            load(out, last)


@pytest.mark.parametrize(("name", "why"), [
    ("../rank1/weights.safetensors", "must be an earlier rank's weights.safetensors"),  # another hash
    ("../rank3/weights.safetensors", "must be an earlier rank's weights.safetensors"),  # its own
    ("../../elsewhere/weights.safetensors", "must be an earlier rank's weights.safetensors"),
    ("../rank0/stage.py", "is not a plain name"),
])
def test_the_manifest_refuses_other_references(tied_out, tmp_path, name, why):
    out = tmp_path / "copy"
    shutil.copytree(tied_out, out)
    manifest = json.loads((out / "manifest.json").read_text())
    files = manifest["ranks"][-1]["files"]
    files[name] = files.pop("../rank0/weights.safetensors")  # rank 0's hash, under another name
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(HetpartError, match=why):
        load_manifest(out)
