"""`hetpart partition --strategy NAME`: a baseline's plan through the same codegen (NOTE [--strategy])."""

import json

import pytest

from hetpart.cli import main

TINY = """
[[nodes]]
name = "a"
devices = [{type = "cpu", mem_GB = 0.000002}, {type = "cpu", mem_GB = 64}]
"""


def test_unknown_strategy_is_refused_before_tracing(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["partition", "zoo:mlp", "--cluster", "preset:cpu-2", "--out", str(out), "--strategy", "fastest"]) == 2
    err = capsys.readouterr().err
    assert "--strategy fastest: unknown strategy (known: optimal, equal-layers," in err and not out.exists()


def test_partition_refuses_a_strategy_over_memory_and_leaves_nothing(tmp_path, capsys):
    cluster = tmp_path / "tiny.toml"
    cluster.write_text(TINY)
    out = tmp_path / "out"
    code = main(["partition", "zoo:mlp", "--set", "n_blocks=2", "--set", "hidden=32", "--cluster", str(cluster),
                 "--out", str(out), "--strategy", "equal-layers", "--no-pt2"])
    err = capsys.readouterr().err
    assert code == 2 and "hetpart: error: --strategy equal-layers: its plan does not fit" in err
    assert "over its capacity of" in err and "Traceback" not in err and not out.exists()


def test_baseline_strategy_runs_and_verifies_under_torchrun(equal_layers_run):
    # One launch with tests/runtime/test_torchrun.py's verify-and-measure test (NOTE [shared launches]
    # in tests/shared_runs.py): gpt-small's equal-layers plan on cpu-2, run with --verify at batch 6.
    plan = json.loads((equal_layers_run.out / "plan.json").read_text())
    assert plan["strategy"] == "equal-layers" and plan["solver_status"] == "BASELINE"
    equal = next(b for b in plan["baselines"] if b["name"] == "equal-layers")
    assert equal["step_ratio"] == 1.0 and "2 blocks over 2 stages" in equal["note"]  # the plan is that baseline
    assert "solver BASELINE" in equal_layers_run.partition_text
    assert "verify: PASS" in equal_layers_run.run_text


# `--parallel data --strategy NAME`: a data-parallel baseline's pipelines (NOTE [pipeline baselines]).
GPT_DP = ["zoo:gpt-small", "--set", "n_layer=4", "--set", "n_embd=128", "--set", "vocab_size=256", "--set",
          "block_size=16", "--batch-size", "24", "--seq-len", "16", "--microbatches", "12", "--no-pt2"]


@pytest.mark.parametrize("extra, message", [
    (["--strategy", "megatron"], "--strategy megatron is a baseline of data-parallel pipelines: pass --parallel data"),
    (["--strategy", "equal-layers", "--parallel", "data"],
     "--strategy equal-layers is a baseline of one pipeline: leave out --parallel data"),
    (["--strategy", "zigzag", "--parallel", "data"], "--strategy zigzag: unknown strategy (known: optimal, megatron, "
                                                     "metis, one-pipeline)"),
    (["--strategy", "metis", "--pipelines", "local/0;local/1"], "pass one of the two"),
])
def test_data_parallel_strategies_are_checked_before_tracing(tmp_path, capsys, extra, message):
    out = tmp_path / "out"
    assert main(["partition", *GPT_DP, "--cluster", "preset:cpu-4", "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and not out.exists()


def test_a_data_parallel_baseline_is_written_as_its_pipelines_and_trains_verified(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["partition", *GPT_DP, "--cluster", "preset:cpu-4", "--mode", "training", "--parallel", "data",
                 "--strategy", "megatron", "--time-limit", "4", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "strategy megatron: the artifacts run this baseline's plan" in printed
    assert main(["inspect", str(out)]) == 0  # inspect says it too
    assert "strategy megatron: the artifacts run this baseline's plan" in capsys.readouterr().out
    plan = json.loads((out / "plan.json").read_text())
    assert plan["strategy"] == "megatron" and plan["solver_status"] == "BASELINE" and plan["lower_bound_us"] == 0
    # Megatron's layout on 4 equal devices: 2 pipelines of 2 consecutive devices, the batch split equally.
    assert [[s["device"] for s in q["stages"]] for q in plan["pipelines"]] == [["local/0", "local/1"],
                                                                             ["local/2", "local/3"]]
    assert [q["microbatches"] for q in plan["pipelines"]] == [6, 6]
    megatron = next(b for b in plan["baselines"] if b["name"] == "megatron")
    assert megatron["iteration_us"] == plan["iteration_us"]  # the plan is that baseline
    assert main(["run", str(out), "--mode", "training", "--steps", "2", "--verify"]) == 0
    ran = capsys.readouterr().out
    assert "of 2 pipelines (2 + 2 stages" in ran and "verify: PASS" in ran
