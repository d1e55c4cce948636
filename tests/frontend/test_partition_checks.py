"""Plans that could not run are refused (or warned about) by `partition`, before anything is written:
a file model's example batch against --batch-size, outputs that are not flat tensors, ops that mix
the batch, and 1F1B with fewer microbatches than stages."""

from __future__ import annotations

import json

import pytest
import torch

from hetpart.cli import main
from hetpart.frontend import ModelSpec, load_model
from hetpart.frontend.batch_mixing import batch_mixing
from hetpart.frontend.export import export_model

MODELS_PY = '''\
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        h = self.lin(x)
        if self.kind == "dict":
            return {"hidden": h, "out": torch.relu(h)}
        if self.kind == "list":
            return [h, h + 1]
        if self.kind == "nested":
            return (h, (h, h))
        if self.kind == "none":
            return (h, None)
        if self.kind == "in-batch":
            return torch.log_softmax(h @ h.T, dim=-1)
        return h


def fixed(kind="tensor"):
    return Net(kind), (torch.randn(4, 8),)


def sized(kind="tensor", batch_size=3):
    return Net(kind), (torch.randn(int(batch_size), 8),)
'''


@pytest.fixture()
def models(tmp_path):
    (tmp_path / "models.py").write_text(MODELS_PY)
    return tmp_path / "models.py"


def _partition(model: str, tmp_path, *extra: str) -> int:
    return main(["partition", model, "--cluster", "preset:cpu-2", "--out", str(tmp_path / "out"), "--no-pt2", *extra])


def _error(capfd) -> str:
    err = capfd.readouterr().err
    assert err.startswith("hetpart: error: ") and "Traceback" not in err, err
    return err


def test_an_example_batch_other_than_batch_size_is_refused(models, tmp_path, capfd):
    assert _partition(f"{models}:fixed", tmp_path, "--batch-size", "8") == 2
    err = _error(capfd)
    assert "fixed() returns example inputs whose batch (dim 0) is not --batch-size 8 (input 0: 4)" in err, err
    assert "pass --batch-size 4, or give fixed() a `batch_size` parameter" in err
    assert not (tmp_path / "out").exists()
    assert _partition(f"{models}:fixed", tmp_path, "--batch-size", "4", "--microbatches", "2") == 0
    capfd.readouterr()
    # `run` at another batch: refused before any rank starts
    assert main(["run", str(tmp_path / "out"), "--batch-size", "8", "--trust-model-file"]) == 2
    assert "is not --batch-size 8 (input 0: 4)" in _error(capfd)
    assert not (tmp_path / "out" / "logs").exists()


def test_a_function_with_a_batch_size_parameter_is_built_at_batch_size(models):
    _, inputs = load_model(ModelSpec(f"{models}:sized", {}, batch_size=6))
    assert inputs[0].shape[0] == 6
    _, inputs = load_model(ModelSpec(f"{models}:sized", {"batch_size": "5"}, batch_size=6))
    assert inputs[0].shape[0] == 5, "an explicit --set batch_size wins"


@pytest.mark.parametrize("kind, names", [("dict", ["hidden", "out"]), ("list", ["[0]", "[1]"]),
                                         ("tensor", [""])])
def test_dict_and_list_outputs_are_flattened_and_recorded(kind, names, models, tmp_path):
    assert _partition(f"{models}:sized", tmp_path, "--set", f"kind={kind}", "--batch-size", "4") == 0
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert plan["outputs"] == {"type": kind, "names": names}
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert len(manifest["ranks"][-1]["outputs"]) == len(names)


@pytest.mark.parametrize("kind, expect", [
    ("nested", "Net.forward returns a nested structure, (*, (*, *)) (* is a value)"),
    ("none", "Net.forward's output [1] is NoneType (None), not a tensor"),
])
def test_outputs_that_are_not_flat_tensors_are_refused(kind, expect, models, tmp_path, capfd):
    assert _partition(f"{models}:sized", tmp_path, "--set", f"kind={kind}", "--batch-size", "4") == 2
    assert expect in _error(capfd)
    assert not (tmp_path / "out").exists()


class _Mixing(torch.nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.bn = torch.nn.BatchNorm1d(8)

    def forward(self, x):
        if self.kind == "bn-train":
            return self.bn(x)
        if self.kind == "mean":
            return x - x.mean(0, keepdim=True)
        if self.kind == "softmax0":
            return torch.softmax(x, dim=0)
        if self.kind == "first":
            return x * x[0]
        if self.kind == "shape-only":
            return x + x.new_zeros(8)
        return torch.softmax(self.bn(x), dim=-1)  # per sample: batch norm in eval mode, softmax over features


@pytest.mark.parametrize("kind, op, why", [
    ("bn-train", "batch_norm", "batch norm in training mode"),
    ("mean", "aten.mean.dim", "its inputs carry the batch and its result does not"),
    ("softmax0", "aten.softmax.int", "it runs along dim 0, which carries the batch"),
    ("first", "aten.select.int", "its inputs carry the batch and its result does not"),
    ("shape-only", None, None),
    ("per-sample", None, None),
])
def test_ops_that_mix_the_batch_are_found(kind, op, why):
    module = _Mixing(kind).train(kind == "bn-train")
    found = batch_mixing(export_model(module, (torch.randn(4, 8),)))
    if op is None:
        assert found == []
    else:
        assert len(found) == 1 and op in found[0].op and why in found[0].why, found


def test_the_zoo_transformers_mix_nothing(annotated):
    assert batch_mixing(annotated("gpt-small")) == []


def test_batch_mixing_is_a_warning_naming_the_op_and_its_line(models, tmp_path, capsys):
    assert _partition(f"{models}:sized", tmp_path, "--set", "kind=in-batch", "--batch-size", "4") == 0
    out = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert f"warning: aten.matmul.default (matmul at {models}:22 in forward (`return torch.log_softmax(h @ h.T, " \
           "dim=-1)`)): its result has the batch in 2 dimensions" in out, out
    assert "pass --microbatches 1 if the batch must stay whole" in out


def test_1f1b_plans_at_most_as_many_stages_as_microbatches(tmp_path, capsys):
    # zoo:mlp at this size splits over all four CPUs of cpu-4 with GPipe.
    args = ["partition", "zoo:mlp", "--set", "hidden=512", "--set", "n_blocks=4", "--batch-size", "64",
            "--microbatches", "2", "--cluster", "preset:cpu-4", "--no-pt2", "--mode", "training"]
    assert main([*args, "--out", str(tmp_path / "gpipe"), "--schedule", "gpipe"]) == 0
    assert len(json.loads((tmp_path / "gpipe" / "plan.json").read_text())["stages"]) > 2
    capsys.readouterr()
    assert main([*args, "--out", str(tmp_path / "1f1b"), "--schedule", "1f1b"]) == 0
    assert "planning at most 2 stage(s) (--microbatches 2)" in " ".join(capsys.readouterr().out.split())
    assert len(json.loads((tmp_path / "1f1b" / "plan.json").read_text())["stages"]) <= 2
