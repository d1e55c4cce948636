"""End to end under a real torchrun: 2 CPU ranks, gloo, GPipe, --verify."""

import json

import pytest

from hetpart.cli import main


@pytest.fixture(scope="module")
def two_rank_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "out"
    args = ["partition", "zoo:gpt-small", "--set", "n_layer=2", "--set", "n_embd=64", "--set", "vocab_size=128",
            "--set", "block_size=16", "--cluster", "preset:cpu-2", "--out", str(out), "--batch-size", "4",
            "--seq-len", "16", "--microbatches", "2"]
    assert main(args) == 0
    return out


def test_two_ranks_verify(two_rank_out, capsys):
    plan = json.loads((two_rank_out / "plan.json").read_text())
    assert len(plan["stages"]) == 2, "the cpu-2 plan should use both devices"
    capsys.readouterr()
    assert main(["run", str(two_rank_out), "--verify"]) == 0
    out = capsys.readouterr().out
    diff = float(out.split("max_abs_diff=")[1].split()[0])
    assert diff <= 1e-5
    assert "verify: PASS" in out
    assert list((two_rank_out / "logs").rglob("*.log")), "per-rank logs are kept"


def test_tampered_weights_are_refused(two_rank_out, tmp_path, capsys):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(two_rank_out, copy)
    with (copy / "rank1" / "weights.safetensors").open("r+b") as f:
        f.seek(-4, 2)
        f.write(b"\x00\x01\x02\x03")
    assert main(["run", str(copy)]) == 2
    assert "does not match its sha256" in capsys.readouterr().err


def test_microbatches_must_divide_batch(two_rank_out, capsys):
    assert main(["run", str(two_rank_out), "--microbatches", "3"]) == 2
    assert "must be >= 1 and divide the batch size 4" in capsys.readouterr().err
