"""A model file is imported from the bytes whose sha256 is checked (NOTE [model file bytes] in
hetpart/frontend/load.py): a bytecode cache planted next to it never runs."""

from __future__ import annotations

import hashlib
import os
import py_compile
import sys
from pathlib import Path

from hetpart.frontend import ModelSpec, load_model, model_file_sha256

MODEL_PY = """import torch
from torch import nn


def build(batch_size=8):
    return nn.Linear(4, 2), (torch.randn(batch_size, 4),)
"""


def _plant_pyc(model: Path, canary: Path) -> None:
    """`__pycache__/<name>.<tag>.pyc` compiled from other code with the model file's size and mtime:
    a timestamp pyc that Python's import would take for the model file's own."""
    payload = f"open({str(canary)!r}, 'w').write('x')\n"
    model.write_text(MODEL_PY + "#" * len(payload) + "\n")  # a comment: room for the payload in the pyc's source
    src = model.with_name("evil_src.py")
    src.write_text(payload + MODEL_PY + "\n")
    assert src.stat().st_size == model.stat().st_size
    st = model.stat()
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    py_compile.compile(str(src), cfile=str(model.parent / "__pycache__" / f"{model.stem}.{sys.implementation.cache_tag}.pyc"),
                       invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)
    src.unlink()


def test_a_planted_pyc_never_runs_and_the_model_still_loads(tmp_path):
    model, canary = tmp_path / "model.py", tmp_path / "PWNED"
    _plant_pyc(model, canary)
    spec = ModelSpec(f"{model}:build")
    module, inputs = load_model(spec)
    assert not canary.exists(), "the planted .pyc ran"
    assert tuple(module(*inputs).shape) == (8, 2)
    assert model_file_sha256(spec) == hashlib.sha256(model.read_bytes()).hexdigest()
    assert sorted(p.name for p in (tmp_path / "__pycache__").iterdir()) == [
        f"model.{sys.implementation.cache_tag}.pyc"], "no bytecode cache written either"
