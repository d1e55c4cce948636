"""`hetpart profile --tensor-parallel T` (NOTE [tensor-parallel profile]): each op timed as a TP rank runs it, and
the TP costs (NOTE [tensor-parallel costs]) reading those times where the profile has them, the scaling where not."""

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from hetpart.cli import main
from hetpart.errors import HetpartError
from hetpart.profiler.table import Profile

GPT = ["zoo:gpt-small", "--set", "n_layer=2", "--set", "n_embd=64", "--set", "vocab_size=128", "--set",
       "block_size=32", "--batch-size", "4", "--seq-len", "16", "--microbatches", "2"]


@pytest.fixture(scope="module")
def tp_profile(tmp_path_factory):
    path = tmp_path_factory.mktemp("tp-profile") / "gpt.json"
    assert main(["profile", *GPT, "--tensor-parallel", "2", "--repeats", "2", "--warmup", "0", "--out", str(path)]) == 0
    return path


def test_the_profile_times_each_op_as_a_rank_runs_it_keyed_by_the_whole_op(tp_profile):
    data = json.loads(tp_profile.read_text())
    roles = data["tp_forward_ns"]["2"]
    assert set(roles) == {"row", "split", "whole"}
    # Keyed by the whole op (the key partition computes), not the shard: a row linear reads the whole contraction
    # (256 = 4 x 64) and keeps its bias (added once, after the all-reduce, and timed with it); a column linear too.
    assert "aten.linear.default(f32[2,16,256], f32[64,256], f32[64])" in roles["row"]
    assert "aten.linear.default(f32[2,16,64], f32[256,64], f32[256])" in roles["split"]
    assert any(k.startswith("aten.layer_norm.default") for k in roles["whole"])
    assert all(ns > 0 for table in roles.values() for ns in table.values())
    # every key is one the ordinary entries have (the same whole model at the same microbatch)
    assert {k for table in roles.values() for k in table} <= set(data["forward_ns"])
    assert Profile.load(tp_profile).tp_forward_ns == {2: roles}


def test_the_tp_costs_use_the_measured_times_and_the_scaling_without_them(tp_profile):
    from hetpart.compile import analyze
    from hetpart.devices import load_cluster
    from hetpart.frontend import ModelSpec
    from hetpart.ir import info
    from hetpart.partitioner.costs import allreduce_ns
    from hetpart.partitioner.problem import TIME_NS
    from hetpart.passes import lower_to_problem
    from hetpart.passes.lower import group_of
    from hetpart.passes.tensor_parallel import TP_META
    from hetpart.passes.tp_lower import _link, lower_tensor_parallel

    prof = Profile.load(tp_profile)
    cluster = load_cluster("preset:cpu-2")
    spec = ModelSpec("zoo:gpt-small", {"n_layer": 2, "n_embd": 64, "vocab_size": 128, "block_size": 32}, 4, 16)
    gm = analyze(spec, cluster, 2, echo=lambda s: None, profiles={"cpu": prof}, tp_degrees=(2,)).gm
    plan, groups = gm.meta[TP_META][2], group_of(gm)
    link = _link(cluster.machines[0].link)
    nodes = {n.name: n for n in gm.graph.nodes}
    checked = {}
    for role in ("row", "split", "whole"):  # an op of each role alone in its problem node, measured
        name = next(n for n, v in groups.items() if plan.role(n) == role and info(nodes[n]).tp_cost_ns
                    and list(groups.values()).count(v) == 1 and nodes[n].target.__name__.startswith("linear"
                    if role != "whole" else "layer_norm"))
        checked[role] = name
    measured = {r: info(nodes[n]).tp_cost_ns["cpu"][2][r] for r, n in checked.items()}
    extra = {r: allreduce_ns(link, info(nodes[n]).out_bytes, 2) if r == "row" else 0 for r, n in checked.items()}

    def times() -> dict[str, int]:
        problem = lower_to_problem(gm, cluster, None, groups)
        lowered = lower_tensor_parallel(problem, gm, cluster, plan, groups, training=False)[0]
        return {r: lowered.graph.nodes[groups[n]][TIME_NS]["cpu/tp2"] - extra[r] for r, n in checked.items()}

    assert times() == measured
    saved = {n: info(nodes[n]).tp_cost_ns for n in checked.values()}
    try:  # negative control: without the entries, the scaling of the ordinary (whole) times, as before
        for n in checked.values():
            info(nodes[n]).tp_cost_ns = {}
        scaled = times()
    finally:
        for n, tp in saved.items():
            info(nodes[n]).tp_cost_ns = tp
    assert scaled["whole"] == info(nodes[checked["whole"]]).cost_ns["cpu"]
    for role in ("row", "split"):  # a linear at half its size: about half its whole time on the roofline's ratio
        whole = info(nodes[checked[role]]).cost_ns["cpu"]
        assert scaled[role] != measured[role] and whole / 3 < scaled[role] < whole


def test_tp_entries_round_trip_scale_and_bad_ones_are_refused(tmp_path):
    prof = Profile("cpu", 1, {"k": 10}, tp_forward_ns={2: {"row": {"k": 8}, "whole": {"k": 12}}})
    path = tmp_path / "p.json"
    prof.save(path)
    assert Profile.load(path).tp_forward_ns == {2: {"row": {"k": 8}, "whole": {"k": 12}}}
    assert prof.scaled(2).tp_forward_ns == {2: {"row": {"k": 4}, "whole": {"k": 6}}}
    plain = Profile("cpu", 1, {"k": 10})
    plain.save(path)
    assert "tp_forward_ns" not in json.loads(path.read_text()) and Profile.load(path).tp_forward_ns == {}
    for bad in ({"1": {"row": {}}}, {"2": {"columns": {}}}, {"2": {"row": {"k": -1}}}, {"x": {}}, []):
        path.write_text(json.dumps({**plain.to_json(), "tp_forward_ns": bad}))
        with pytest.raises(HetpartError, match="tp_forward_ns must map degrees"):
            Profile.load(path)


def test_lockstep_parties_never_run_ahead_of_each_other(tmp_path):
    from hetpart.profiler.tp_profile import Lockstep

    path = tmp_path / "barrier"
    Lockstep.create(path, 2)
    seen: list[tuple[int, int]] = []
    lock = threading.Lock()

    def party(k: int) -> None:
        me = Lockstep(path, 2, k, timeout_s=30)
        for i in range(1, 51):
            assert me.arrive()
            with lock:
                seen.append((k, i))
        me.close()

    threads = [threading.Thread(target=party, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ahead = {0: 0, 1: 0}
    for k, i in seen:  # when a party is past its i-th arrival, the other has made its i-th
        ahead[k] = i
        assert i <= ahead[1 - k] + 1
    stopper = Lockstep(path, 2, 0)
    stopper.stop()
    assert not Lockstep(path, 2, 1).arrive()  # stopped: a waiting party is let go, told so


def test_nothing_in_the_partitioner_imports_torch():
    code = ("import importlib, pkgutil, sys, hetpart.partitioner as p\n"
            "for m in pkgutil.iter_modules(p.__path__): importlib.import_module('hetpart.partitioner.' + m.name)\n"
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])
