"""`hetpart run --batch-size/--seq-len` under a real torchrun, and its errors (before any rank starts)."""

import json

from hetpart.cli import main


def test_run_verifies_at_another_batch_and_sequence_length(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["partition", "zoo:gpt-small", "--set", "n_layer=2", "--set", "n_embd=32", "--set", "vocab_size=64",
                 "--set", "block_size=32", "--cluster", "preset:cpu-2", "--out", str(out), "--batch-size", "4",
                 "--seq-len", "16", "--microbatches", "2", "--time-limit", "2",
                 "--no-pt2"]) == 0  # the ranks run stage.py; tests/codegen/test_artifacts.py runs the .pt2 resized
    assert json.loads((out / "plan.json").read_text())["dynamic"]["seq_len"]
    capsys.readouterr()
    assert main(["run", str(out), "--verify", "--batch-size", "6", "--seq-len", "24"]) == 0
    text = capsys.readouterr().out
    assert float(text.split("max_abs_diff=")[1].split()[0]) <= 1e-5
    assert "verify: PASS" in text
    assert "outputs: 6x24x64" in text
    # the batch must still split into the microbatches
    assert main(["run", str(out), "--batch-size", "5"]) == 2
    assert "--microbatches 2 must be >= 1 and divide the batch size 5" in capsys.readouterr().err


def test_seq_len_on_a_plan_with_a_static_length_is_refused(tmp_path, capsys):
    out = tmp_path / "lstm"
    assert main(["partition", "zoo:lstm", "--set", "vocab_size=64", "--set", "embed_dim=8", "--set", "hidden=8",
                 "--set", "n_layer=1", "--cluster", "preset:cpu-2", "--out", str(out), "--batch-size", "4",
                 "--seq-len", "6", "--microbatches", "2", "--time-limit", "1", "--no-pt2"]) == 0
    dynamic = json.loads((out / "plan.json").read_text())["dynamic"]
    assert dynamic["batch"] and not dynamic["seq_len"] and "specialized" in dynamic["why"]
    capsys.readouterr()
    assert main(["run", str(out), "--seq-len", "8"]) == 2
    err = capsys.readouterr().err
    assert "--seq-len 8: this plan's sequence length is static, 6 (torch.export refused" in err
    assert "run at --seq-len 6, or partition again at --seq-len 8" in err
    assert not (out / "logs").exists(), "refused before starting torchrun"
