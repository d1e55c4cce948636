"""`hetpart profile`: measured op times written, read back and used by the op-cost pass."""

import json

import pytest
import torch

from hetpart.cli import main
from hetpart.devices import CATALOG
from hetpart.ir import info
from hetpart.passes.meta import run_on_meta
from hetpart.passes.op_cost import op_time_ns
from hetpart.passes.profile import Profile, op_key, profiled

MLP = ["zoo:mlp", "--set", "n_blocks=3", "--set", "hidden=32", "--batch-size", "8", "--seq-len", "1"]


@pytest.fixture(scope="module")
def mlp_profile(tmp_path_factory):
    path = tmp_path_factory.mktemp("profile") / "mlp.json"
    assert main(["profile", *MLP, "--out", str(path), "--repeats", "3", "--warmup", "1", "--backward"]) == 0
    return path


def test_profile_is_written_and_read_back(mlp_profile):
    data = json.loads(mlp_profile.read_text())
    assert data["device_type"] == "cpu" and data["threads"] == 1 and data["format_version"] == 1
    prof = Profile.load(mlp_profile)
    assert prof.forward_ns == data["forward_ns"] and all(ns > 0 for ns in prof.forward_ns.values())
    # Keyed by op and shapes, not node names: the three blocks' identical fc1 share one entry.
    assert "aten.linear.default(f32[2,32], f32[128,32], f32[128])" in prof.forward_ns
    assert not any("blocks" in key for key in prof.forward_ns)


def test_partition_uses_measured_times_where_the_profile_has_them(mlp_profile, tmp_path):
    from hetpart.compile import analyze
    from hetpart.devices import load_cluster
    from tests.conftest import SMALL

    prof = Profile.load(mlp_profile)
    dropped = "aten.relu.default(f32[2,32])"  # an op the table lacks falls back to the roofline
    assert dropped in prof.forward_ns
    del prof.forward_ns[dropped]
    gm = analyze(SMALL["mlp"], load_cluster("preset:cpu-2"), 2, profiles={"cpu": prof})[0]
    values = run_on_meta(gm, 2)
    measured = roofline = 0
    for node in gm.graph.nodes:
        if not profiled(node):
            continue
        key = op_key(node, values)
        if key in prof.forward_ns:
            assert info(node).cost_ns["cpu"] == prof.forward_ns[key]
            measured += 1
        else:
            assert info(node).cost_ns["cpu"] == (0 if node.target.is_view else op_time_ns(info(node), CATALOG["cpu"], node))
            roofline += 1
    assert measured >= 10 and roofline >= 1

    # The CLI: --profile reaches the plan (the IR dump carries the measured cost).
    out = tmp_path / "out"
    assert main(["partition", *MLP, "--cluster", "preset:cpu-2", "--out", str(out), "--no-pt2",
                 "--profile", str(mlp_profile)]) == 0
    nodes = json.loads((out / "ir" / "graph.json").read_text())["nodes"]
    linear = next(n for n in nodes if n.get("target") == "aten.linear" and n["shape"] == ["s0", "128"])
    assert linear["cost_ns"]["cpu"] == Profile.load(mlp_profile).forward_ns[
        "aten.linear.default(f32[2,32], f32[128,32], f32[128])"]


def test_training_uses_measured_backward_times(mlp_profile):
    from hetpart.compile import analyze
    from hetpart.devices import load_cluster
    from hetpart.passes.profile import backward_key
    from tests.conftest import SMALL

    prof = Profile.load(mlp_profile)
    assert prof.backward_ns, "--backward times the ops' backwards"
    gm = analyze(SMALL["mlp"], load_cluster("preset:cpu-2"), 2, mode="training", profiles={"cpu": prof})[0]
    values = run_on_meta(gm, 2)
    needs = {n for n in gm.graph.nodes if info(n).needs_grad}
    linears = [n for n in gm.graph.nodes if n.target == torch.ops.aten.linear.default]
    for node in linears:
        assert info(node).bwd_cost_ns["cpu"] == prof.backward_ns[backward_key(node, values, needs)]
    # The first linear reads the model input: only its weight and bias get gradients.
    assert backward_key(linears[0], values, needs).endswith("backward[011]")


def test_profile_errors_say_what_to_do(mlp_profile, tmp_path, capsys):
    other = tmp_path / "t4.json"
    other.write_text(mlp_profile.read_text().replace('"device_type": "cpu"', '"device_type": "t4-16g"'))
    args = ["partition", *MLP, "--cluster", "preset:cpu-2", "--out", str(tmp_path / "o"), "--no-pt2"]
    assert main([*args, "--profile", str(other)]) == 2
    assert "does not have (types: cpu)" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert main([*args, "--profile", str(bad)]) == 2
    assert "write it again with `hetpart profile`" in capsys.readouterr().err
    assert main(["profile", *MLP, "--out", str(tmp_path / "p.json"), "--device-type", "a100"]) == 2
    assert "unknown device type 'a100'" in capsys.readouterr().err


def test_op_key_names_shapes_dtypes_and_arguments():
    import torch.fx as fx

    g = fx.Graph()
    x = g.placeholder("x")
    node = g.call_function(torch.ops.aten.softmax.int, (x, -1))
    assert op_key(node, {x: torch.empty(2, 3, dtype=torch.float16, device="meta")}) == "aten.softmax.int(f16[2,3], -1)"
