"""The CLI contract: partition / inspect / devices / models, and clear errors for bad input."""

import json
import subprocess
import sys

import pytest

from hetpart.cli import main

MLP = ["zoo:mlp", "--set", "hidden=32", "--set", "n_blocks=2"]


def test_partition_then_inspect(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["partition", *MLP, "--cluster", "preset:mixed-4", "--out", str(out), "--batch-size", "8"]) == 0
    plan = json.loads((out / "plan.json").read_text())
    for key in ("bottleneck_us", "lower_bound_us", "gap", "solver_status"):
        assert key in plan
    for stage in plan["stages"]:
        assert {"index", "device", "device_type", "node_count", "predicted_time_us", "memory_bytes",
                "capacity_bytes"} <= set(stage)
        assert stage["memory_bytes"] <= stage["capacity_bytes"]
    assert plan["lower_bound_us"] <= plan["bottleneck_us"]
    assert (out / "ir" / "05-partition.txt").is_file()
    capsys.readouterr()
    assert main(["inspect", str(out)]) == 0
    shown = capsys.readouterr().out
    for stage in plan["stages"]:
        assert stage["device"] in shown
    assert "bottleneck" in shown and "lower bound" in shown


def test_same_command_twice_gives_identical_plan_and_sources(tmp_path):
    outs = [tmp_path / "a", tmp_path / "b"]
    for out in outs:
        assert main(["partition", *MLP, "--cluster", "preset:mixed-4", "--out", str(out)]) == 0
    for rel in ["plan.json", "manifest.json", "rank0/stage.py", "rank0/stage.pt2", "ir/04-op-cost.txt", "report.html"]:
        assert (outs[0] / rel).read_bytes() == (outs[1] / rel).read_bytes(), rel


@pytest.mark.parametrize("args, message", [
    (["zoo:nope"], "unknown model 'zoo:nope'"),
    (["zoo:mlp", "--set", "widht=3"], "--set widht"),
    (["zoo:mlp", "--cluster-is-missing"], None),
    (["zoo:mlp", "--microbatches", "3"], "--microbatches 3 must be >= 1 and divide --batch-size 8"),
    (["zoo:mlp", "--time-limit", "0"], "--time-limit must be positive"),
    (["zoo:mlp", "--batch-size", "1", "--microbatches", "1"], "--batch-size must be at least 2"),
    (["zoo:mlp", "--gap", "1.5"], "--gap must be a fraction in [0, 1)"),
])
def test_bad_partition_input_exits_2_and_writes_nothing(tmp_path, capsys, args, message):
    out = tmp_path / "out"
    argv = ["partition", *args, "--out", str(out)]
    if "--cluster-is-missing" in args:
        argv = ["partition", "zoo:mlp", "--cluster", str(tmp_path / "none.toml"), "--out", str(out)]
        message = "cluster file"
    else:
        argv += ["--cluster", "preset:mixed-4"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("hetpart: error: ") and message in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) in ([], [tmp_path / "none.toml"])


def test_gap_stops_once_the_plan_is_certified_within_it(tmp_path):
    """`--gap` (NOTE [gap stop]): the DP's plan is certified within 50% and kept, not proven optimal."""
    out = tmp_path / "out"
    assert main(["partition", *MLP, "--cluster", "preset:spot-16", "--out", str(out), "--gap", "0.5",
                 "--no-pt2"]) == 0  # the plan is the point: no .pt2 of its six stages
    plan = json.loads((out / "plan.json").read_text())
    assert plan["solver_status"] == "WITHIN_GAP" and 0 < plan["gap"] <= 0.5


def test_existing_output_needs_force(tmp_path, capsys):
    out = tmp_path / "out"
    partition = ["partition", *MLP, "--cluster", "preset:mixed-4", "--out", str(out), "--no-pt2"]  # --force is the point
    out.mkdir()
    (out / "keep").write_text("x")
    assert main(partition) == 2
    assert "pass --force" in capsys.readouterr().err
    assert (out / "keep").exists()
    assert main([*partition, "--force"]) == 2
    assert "has no .hetpart marker" in capsys.readouterr().err and (out / "keep").exists()  # not hetpart's
    (out / "keep").unlink()
    out.rmdir()
    assert main(partition) == 0
    (out / "plan.json").write_text("old")
    assert main([*partition, "--force"]) == 0
    assert (out / "plan.json").read_text() != "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging leftovers


def test_inspect_missing_directory(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "nope")]) == 2
    assert "not found" in capsys.readouterr().err


def test_devices_and_models_list(capsys):
    assert main(["devices"]) == 0
    assert "t4-16g" in capsys.readouterr().out
    assert main(["models"]) == 0
    assert "zoo:gpt-small" in capsys.readouterr().out


def test_python_dash_m_entry_point():
    proc = subprocess.run([sys.executable, "-m", "hetpart", "--version"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith("hetpart ")


def test_replan_keeps_an_optimizer_of_no_state(tmp_path, capsys):
    """A plan made with --optimizer-bytes-per-param 0 (plain SGD) is re-planned with 0, not the default 8."""
    import json

    from hetpart.cli import main

    old, new = tmp_path / "old", tmp_path / "new"
    assert main(["partition", "zoo:mlp", "--set", "hidden=384", "--set", "n_blocks=4", "--batch-size", "64",
                 "--microbatches", "4", "--no-pt2", "--mode", "training", "--cluster", "preset:cpu-4",
                 "--optimizer-bytes-per-param", "0", "--out", str(old)]) == 0
    assert main(["replan", str(old), "--lose", "local/3", "--out", str(new)]) == 0
    capsys.readouterr()
    before, after = (json.loads((d / "plan.json").read_text()) for d in (old, new))
    assert before["optimizer_bytes_per_param"] == after["optimizer_bytes_per_param"] == 0


def test_replan_refuses_an_analysis_that_is_no_json_object(tmp_path, capsys):
    """ir/analysis.json rewritten (its digest in an unsigned manifest too) is refused with exit 2, no traceback."""
    import hashlib
    import json

    from hetpart.cli import main

    old = tmp_path / "old"
    assert main(["partition", "zoo:mlp", "--set", "hidden=32", "--set", "n_blocks=2", "--no-pt2",
                 "--cluster", "preset:cpu-2", "--time-limit", "5", "--out", str(old)]) == 0
    for text in ("[]", "[" * 100_000):
        (old / "ir" / "analysis.json").write_text(text)
        manifest = json.loads((old / "manifest.json").read_text())
        manifest["files"]["ir/analysis.json"] = hashlib.sha256(text.encode()).hexdigest()
        (old / "manifest.json").write_text(json.dumps(manifest))
        capsys.readouterr()
        assert main(["replan", str(old), "--lose", "local/1", "--out", str(tmp_path / "new")]) == 2
        err = capsys.readouterr().err
        assert "analysis.json" in err and "Traceback" not in err, err
    assert not (tmp_path / "new").exists()


def test_replan_refuses_an_existing_out_before_it_re_plans(tmp_path, capsys):
    """NEW_DIR is checked as `partition` checks --out before the re-plan runs: an existing one without --force is
    refused (exit 2) with nothing re-planned or printed (it printed a whole re-plan, then refused to write it)."""
    old = tmp_path / "old"
    assert main(["partition", "zoo:mlp", "--set", "hidden=64", "--set", "n_blocks=3", "--batch-size", "8",
                 "--microbatches", "2", "--no-pt2", "--cluster", "preset:cpu-4", "--time-limit", "3",
                 "--out", str(old)]) == 0
    before = (old / "plan.json").read_text()
    capsys.readouterr()
    # its own OLD_DIR (NOTE [an output is no input]: not "pass --force"), a directory hetpart did not write
    for out, says in ((old, "is OLD_DIR"), (tmp_path / "elsewhere", "already exists; pass --force")):
        out.mkdir(exist_ok=True)
        assert main(["replan", str(old), "--lose", "local/1", "--out", str(out), "--time-limit", "2"]) == 2
        got = capsys.readouterr()
        assert says in got.err and "re-planned" not in got.out and not got.out, got
    assert (old / "plan.json").read_text() == before


@pytest.mark.parametrize("devices, dirs", [(1, "rank0, "), (2, "rank0..rank1, ")])
def test_the_wrote_line_names_the_rank_folders_written(tmp_path, capsys, devices, dirs):
    """One stage wrote "rank0..rank0" (ux20); the folders named are the ones on disk."""
    cluster = tmp_path / "c.toml"
    cluster.write_text('[network]\nbandwidth_GBps = 1\nlatency_us = 10\n[[nodes]]\nname = "m"\n'
                       f'devices = {["cpu"] * devices!r}\n'.replace("'", '"')
                       + 'link = { bandwidth_GBps = 1000, latency_us = 1 }\n')
    out = tmp_path / "out"
    assert main(["partition", *MLP, "--cluster", str(cluster), "--out", str(out), "--no-pt2"]) == 0
    wrote = [line for line in capsys.readouterr().out.splitlines() if line.startswith("wrote ")]
    assert wrote and f"manifest.json, {dirs}ir/" in wrote[0], wrote
    assert sorted(p.name for p in out.glob("rank*")) == [f"rank{k}" for k in range(devices)]
