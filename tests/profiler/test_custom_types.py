"""`hetpart profile --device-type T --cluster C` for a type C defines, and `--speed-scale X` (issue 22)."""

import json

import pytest

from hetpart.cli import main
from hetpart.devices import load_cluster
from hetpart.errors import HetpartError
from hetpart.profiler.measure import check_profile_type
from hetpart.profiler.table import Profile

MLP = ["zoo:mlp", "--set", "n_blocks=1", "--set", "hidden=16", "--batch-size", "4", "--seq-len", "1"]
# One machine with one device of each custom type: one rank per type there, so no sibling processes.
CLUSTER = """
[[device_types]]
name = "slow-cpu"
peak_tflops = { fp32 = 0.5 }
mem_GB = 16
mem_bw_GBps = 20

[[device_types]]
name = "fast-cpu"
peak_tflops = { fp32 = 2 }
mem_GB = 16
mem_bw_GBps = 80

[[nodes]]
name = "here"
devices = ["slow-cpu", "fast-cpu"]
"""


@pytest.fixture
def cluster_file(tmp_path):
    path = tmp_path / "emulated.toml"
    path.write_text(CLUSTER)
    return path


def test_scaled_divides_every_time_and_records_the_factor(tmp_path):
    prof = Profile("cpu", 1, {"a": 1000, "b": 3}, {"a backward[1]": 500})
    slow = prof.scaled(0.5)
    assert (slow.forward_ns, slow.backward_ns, slow.speed_scale) == ({"a": 2000, "b": 6}, {"a backward[1]": 1000}, 0.5)
    fast = slow.scaled(4)  # factors compose: a profile of a device 2x this machine's speed
    assert (fast.forward_ns, fast.speed_scale) == ({"a": 500, "b": 2}, 2.0)
    assert prof.forward_ns == {"a": 1000, "b": 3}, "scaled() returns a new profile"
    slow.save(tmp_path / "p.json")
    assert json.loads((tmp_path / "p.json").read_text())["speed_scale"] == 0.5
    assert Profile.load(tmp_path / "p.json") == slow
    for bad in (0, -1.0, float("inf"), True):
        with pytest.raises(HetpartError, match="must be a positive number"):
            prof.scaled(bad)


def test_a_profile_file_without_speed_scale_is_measured_as_is_and_a_bad_one_is_refused(tmp_path):
    data = Profile("cpu", 1, {"a": 7}).to_json()
    del data["speed_scale"]
    (tmp_path / "old.json").write_text(json.dumps(data))
    assert Profile.load(tmp_path / "old.json").speed_scale == 1.0
    for bad in (0, -2, "fast", None, True):
        (tmp_path / "bad.json").write_text(json.dumps({**data, "speed_scale": bad}))
        with pytest.raises(HetpartError, match="speed_scale must be a positive number"):
            Profile.load(tmp_path / "bad.json")


def test_custom_types_are_known_only_with_their_cluster(cluster_file):
    cluster = load_cluster(str(cluster_file))
    check_profile_type("slow-cpu", cluster)
    check_profile_type("t4-16g")  # the catalog's types stay valid without a cluster; with one, only those it has
    with pytest.raises(HetpartError, match=r"cluster 'emulated' has no device of that type \(its devices: fast-cpu"):
        check_profile_type("t4-16g", cluster)  # review22: a profile `partition --cluster` of it would refuse
    with pytest.raises(HetpartError, match=r"unknown device type 'slow-cpu' .*need --cluster FILE"):
        check_profile_type("slow-cpu")
    with pytest.raises(HetpartError, match=r"unknown device type 'mid-cpu' .*adds: fast-cpu, slow-cpu"):
        check_profile_type("mid-cpu", cluster)


def test_profile_cli_writes_a_scaled_profile_of_a_custom_type_that_partition_uses(cluster_file, tmp_path, capsys):
    out = tmp_path / "slow.json"
    assert main(["profile", *MLP, "--out", str(out), "--repeats", "1", "--warmup", "0", "--device-type", "slow-cpu",
                 "--cluster", str(cluster_file), "--speed-scale", "0.25"]) == 0
    assert "as device type 'slow-cpu' (0.25x this machine's speed)" in capsys.readouterr().out
    prof = Profile.load(out)
    assert (prof.device_type, prof.speed_scale, prof.concurrent) == ("slow-cpu", 0.25, 1) and prof.forward_ns
    plan = tmp_path / "plan"
    assert main(["partition", *MLP, "--cluster", str(cluster_file), "--out", str(plan), "--no-pt2",
                 "--profile", str(out)]) == 0
    # The op-cost pass took the scaled times for the custom type (the IR dump carries them).
    graph = json.loads((plan / "ir" / "graph.json").read_text())
    linear = [n["cost_ns"]["slow-cpu"] for n in graph["nodes"] if n.get("target") == "aten.linear"]
    assert linear and set(linear) <= set(prof.forward_ns.values()), (linear, prof.forward_ns)


def test_profile_cli_refuses_an_unknown_type_and_a_bad_scale_before_profiling(cluster_file, tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["profile", *MLP, "--out", str(out), "--device-type", "slow-cpu"]) == 2
    assert "a cluster's own [[device_types]] need --cluster FILE" in capsys.readouterr().err
    assert main(["profile", *MLP, "--out", str(out), "--device-type", "x", "--cluster", str(cluster_file)]) == 2
    assert "adds: fast-cpu, slow-cpu" in capsys.readouterr().err
    assert main(["profile", *MLP, "--out", str(out), "--speed-scale", "0"]) == 2
    assert "--speed-scale must be positive (got 0)" in capsys.readouterr().err
    assert not out.exists()
