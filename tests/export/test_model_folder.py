"""A file model imports a module beside it (NOTE [model file folder] in hetpart/frontend/load.py)."""

from __future__ import annotations

import json
import sys

import pytest

from hetpart.cli import main
from hetpart.frontend import ModelSpec, load_model

HELPER = "hetpart_test_sibling_blocks"  # a name no other test imports

MODEL = f"""
import torch
from torch import nn
from {HELPER} import Block   # beside this file

def build(batch_size):
    torch.manual_seed(0)
    return nn.Sequential(Block(8), Block(8)), (torch.randn(batch_size, 8),)
"""

BLOCK = """
from torch import nn

class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        return x + self.fc(x).relu()
"""


@pytest.fixture
def model_dir(tmp_path):
    (tmp_path / "model.py").write_text(MODEL)
    (tmp_path / f"{HELPER}.py").write_text(BLOCK)
    yield tmp_path
    sys.modules.pop(HELPER, None)


def test_file_model_imports_a_module_beside_it_and_leaves_sys_path_as_it_was(model_dir):
    before = list(sys.path)
    module, inputs = load_model(ModelSpec(f"{model_dir / 'model.py'}:build", {}, batch_size=4, seq_len=1))
    assert type(module[0]).__name__ == "Block" and module(*inputs).shape == (4, 8)
    assert sys.path == before
    assert not (model_dir / "__pycache__").exists()  # no bytecode written beside the model


def test_partition_of_a_file_model_with_a_sibling_module(model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("sibling") / "out"
    sys.modules.pop(HELPER, None)  # imported again, from its folder, by partition itself
    assert main(["partition", f"{model_dir / 'model.py'}:build", "--cluster", "preset:cpu-2", "--out", str(out),
                 "--no-pt2", "--time-limit", "5"]) == 0
    assert json.loads((out / "plan.json").read_text())["model"]["file_sha256"]


def test_without_the_sibling_the_import_error_names_the_file(model_dir, capsys):
    (model_dir / f"{HELPER}.py").unlink()
    sys.modules.pop(HELPER, None)
    with pytest.raises(Exception, match=f"importing the model file failed: ModuleNotFoundError: No module named '{HELPER}'"):
        load_model(ModelSpec(f"{model_dir / 'model.py'}:build", {}, batch_size=4, seq_len=1))
