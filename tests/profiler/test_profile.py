"""`hetpart profile`: measured op times written, read back and used by the op-cost pass."""

import functools
import json
import math
import operator

import pytest
import torch

from hetpart.cli import main
from hetpart.devices import CATALOG
from hetpart.errors import HetpartError
from hetpart.ir import info
from hetpart.passes.meta import run_on_meta
from hetpart.passes.op_cost import op_time_ns
from hetpart.profiler.table import Profile, op_key, profiled

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
    from hetpart.profiler.table import backward_key
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


def _children() -> set[int]:
    """Pids of this process's live children (Linux /proc)."""
    import os
    from pathlib import Path

    kids = set()
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
        except OSError:
            continue
        if fields.get("PPid", "").strip() == str(os.getpid()) and not fields.get("State", "").startswith("Z"):
            kids.add(int(status.parent.name))
    return kids


def test_concurrent_profile_records_its_processes_and_reaps_the_siblings(tmp_path):
    """NOTE [concurrent profile]: --cluster preset:cpu-2 times the ops beside one sibling process."""
    before = _children()
    path = tmp_path / "p.json"
    assert main(["profile", *MLP, "--out", str(path), "--repeats", "3", "--warmup", "1",
                 "--cluster", "preset:cpu-2"]) == 0
    data = json.loads(path.read_text())
    # One sibling, busy as the other rank of a 2-stage GPipe step of 4 microbatches (4 of 5 slots).
    assert data["concurrent"] == 2 and data["sibling_duty"] == 0.8 and data["forward_ns"]
    assert Profile.load(path).concurrent == 2 and Profile.load(path).sibling_duty == 0.8
    assert _children() == before, "the sibling process was not reaped"


def test_siblings_run_their_part_of_the_graph_until_stopped():
    import time

    from hetpart.frontend import export_model, load_model
    from hetpart.profiler.replay import Replay
    from hetpart.profiler.siblings import Siblings
    from tests.conftest import SMALL

    module, inputs = load_model(SMALL["mlp"])
    gm = export_model(module, inputs)
    weights = {n: functools.reduce(getattr, n.target.split("."), gm) for n in gm.graph.find_nodes(op="get_attr")}
    before = _children()
    with Siblings(Replay.of(gm, weights, inputs), 2, threads=1, duty=0.5) as siblings:
        started = _children() - before
        assert len(started) == 2  # each has finished one pass before this line runs
        time.sleep(1.0)
    assert siblings.passes > 0, "the siblings ran no pass while the profile timed"
    assert not (_children() & started), "a sibling is still running"


def test_replay_runs_the_graph_and_its_parts_cover_it(tmp_path):
    from hetpart.frontend import export_model, load_model
    from hetpart.profiler.replay import Replay, cut
    from tests.conftest import SMALL

    module, inputs = load_model(SMALL["mlp"])
    gm = export_model(module, inputs)
    weights = {n: functools.reduce(getattr, n.target.split("."), gm) for n in gm.graph.find_nodes(op="get_attr")}
    replay = Replay.of(gm, weights, inputs)
    replay.save(tmp_path)  # as a sibling gets it: JSON and safetensors, ops by name (NOTE [replay files])
    replay = Replay.load(tmp_path)
    assert all(not isinstance(t, torch._ops.OpOverload) for _, t, *_ in replay.steps)
    # A full pass computes what the graph does; each of 3 parts runs on the values before it.
    out = gm.graph.find_nodes(op="output")[0].args[0]
    index = {node: i for i, node in enumerate(gm.graph.nodes)}
    want = gm(*inputs)
    want = tuple(want) if isinstance(want, (tuple, list)) else (want,)
    values = replay.compile()()
    assert len(out) == len(want) and all(torch.equal(values[index[n]], w) for n, w in zip(out, want))
    for part in range(3):
        values = replay.compile(part, 3)()
    # The last part computes the outputs again, on the values before it that its first pass kept.
    last = replay.steps[-1][0]
    assert last in {index[n] for n in out} and torch.equal(values[last], want[[index[n] for n in out].index(last)])
    # Parts are contiguous, cover every step once, and share the time about equally.
    assert cut([1] * 10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert cut([5, 1, 1, 1, 1, 1], 2) == [(0, 1), (1, 6)]
    assert cut([1, 2, 3], 1) == [(0, 3)]


def test_concurrent_errors_and_old_profiles(mlp_profile, tmp_path, capsys):
    from hetpart.devices import load_cluster
    from hetpart.profiler.siblings import ranks_sharing_a_machine, sibling_duty

    assert main(["profile", *MLP, "--out", str(tmp_path / "p.json"), "--concurrent", "0"]) == 2
    assert "--concurrent 0: expected 1 or more processes" in capsys.readouterr().err
    # review22: a type the cluster has none of was profiled alone, a profile that `partition --cluster` refuses.
    assert main(["profile", *MLP, "--out", str(tmp_path / "p.json"), "--device-type", "t4-16g", "--cluster",
                 "preset:cpu-4"]) == 2
    assert "cluster 'cpu-4' has no device of that type (its devices: cpu)" in capsys.readouterr().err
    assert not (tmp_path / "p.json").exists()
    # --cluster: the most devices of the profiled type on one node of it.
    assert ranks_sharing_a_machine(load_cluster("preset:cpu-4"), "cpu") == 4
    assert ranks_sharing_a_machine(load_cluster("preset:mixed-4"), "a100-80g") == 2
    assert ranks_sharing_a_machine(load_cluster("preset:mixed-4"), "cpu") == 1
    assert sibling_duty(1, 4) == 1.0 and sibling_duty(4, 4) == 4 / 7 and sibling_duty(2, 8) == 8 / 9
    # A profile written before `concurrent` existed was taken alone; a bad value is an error.
    data = json.loads(mlp_profile.read_text())
    assert data["concurrent"] == 1
    del data["concurrent"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data))
    assert Profile.load(old).concurrent == 1
    old.write_text(json.dumps({**data, "concurrent": 0}))
    with pytest.raises(Exception, match="concurrent must be an integer >= 1"):
        Profile.load(old)


def _exported_replay(module, inputs):
    from hetpart.frontend import export_model
    from hetpart.profiler.replay import Replay

    gm = export_model(module, inputs)
    weights = {n: functools.reduce(getattr, n.target.split("."), gm) for n in gm.graph.find_nodes(op="get_attr")}
    return gm, Replay.of(gm, weights, inputs)


class _Mixed(torch.nn.Module):
    """getitem of a multi-output op, dtype kwargs, -inf, slices and a weight used twice."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(6, 6)
        self.b = torch.nn.Linear(6, 6)
        self.b.weight = self.a.weight

    def forward(self, x):
        y = self.b(self.a(x))
        top, where = y.max(dim=-1)
        z = y.masked_fill(y < 0, float("-inf")).softmax(-1)[:, 1:4]
        n = torch.arange(z.shape[-1], device=x.device, dtype=torch.float64)
        return z.sum(-1, dtype=torch.float64) + n.sum(), top, where


def test_replay_files_round_trip_to_the_same_outputs(tmp_path):
    from hetpart.profiler.replay import Replay

    torch.manual_seed(0)
    module, inputs = _Mixed(), (torch.randn(4, 6),)
    gm, replay = _exported_replay(module, inputs)
    # The graph has what the files must carry: getitem (a plain function), dtypes and -inf.
    assert any(t is operator.getitem for _, t, *_ in replay.steps)
    replay.save(tmp_path)
    assert json.loads((tmp_path / "replay.json").read_text())  # strict JSON: -inf is a tagged string
    back = Replay.load(tmp_path)
    assert [(i, t, f) for i, t, _, _, f in back.steps] == [(i, t, f) for i, t, _, _, f in replay.steps]
    assert [(a, k) for _, _, a, k, _ in back.steps] == [(a, k) for _, _, a, k, _ in replay.steps]
    assert back.inputs.keys() == replay.inputs.keys() and back.weights.keys() == replay.weights.keys()
    assert all(torch.equal(back.weights[i], w) for i, w in replay.weights.items())
    index = {node: i for i, node in enumerate(gm.graph.nodes)}
    out = gm.graph.find_nodes(op="output")[0].args[0]
    want = gm(*inputs)
    got = back.compile()()
    assert len(out) == 3 and all(torch.equal(got[index[n]], w) for n, w in zip(out, want))
    assert all(torch.equal(w, module(*inputs)[k]) for k, w in enumerate(want))


def test_replay_values_encode_by_tag_and_unknown_ones_fail_clearly(tmp_path):
    from hetpart.profiler.replay import Replay, Slot, decode_value, encode_value

    t = torch.arange(6.0).reshape(2, 3).t()  # not contiguous
    value = (Slot(3), [1, 2.5, None, True, "s"], {"dtype": torch.bfloat16, "device": torch.device("cpu")},
             torch.strided, torch.channels_last, slice(1, None, 2), ..., float("inf"), float("-inf"), t, (t,))
    tensors = {}
    encoded = json.loads(json.dumps(encode_value(value, tensors), allow_nan=False))
    assert len(tensors) == 1 and encoded["tuple"][0] == {"slot": 3} and encoded["tuple"][5] == {"slice": [1, None, 2]}
    back = decode_value(encoded, {key: x for key, x in tensors.values()})
    assert back[:9] == value[:9] and type(back[1]) is list and back[10][0] is back[9] and torch.equal(back[9], t)
    assert math.isnan(decode_value(encode_value(float("nan"), {}), {}))
    # A value the files cannot hold, or a function a sibling may not call, stops the profile before it starts.
    with pytest.raises(HetpartError, match="holds a builtins.object"):
        encode_value(object(), {})
    replay = Replay({}, {}, [(0, lambda: 1, (), {}, ())])
    with pytest.raises(HetpartError, match="may not call"):
        replay.save(tmp_path)
    # A file that names anything else is refused, not called.
    Replay({}, {}, [(0, operator.add, (1, 2), {}, ())]).save(tmp_path)
    assert Replay.load(tmp_path).compile()() == {0: 3}
    data = json.loads((tmp_path / "replay.json").read_text())
    for target in (["os", "system"], ["builtins", "eval"], ["operator", "attrgetter"]):
        data["steps"][0][1] = {"fn": target}
        (tmp_path / "replay.json").write_text(json.dumps(data))
        with pytest.raises(HetpartError, match="may not call"):
            Replay.load(tmp_path)
    data["steps"][0][2] = {"pickle": "x"}
    data["steps"][0][1] = {"fn": ["_operator", "add"]}
    (tmp_path / "replay.json").write_text(json.dumps(data))
    with pytest.raises(HetpartError, match="no value it writes"):
        Replay.load(tmp_path)


def test_profile_out_a_link_to_a_fifo_is_refused_before_profiling(tmp_path, capsys):
    """review22: `profile --out /dev/stdout` (a link to the process's stdout) passed the checks made before
    profiling (a link is replaced, not read) and failed only at the write; a FIFO stands in for the stream."""
    import os

    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "stdout").symlink_to(tmp_path / "fifo")
    assert main(["profile", *MLP, "--out", str(tmp_path / "stdout"), "--repeats", "1", "--warmup", "0"]) == 2
    out, err = capsys.readouterr()
    assert "profiled" not in out and err.startswith(f"hetpart: error: --out {tmp_path / 'stdout'} is a link to a FIFO")


def test_profile_of_a_meta_only_model_says_why_it_cannot(tmp_path, capsys):
    """review22: `profile zoo:llama-7b` (meta-only: no weights are ever built) failed in torch.export with "Tensor on
    device cpu is not on the expected device meta!" and advice about the example inputs."""
    assert main(["profile", "zoo:llama-7b", "--out", str(tmp_path / "p.json"), "--seq-len", "8", "--repeats", "1"]) == 2
    err = capsys.readouterr().err
    assert "zoo:llama-7b is built on the meta device only" in err and "n_layers=1" in err and "Tensor on" not in err
    assert not (tmp_path / "p.json").exists()
