"""`hetpart run --emulate` (NOTE [emulated devices] in hetpart/runtime/emulate.py) and measured.json's spreads."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hetpart.cli import main
from hetpart.errors import HetpartError
from hetpart.plan_report import PlanReport, load_plan
from hetpart.runtime.emulate import CGROUP_ENV, PERIOD_US, emulation_plan, find_hierarchy
from hetpart.runtime.measured import time_stats_us
from tests.runtime.test_faults import MLP, TWO_MACHINES


def _plan(types: list[str], model_us: dict[str, float] | None, cores: dict[str, int] | None = None) -> PlanReport:
    """The fields of plan.json `emulation_plan` reads, through the one loader (NOTE [plan.json fields])."""
    devices = [{"name": f"m/{i}", "type": t, "machine": "m", "mem_bytes": 1,
                **({"core": cores[f"m/{i}"]} if cores and f"m/{i}" in cores else {})} for i, t in enumerate(types)]
    stage = {"node_count": 1, "flops": 0, "predicted_time_us": 1.0, "compute_us": 1.0, "comm_in_us": 0.0,
             "comm_out_us": 0.0, "memory_bytes": 1, "capacity_bytes": 1}
    return load_plan(Path("plan.json"), {
        "model": {"model": "zoo:mlp", "overrides": {}, "batch_size": 8, "seq_len": 0, "seed": 0},
        "cluster": {"name": "c", "devices": devices}, "microbatches": 1, "microbatch_size": 8,
        "bottleneck_us": 1.0, "lower_bound_us": 1.0, "gap": 0.0, "solver_status": "OPTIMAL",
        "stages": [{"index": k, "device": d["name"], "device_type": d["type"], **stage} for k, d in enumerate(devices)],
        "emulation": None if model_us is None else {"type_model_us": model_us, "profiled_types": []}})


def test_shares_follow_the_types_speeds_round_robin_over_cores():
    e = emulation_plan(_plan(["fast", "slow"], {"fast": 100.0, "slow": 250.0}), cores=[3, 5])
    assert [(s.core, round(s.share, 3)) for s in e.slots] == [(3, 1.0), (5, 0.4)]
    assert e.slots[1].quota_us == round(0.4 * PERIOD_US) and e.scale == 1.0
    assert e.speed_source == "cost model (roofline)"


def test_ranks_sharing_a_core_are_scaled_so_none_waits():
    # 4 ranks on 2 cores: 1.0 + 0.5 on core 0, 0.8 + 0.4 on core 1: all scaled by 1/1.5, ratios kept.
    e = emulation_plan(_plan(["a", "b", "c", "d"], {"a": 100.0, "b": 125.0, "c": 200.0, "d": 250.0}), cores=[0, 1])
    assert [s.core for s in e.slots] == [0, 1, 0, 1]
    assert abs(e.scale - 1 / 1.5) < 1e-9
    assert [round(s.share / e.slots[0].share, 3) for s in e.slots] == [1.0, 0.8, 0.5, 0.4]
    assert max(sum(s.share for s in e.slots if s.core == c) for c in (0, 1)) <= 1 + 1e-9


def test_the_cluster_file_core_is_used_and_checked():
    e = emulation_plan(_plan(["a", "a"], {"a": 1.0}, cores={"m/0": 1, "m/1": 1}), cores=[0, 1])
    assert [s.core for s in e.slots] == [1, 1] and abs(e.scale - 0.5) < 1e-9
    with pytest.raises(HetpartError, match="puts device m/0 on core 7"):
        emulation_plan(_plan(["a"], {"a": 1.0}, cores={"m/0": 7}), cores=[0, 1])


def test_one_slot_per_rank_where_ranks_and_stages_differ():
    # A tensor-parallel plan: 2 stages of 2 ranks each (4 ranks), each rank throttled to its own device's type.
    plan = _plan(["fast", "fast", "slow", "slow"], {"fast": 100.0, "slow": 200.0})
    e = emulation_plan(plan, cores=[0, 1], rank_devices=["m/0", "m/1", "m/2", "m/3"])
    assert [(s.rank, s.device, s.core, round(s.share, 3)) for s in e.slots] == [
        (0, "m/0", 0, 0.667), (1, "m/1", 1, 0.667), (2, "m/2", 0, 0.333), (3, "m/3", 1, 0.333)]
    # A virtual-stage plan: 4 stages on 2 devices, one rank per device (not per stage).
    e = emulation_plan(plan, cores=[0, 1], rank_devices=["m/0", "m/2"])
    assert [(s.rank, s.device_type, round(s.share, 3)) for s in e.slots] == [(0, "fast", 1.0), (1, "slow", 0.5)]


def test_a_plan_without_speeds_is_refused():
    with pytest.raises(HetpartError, match="no device speeds"):
        emulation_plan(_plan(["a"], None))


def test_no_writable_cgroup_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv(CGROUP_ENV, str(tmp_path))
    with pytest.raises(HetpartError, match="--emulate needs a writable cgroup with the cpu controller"):
        find_hierarchy()


def test_time_stats_keep_the_spread():
    s = time_stats_us([0.001 * i for i in range(1, 12)])  # 1..11 ms
    assert (s["n"], s["median"], s["mean"], s["p10"], s["p90"]) == (11, 6000.0, 6000.0, 2000.0, 10000.0)
    assert time_stats_us([0.5])["p90"] == 500000.0


def _writable_cgroup() -> str | None:
    try:
        find_hierarchy()
    except HetpartError as err:
        return str(err)
    return None


def _ours(launcher_pid: int) -> list[Path]:
    return [p for root in (Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup"), Path(os.environ.get(CGROUP_ENV, "/x")))
            if root.is_dir() for p in root.glob(f"hetpart-emulate-{launcher_pid}-rank*")]


def _populated(groups: list[Path], count: int) -> bool:
    """`count` cgroups, each holding a process (False while one is being made or removed)."""
    try:
        return len(groups) == count and all((g / "cgroup.procs").read_text().split() for g in groups)
    except OSError:
        return False


@pytest.mark.skipif(_writable_cgroup() is not None, reason=f"cgroups are not writable here: {_writable_cgroup()}")
def test_emulated_ranks_are_throttled_and_their_cgroups_removed_on_ctrl_c(tmp_path):
    """Each rank is in a cgroup of its own with its quota while it runs; a SIGINT to the launcher removes them."""
    out = tmp_path / "mlp"
    cluster = tmp_path / "two.toml"
    cluster.write_text(TWO_MACHINES)  # too little memory for one stage: two ranks
    assert main(["partition", *MLP, "--cluster", str(cluster), "--out", str(out)]) == 0
    root = Path(__file__).resolve().parents[2]
    log = tmp_path / "run.log"
    with log.open("w") as f:
        launcher = subprocess.Popen([sys.executable, "-m", "hetpart", "run", str(out), "--emulate",
                                     "--steps", "1000000"], env={**os.environ, "PYTHONPATH": str(root)},
                                    stdout=f, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        # The launcher's mover places each rank in its cgroup as soon as torchrun starts it, before the
        # rank imports torch: no need to wait for a step (the Ctrl-C cleans up the same either way).
        while not _populated(groups := _ours(launcher.pid), 2):
            assert launcher.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        assert len(groups) == 2, log.read_text()
        for g in groups:
            assert (g / "cgroup.procs").read_text().split(), f"no rank in {g}"  # the watcher moved it in
            v1 = (g / "cpu.cfs_period_us").exists()
            assert str(PERIOD_US) in ((g / "cpu.cfs_period_us") if v1 else (g / "cpu.max")).read_text()
        launcher.send_signal(signal.SIGINT)
        assert launcher.wait(timeout=60) == 130, log.read_text()
        assert not _ours(launcher.pid), "cgroups outlived the run"
        assert "emulating 2 device(s)" in log.read_text()
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        for g in _ours(launcher.pid):  # what this test made, if an assertion failed
            with contextlib.suppress(OSError):
                for pid in (g / "cgroup.procs").read_text().split():
                    os.kill(int(pid), signal.SIGKILL)
                time.sleep(0.5)
                g.rmdir()


def test_the_cluster_file_says_which_core_emulates_a_device():
    from hetpart.devices.cluster import parse_cluster

    c = parse_cluster('[[nodes]]\nname = "a"\ndevices = ["cpu", {type = "cpu", core = 1}]\n', "c.toml", "c")
    assert [d.core for d in c.devices] == [None, 1]
    with pytest.raises(HetpartError, match=r"'core' is a CPU core number >= 0"):
        parse_cluster('[[nodes]]\nname = "a"\ndevices = [{type = "cpu", core = -1}]\n', "c.toml", "c")


@pytest.mark.skipif(_writable_cgroup() is not None, reason=f"cgroups are not writable here: {_writable_cgroup()}")
def test_a_cgroup_whose_quota_is_refused_is_removed_and_the_error_names_the_setting(monkeypatch):
    """cgroup v1 refuses a child's quota above its parent's (EINVAL): the cgroup just made was left behind, and
    the error said 'could not create the cgroup None ... run as root'."""
    from hetpart.runtime.emulate import Emulation, RankSlot, emulated

    hierarchy = find_hierarchy()
    if hierarchy.version != 1:
        pytest.skip("cgroup v2 caps a child's cpu.max by its parent's without refusing it")
    parent = hierarchy.parent / f"hetpart-test-{os.getpid()}"
    parent.mkdir()
    try:
        (parent / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (parent / "cpu.cfs_quota_us").write_text(str(PERIOD_US // 2))  # half a core
        monkeypatch.setenv(CGROUP_ENV, str(parent))
        whole_core = Emulation([RankSlot(0, "m/0", "cpu", 0, 1.0)], "cost model (roofline)", 1.0)
        with pytest.raises(HetpartError, match=r"could not write '10000' to .*cpu.cfs_quota_us \(Invalid argument\)"):
            with emulated(whole_core, echo=lambda line: None):
                pass
        assert not list(parent.glob("hetpart-emulate-*"))
    finally:
        for g in parent.glob("hetpart-emulate-*"):
            g.rmdir()
        parent.rmdir()
