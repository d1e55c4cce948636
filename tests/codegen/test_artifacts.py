"""The artifacts directory: .pt2 programs, launch.sh, manifest fields."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hetpart.cli import main

ROOT = Path(__file__).resolve().parents[2]

LOAD_AND_RUN = """
import json, sys, torch
from pathlib import Path
from hetpart.runtime.artifacts import dim_size, symbol_sizes
from hetpart.runtime.pt2 import load_pt2
out, rank, sizes = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
manifest = json.load(open(f"{out}/manifest.json"))
entry = manifest["ranks"][rank]
program = load_pt2(Path(out), entry)  # the program, with weights.safetensors' tensors
shapes = []
for batch, seq in sizes:  # one load, called at each size
    args = []
    for i in entry["inputs"]:
        shape = [dim_size(d, symbol_sizes(manifest, batch, seq)) for d in i["shape"]]
        args.append(torch.randint(0, 64, shape) if i["dtype"] == "i64" else torch.randn(shape))
    shapes.append([list(o.shape) for o in program(*args)])
print(json.dumps(shapes))
"""


@pytest.fixture(scope="module")
def gpt_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("art") / "out"
    assert main(["partition", "zoo:gpt-small", "--set", "n_layer=2", "--set", "n_embd=64", "--set", "vocab_size=64",
                 "--set", "block_size=16", "--cluster", "preset:mixed-4", "--out", str(out), "--batch-size", "4",
                 "--seq-len", "16"]) == 0
    return out


def test_every_rank_has_a_hashed_pt2(gpt_out):
    manifest = json.loads((gpt_out / "manifest.json").read_text())
    for entry in manifest["ranks"]:
        assert "stage.pt2" in entry["files"]
        assert (gpt_out / entry["dir"] / "stage.pt2").is_file()


def test_pt2_loads_in_a_fresh_process_at_other_batches_and_lengths(gpt_out):
    # One fresh process (one torch import) for both sizes: batch 1 at the plan's length, and 7 x 9.
    sizes = [(1, 16), (7, 9)]
    manifest = json.loads((gpt_out / "manifest.json").read_text())
    assert json.loads((gpt_out / "plan.json").read_text())["dynamic"]["seq_len"]
    rank = len(manifest["ranks"]) - 1  # the last rank: its inputs are activations, not tokens
    proc = subprocess.run([sys.executable, "-c", LOAD_AND_RUN, str(gpt_out), str(rank), json.dumps(sizes)],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    shapes = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [outputs[0] for outputs in shapes] == [[batch, seq, 64] for batch, seq in sizes]


def test_manifest_nodes_and_devices(gpt_out):
    manifest = json.loads((gpt_out / "manifest.json").read_text())
    plan = json.loads((gpt_out / "plan.json").read_text())
    assert manifest["backend"] == "nccl"  # mixed-4 is all GPUs
    for entry, stage in zip(manifest["ranks"], plan["stages"]):
        assert entry["device"] == f"cuda:{stage['device'].rpartition('/')[2]}"
        assert entry["machine"] == stage["machine"]
    assert sorted(r for n in manifest["nodes"] for r in n["ranks"]) == list(range(manifest["world_size"]))
    assert (gpt_out / "launch.sh").stat().st_mode & 0o111
    proc = subprocess.run(["bash", "-n", str(gpt_out / "launch.sh")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_no_pt2_flag(tmp_path):
    out = tmp_path / "out"
    assert main(["partition", "zoo:mlp", "--set", "hidden=16", "--cluster", "preset:mixed-4", "--out", str(out),
                 "--no-pt2"]) == 0
    assert not list(out.glob("rank*/stage.pt2"))


def test_stage_code_names_no_device(gpt_out):
    """Factory ops (`arange` for positions) lose the tracing device: a stage creates on the device it runs on."""
    for stage_py in gpt_out.glob("rank*/stage.py"):
        text = stage_py.read_text()
        assert "device = " not in text.split("class Stage")[1] and "device(type=" not in text, stage_py
