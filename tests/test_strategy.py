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
