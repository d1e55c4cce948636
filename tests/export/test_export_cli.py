"""`hetpart export` and `partition --align layers` end to end on a small GPT: the accelerate
device map dispatched by accelerate itself, and the CLI's errors."""

from __future__ import annotations

import json

import pytest
import torch

from hetpart.cli import main
from hetpart.frontend import ModelSpec
from hetpart.frontend.load import load_for_tracing

GPT = ["zoo:gpt-small", "--set", "n_layer=3", "--set", "n_embd=32", "--set", "n_head=2", "--set", "vocab_size=64",
       "--set", "block_size=16", "--seq-len", "8", "--no-pt2", "--time-limit", "5"]
CLUSTER = """
[[nodes]]
name = "box"
devices = ["a100-80g", "t4-16g"]
link = { bandwidth_GBps = 16, latency_us = 5 }
"""


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """Two plans of one model on one machine: op by op, and with whole layers."""
    root = tmp_path_factory.mktemp("export")
    (root / "box.toml").write_text(CLUSTER)
    dirs = {}
    for align in ("ops", "layers"):
        dirs[align] = root / align
        assert main(["partition", *GPT, "--cluster", str(root / "box.toml"), "--out", str(dirs[align]),
                     "--align", align]) == 0
    return dirs


def test_align_layers_is_within_the_reported_rounding_loss(planned):
    ops = json.loads((planned["ops"] / "plan.json").read_text())
    layers = json.loads((planned["layers"] / "plan.json").read_text())
    assert layers["align"] == "layers" and layers["layers"]["aligned"]
    assert ops["bottleneck_us"] <= layers["bottleneck_us"] * (1 + 1e-6)
    assert layers["bottleneck_us"] <= ops["layers"]["rounded_bottleneck_us"] * (1 + 1e-6)


def test_accelerate_dispatches_the_exported_device_map(planned, tmp_path, capsys):
    out = tmp_path / "device_map.json"
    assert main(["export", str(planned["layers"]), "--format", "accelerate", "--out", str(out)]) == 0
    assert "carries over" in capsys.readouterr().err
    dmap = json.loads(out.read_text())
    assert set(dmap.values()) == {0, 1}

    accelerate = pytest.importorskip("accelerate")  # the dev extra installs it
    from accelerate.utils import check_device_map

    dispatch_model = accelerate.dispatch_model

    spec = ModelSpec(GPT[0], dict(a.split("=") for a in GPT[2:10:2]), batch_size=8, seq_len=8)
    model, inputs, _ = load_for_tracing(spec, meta=False)
    check_device_map(model, dmap)  # every parameter of the real model is placed
    with torch.no_grad():
        expected = model(*inputs)
    # This machine has no GPU: the GPUs' modules run on the CPU, every module still gets its own hook.
    on_cpu = {name: "cpu" for name in dmap}
    dispatched = dispatch_model(model, on_cpu, main_device="cpu", force_hooks=True)
    for name in dmap:
        assert dispatched.get_submodule(name)._hf_hook.execution_device == "cpu"
    with torch.no_grad():
        torch.testing.assert_close(dispatched(*inputs), expected)


def test_export_errors_are_one_line(planned, tmp_path, capsys):
    assert main(["export", str(tmp_path / "nope"), "--format", "megatron"]) == 2
    assert "not found" in capsys.readouterr().err
    assert main(["export", str(planned["ops"]), "--format", "caffe"]) == 2
    assert "invalid choice: 'caffe'" in capsys.readouterr().err
    assert main(["export", str(planned["ops"]), "--format", "megatron", "--out", str(tmp_path / "no" / "x")]) == 2
    assert "No such file or directory" in capsys.readouterr().err
    assert not (tmp_path / "no").exists()
    plan = planned["ops"] / "plan.json"
    text = plan.read_text()
    try:
        plan.write_text(text.replace('"mode"', '"mode" ', 1))  # tampered: the manifest's sha256 no longer matches
        assert main(["export", str(planned["ops"]), "--format", "deepspeed"]) == 2
        assert "plan.json" in capsys.readouterr().err
    finally:
        plan.write_text(text)


def test_export_out_a_device_or_fifo_is_refused_even_with_force(planned, tmp_path, capsys):
    """review22: `--out /dev/null --force` (root) replaced the device node with a regular file, and without --force
    the error advised --force. A FIFO stands in for the device; /dev/stdout is refused by name (asked without
    --force, so that a hetpart without the check cannot replace the test machine's)."""
    import os
    import stat

    os.mkfifo(tmp_path / "fifo")
    for out, force in ((tmp_path / "fifo", ["--force"]), ("/dev/stdout", [])):  # never --force on the real one
        assert main(["export", str(planned["ops"]), "--format", "megatron", "--out", str(out), *force]) == 2
        err = capsys.readouterr().err
        assert "not a file" in err and "leave out --out" in err and "--force" not in err.split("error:")[1]
    assert stat.S_ISFIFO((tmp_path / "fifo").lstat().st_mode) and os.listdir(tmp_path) == ["fifo"]
