"""`hetpart run --batch-size/--seq-len` errors (before any rank starts). The run itself at another batch and
length is tests/runtime/test_torchrun.py::test_two_ranks_verify_and_measure_at_another_batch_and_sequence_length."""

import json

from hetpart.cli import main


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
