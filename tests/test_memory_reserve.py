"""`partition --memory-reserve GIB` (NOTE [memory reserve] in hetpart/devices/cluster.py): every device planned with
GIB less memory, recorded in plan.json and ir/analysis.json, kept by `replan` for the devices it keeps and taken off
the devices it adds; a reserve that leaves a device nothing is refused."""

from __future__ import annotations

import json

from hetpart.cli import main
from hetpart.devices.catalog import GiB

MLP = ["zoo:mlp", "--set", "hidden=64", "--set", "n_blocks=4", "--batch-size", "8", "--microbatches", "2",
       "--mode", "training", "--no-pt2", "--time-limit", "5"]
SMALL = """
[network]
bandwidth_GBps = 1
latency_us = 50
[[nodes]]
name = "m"
devices = [{type = "cpu", mem_GiB = 2}, {type = "cpu", mem_GiB = 2}, {type = "cpu", mem_GiB = 2}]
link = { bandwidth_GBps = 2, latency_us = 20 }
"""


def test_a_reserve_is_planned_recorded_and_kept_by_a_replan(tmp_path, capsys):
    cluster, out, new = tmp_path / "small.toml", tmp_path / "out", tmp_path / "new"
    cluster.write_text(SMALL)
    assert main(["partition", *MLP, "--cluster", str(cluster), "--memory-reserve", "0.5", "--out", str(out)]) == 0
    plan = json.loads((out / "plan.json").read_text())
    left = int(1.5 * GiB)
    assert plan["cluster"]["memory_reserve_bytes"] == GiB // 2
    assert {d["mem_bytes"] for d in plan["cluster"]["devices"]} == {left}
    assert {s["capacity_bytes"] for s in plan["stages"]} == {left}  # what the planner held each stage to
    analysis = json.loads((out / "ir" / "analysis.json").read_text())
    assert analysis["cluster"]["memory_reserve_bytes"] == GiB // 2
    assert {d["capacity_bytes"] for d in analysis["problem"]["devices"]} == {left}
    assert "1.5 GiB" in capsys.readouterr().out  # the table's capacity is the memory left

    # A re-plan that adds a device takes the reserve off it too, and keeps the record.
    assert main(["replan", str(out), "--add", "cpu@m", "--out", str(new)]) == 0
    replanned = json.loads((new / "plan.json").read_text())["cluster"]
    assert replanned["memory_reserve_bytes"] == GiB // 2
    assert {d["name"]: d["mem_bytes"] for d in replanned["devices"]}["m/3"] == 256 * GiB - GiB // 2


def test_no_reserve_records_nothing_and_a_reserve_that_leaves_nothing_is_refused(tmp_path, capsys):
    cluster, out = tmp_path / "small.toml", tmp_path / "out"
    cluster.write_text(SMALL)
    assert main(["partition", *MLP, "--cluster", str(cluster), "--out", str(out)]) == 0
    plan = json.loads((out / "plan.json").read_text())
    assert "memory_reserve_bytes" not in plan["cluster"]
    assert {s["capacity_bytes"] for s in plan["stages"]} == {2 * GiB}
    capsys.readouterr()
    assert main(["partition", *MLP, "--cluster", str(cluster), "--memory-reserve", "2", "--out",
                 str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert "--memory-reserve 2 GiB: device m/0 (cpu) has 2 GiB in all, nothing would be left" in err, err
    assert not (tmp_path / "none").exists() and "Traceback" not in err
