"""Symbolic dims in manifest.json at a run's sizes (NOTE [symbolic dims]), and the run's size checks."""

import json

import pytest

from hetpart.errors import HetpartError
from hetpart.frontend import ModelSpec
from hetpart.runtime.artifacts import dim_size, symbol_sizes
from hetpart.runtime.launch import RunOptions, run_spec

SIZES = {"s0": 3, "s1": 24}


@pytest.mark.parametrize(("dim", "size"), [
    ("64", 64), (64, 64), ("s0", 3), ("16*s0", 48), ("s0*s1", 72), ("4*s0*s1", 288), ("s1 - 1", 23),
    ("s1 + 1", 25), ("(s1//2)", 12), ("Max(1, s1)", 24), ("Min(s0, 2)", 2), ("2*s0*s1 + 8", 152), ("-s0 + s1", 21),
])
def test_dims_are_evaluated_at_the_run_sizes(dim, size):
    assert dim_size(dim, SIZES) == size


def test_a_small_literal_power_is_read():
    assert dim_size("s0*s1**2", SIZES) == 3 * 24**2


@pytest.mark.parametrize("dim", ["9**9**9**9", "s0**s1", "2**100", "s0**5", "99999999999*99999999999",
                                 "-s0", "9" * 30, "+".join(["1"] * 200), "(" * 5000 + "1" + ")" * 5000])
def test_a_dim_that_would_cost_time_or_memory_or_is_out_of_range_is_refused(dim):
    with pytest.raises(HetpartError, match="cannot read the dimension"):
        dim_size(dim, SIZES)


def test_a_manifest_with_a_power_tower_dim_is_refused_before_torchrun(tmp_path, capsys):
    from hetpart.cli import main

    out = tmp_path / "mlp"
    assert main(["partition", "zoo:mlp", "--set", "hidden=64", "--set", "n_blocks=2", "--batch-size", "8",
                 "--microbatches", "2", "--cluster", "preset:cpu-2", "--no-pt2", "--out", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["ranks"][0]["outputs"][0]["shape"][-1] = "9**9**9**9"
    (out / "manifest.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    assert main(["run", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hetpart: error: manifest.json: cannot read the dimension '9**9**9**9'"), err
    assert not (out / "logs").exists(), "refused before torchrun started"


def test_a_dim_with_an_unknown_symbol_has_no_size():
    assert dim_size("s2*s0", SIZES) is None


@pytest.mark.parametrize("dim", ["s0 +", "__import__('os')", "s0.real", "s0 / 2", "lambda: 1", "True"])
def test_anything_else_in_a_dim_is_refused_not_evaluated(dim):
    with pytest.raises(HetpartError, match="cannot read the dimension"):
        dim_size(dim, SIZES)


def test_symbols_of_the_model_inputs_are_batch_then_sequence():
    manifest = {"ranks": [{"inputs": [{"shape": ["s0", "s1"]}, {"shape": ["s2", "s1", "4"]}, {"shape": ["7"]}]}]}
    assert symbol_sizes(manifest, 2, 24) == {"s0": 2, "s1": 24, "s2": 2}


SPEC = ModelSpec("zoo:gpt-small", {}, batch_size=4, seq_len=16)
DYNAMIC = {"batch": True, "seq_len": True, "why": None, "seq_len_max": 32}  # plan.json's `dynamic`
STATIC = {"batch": True, "seq_len": False, "why": "torch.export refused: specialized it to 16"}


def test_run_sizes_replace_the_traced_ones_where_dynamic():
    assert run_spec(SPEC, DYNAMIC, RunOptions(batch_size=6, seq_len=24)) == ModelSpec(
        "zoo:gpt-small", {}, batch_size=6, seq_len=24)
    assert run_spec(SPEC, STATIC, RunOptions(batch_size=6)) == ModelSpec("zoo:gpt-small", {}, batch_size=6, seq_len=16)
    assert run_spec(SPEC, STATIC, RunOptions(seq_len=16)) == SPEC  # the traced length is always fine


def test_seq_len_on_a_static_plan_is_an_error_that_says_why():
    with pytest.raises(HetpartError, match=r"--seq-len 24: this plan's sequence length is static, 16 "
                                           r"\(torch.export refused: specialized it to 16\)"):
        run_spec(SPEC, STATIC, RunOptions(seq_len=24))
    with pytest.raises(HetpartError, match="static"):  # plans written before dynamic sequences
        run_spec(SPEC, None, RunOptions(seq_len=24))


@pytest.mark.parametrize(("opts", "message"), [
    (RunOptions(seq_len=33), "sequences of 2 to 32 tokens"), (RunOptions(seq_len=1), "sequences of 2 to 32"),
    (RunOptions(batch_size=1), "--batch-size must be at least 2"),
])
def test_run_sizes_outside_the_traced_range(opts, message):
    with pytest.raises(HetpartError, match=message):
        run_spec(SPEC, DYNAMIC, opts)
