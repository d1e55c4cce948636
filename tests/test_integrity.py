"""Nothing lost, nothing trusted blindly: no pickle, no partial directories, reproducible bytes."""

from __future__ import annotations

import ast
import json
import pickle
import zipfile
from pathlib import Path

import pytest
import torch

import hetpart
from hetpart.cli import main
from hetpart.frontend import ModelSpec, load_model
from hetpart.runtime.artifacts import load_manifest, load_stage

GPT = ["zoo:gpt-small", "--set", "n_layer=2", "--set", "n_embd=32", "--set", "n_head=2", "--set", "vocab_size=64",
       "--set", "block_size=16", "--seq-len", "16", "--cluster", "preset:mixed-4"]
UNPICKLERS = {("torch", "load"), ("torch.export", "load"), ("pickle", "load"), ("pickle", "loads"),
              ("pickle", "Unpickler"), ("numpy", "load")}


@pytest.fixture(scope="module")
def gpt_twice(tmp_path_factory) -> tuple[Path, Path]:
    """The same partition command run twice, into two directories."""
    root = tmp_path_factory.mktemp("twice")
    for name in ("a", "b"):
        assert main(["partition", *GPT, "--out", str(root / name)]) == 0
    return root / "a", root / "b"


def test_hetpart_source_never_unpickles():
    # Static: no module of hetpart imports pickle (or a relative) or calls torch.load/torch.export.load.
    found = []
    for path in Path(hetpart.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
                found += [f"{path.name}: import {n}" for n in names if n in ("pickle", "dill", "cloudpickle", "joblib")]
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = ast.unparse(node.func.value)
                if (owner, node.func.attr) in UNPICKLERS:
                    found.append(f"{path.name}: {ast.unparse(node.func)}")
    # the one exception: hetpart.runtime.pt2 loads a .pt2 it checked holds no pickle (check_no_pickle)
    assert found == ["pt2.py: torch.export.load"]


def test_the_runtime_loads_ranks_without_unpickling(gpt_twice, monkeypatch):
    out = gpt_twice[0]
    spec = ModelSpec.from_json(json.loads((out / "plan.json").read_text())["model"])
    module, inputs = load_model(spec)

    def refuse(*args, **kwargs):
        raise AssertionError("something unpickled")

    for owner, attr in UNPICKLERS:
        if owner in ("torch", "pickle"):
            monkeypatch.setattr(torch if owner == "torch" else pickle, attr, refuse)
    monkeypatch.setattr(torch.export, "load", refuse)
    manifest = load_manifest(out)
    stages = [load_stage(out, entry) for entry in manifest["ranks"]]  # stage.py + weights.safetensors
    with torch.no_grad():
        values = inputs
        for stage in stages:
            values = stage(*values)
        torch.testing.assert_close(values[0], module(*inputs), rtol=0, atol=1e-5)


def test_pt2_archives_hold_json_and_raw_tensors_only(gpt_twice):
    # torch.export.save puts the example inputs in a torch.save pickle that torch.export.load would
    # unpickle (NOTE [deterministic .pt2]): hetpart's .pt2 files leave that record empty.
    out = gpt_twice[0]
    manifest = load_manifest(out)
    for entry in manifest["ranks"]:
        with zipfile.ZipFile(out / entry["dir"] / "stage.pt2") as z:
            for info in z.infolist():
                data = z.read(info.filename)
                assert not data.startswith(b"\x80"), f"{info.filename} is a pickle"
                assert not (data.startswith(b"PK") and b"data.pkl" in data), f"{info.filename} is a torch.save file"
                if info.filename.endswith("model_weights_config.json"):
                    config = json.loads(data)["config"]
                    assert not any(w["use_pickle"] for w in config.values())
        program = torch.export.load(str(out / entry["dir"] / "stage.pt2"))  # still loads
        assert program.example_inputs is None


def test_the_same_command_twice_gives_identical_files(gpt_twice):
    a, b = gpt_twice
    files = sorted(str(p.relative_to(a)) for p in a.rglob("*") if p.is_file())
    assert files == sorted(str(p.relative_to(b)) for p in b.rglob("*") if p.is_file())
    assert {"plan.json", "manifest.json", "rank0/stage.py", "rank0/stage.pt2", "ir/04-op-cost.txt",
            "ir/graph.json", "ir/partition.dot"} <= set(files)
    differ = [f for f in files if (a / f).read_bytes() != (b / f).read_bytes()]
    assert differ == ["timings.json"], "only timings.json holds run-specific numbers"


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, MemoryError])
def test_an_interrupted_partition_leaves_nothing(tmp_path, monkeypatch, capsys, interrupt):
    # The report is the last file written: everything else is in the staging directory by then.
    import hetpart.compile

    def fail(*args, **kwargs):
        raise interrupt()

    monkeypatch.setattr(hetpart.compile, "write_report", fail)
    argv = ["partition", "zoo:mlp", "--set", "hidden=32", "--cluster", "preset:cpu-2"]
    if interrupt is KeyboardInterrupt:
        assert main([*argv, "--out", str(tmp_path / "new" / "dirs" / "out")]) == 130
        assert "hetpart: interrupted" in capsys.readouterr().err
    else:
        with pytest.raises(MemoryError):
            main([*argv, "--out", str(tmp_path / "new" / "dirs" / "out")])
    assert list(tmp_path.iterdir()) == [], "no output, no staging directory, no parent it created"


def test_an_interrupted_partition_keeps_the_old_output(tmp_path, monkeypatch):
    out = tmp_path / "out"
    argv = ["partition", "zoo:mlp", "--set", "hidden=32", "--cluster", "preset:cpu-2", "--out", str(out), "--no-pt2"]
    assert main(argv) == 0
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    import hetpart.compile

    def fail(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(hetpart.compile, "write_report", fail)
    assert main([*argv, "--force", "--set", "n_blocks=3"]) == 130
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
