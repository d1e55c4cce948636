"""Faults during `hetpart run`: a rank killed mid-run, a port in use, a rank without its files, a timeout.

Each ends with one clear error naming the rank (or the port), a non-zero status and no rank
left running. Ranks are killed with the worker's test-only HETPART_TEST_CRASH_RANK hook
(NOTE [test-only crash hook] in hetpart/runtime/worker.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hetpart.cli import main
from hetpart.runtime import launch
from tests.launched import ranks_started_by, started_by

# One CPU per machine, each too small for all of zoo:mlp below (8.6 MB): the plan has two stages.
TWO_MACHINES = """
[network]
bandwidth_GBps = 1
latency_us = 50

[[nodes]]
name = "a"
devices = [{type = "cpu", mem_GB = 0.006}]
link = { bandwidth_GBps = 2, latency_us = 20 }

[[nodes]]
name = "b"
devices = [{type = "cpu", mem_GB = 0.006}]
link = { bandwidth_GBps = 2, latency_us = 20 }
"""
MLP = ["zoo:mlp", "--set", "hidden=256", "--set", "n_blocks=4", "--batch-size", "64", "--microbatches", "2",
       "--no-pt2"]


def _partition(out: Path, cluster: str) -> Path:
    assert main(["partition", *MLP, "--cluster", cluster, "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Path:
    """zoo:mlp on two CPUs of one machine: one torchrun, two ranks."""
    return _partition(tmp_path_factory.mktemp("faults") / "mlp", "preset:cpu-2")


def _with_marker(marker: Path) -> list[int]:
    """Pids of processes whose command line holds `marker` (a test's own stand-ins for torchrun and a rank)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and str(marker).encode() in (proc / "cmdline").read_bytes():
                pids.append(int(proc.name))
        except OSError:  # gone meanwhile
            pass
    return pids


def _error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("hetpart: error: ") and "Traceback" not in err, err
    return err


def test_a_killed_rank_stops_the_run_and_is_named(two_ranks, monkeypatch, capsys):
    monkeypatch.setenv("HETPART_TEST_CRASH_RANK", "1")
    assert main(["run", str(two_ranks), "--timeout", "300"]) == 1
    err = _error(capsys)
    assert "rank 1 (stage 1 on local/1) was killed by SIGKILL" in err, err
    assert "rank 1: loaded rank1/stage.py" in err, "the tail of the dead rank's own log"
    assert "(--timeout)" not in err, "stopped by the failure, not by --timeout"
    assert started_by() == [], "torchrun, its server and every rank ended with the run"


def test_a_killed_rank_on_one_node_stops_the_other_node(tmp_path, monkeypatch, capsys):
    # Rank 0 dies after its first microbatch; rank 1, in another torchrun, waits for the second
    # in gloo. Its torchrun knows nothing of the failure: the launcher stops it.
    cluster = tmp_path / "two.toml"
    cluster.write_text(TWO_MACHINES)
    out = _partition(tmp_path / "mlp", str(cluster))
    assert [n["ranks"] for n in json.loads((out / "manifest.json").read_text())["nodes"]] == [[0], [1]]
    capsys.readouterr()
    monkeypatch.setenv("HETPART_TEST_CRASH_RANK", "0")
    assert main(["run", str(out), "--as-nodes", "--timeout", "300"]) == 1
    err = _error(capsys)
    assert "rank 0 (stage 0 on " in err and "was killed by SIGKILL" in err, err
    assert "node0" in err, "the dead rank's log is under its node's log directory"
    assert "(--timeout)" not in err, "the launcher stopped the other node, not --timeout"
    assert started_by() == [], "torchrun, its server and every rank ended with the run"


def test_a_rank_that_cannot_find_its_files(two_ranks, tmp_path, monkeypatch, capsys):
    copy = tmp_path / "copy"
    shutil.copytree(two_ranks, copy)
    shutil.rmtree(copy / "rank1")
    shutil.rmtree(copy / "logs", ignore_errors=True)  # from an earlier test's run
    # The launcher checks every rank's files before it starts torchrun.
    assert main(["run", str(copy)]) == 2
    err = _error(capsys)
    assert f"rank 1: '{copy / 'rank1' / 'stage.py'}' is missing; re-run `hetpart partition ... --out {copy} --force`" \
        in err
    assert not (copy / "logs").exists(), "nothing was started"
    # On a real cluster the rank's machine may lack them although the launcher's has them:
    # the rank reports it, and its peer is stopped.
    monkeypatch.setattr(launch, "check_rank_files", lambda out, entry: out / entry["dir"])
    assert main(["run", str(copy), "--timeout", "300"]) == 2
    err = _error(capsys)
    assert "rank 1 (stage 1 on local/1) exited with status 2" in err, err
    assert "hetpart: rank 1: " in err and "rank1/stage.py' is missing" in err
    assert started_by() == [], "torchrun, its server and every rank ended with the run"


@pytest.fixture()
def taken_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_a_master_port_in_use_is_refused_before_starting(two_ranks, taken_port, capsys):
    assert main(["run", str(two_ranks), "--master-port", str(taken_port)]) == 2
    err = _error(capsys)
    assert f"--master-port {taken_port}: 127.0.0.1:{taken_port} is not free" in err
    assert "leave --master-port out" in err


def test_a_port_taken_after_the_check_fails_fast(two_ranks, taken_port, monkeypatch, capsys):
    # Another process can take the port between the check and torchrun's bind.
    monkeypatch.setattr(launch, "_check_port_free", lambda port: None)
    assert main(["run", str(two_ranks), "--master-port", str(taken_port), "--timeout", "300"]) == 1
    err = _error(capsys)
    assert "(--timeout)" not in err, "the bind failure ends the run, not --timeout"
    assert f"could not listen on port {taken_port} of 127.0.0.1: address already in use" in err
    assert started_by() == [], "torchrun, its server and every rank ended with the run"


def test_a_run_past_its_timeout_is_stopped(two_ranks, capsys):
    assert main(["run", str(two_ranks), "--timeout", "2"]) == 1
    err = _error(capsys)
    assert "did not finish in 2 s (--timeout); every rank was stopped" in err
    assert started_by() == [], "torchrun, its server and every rank ended with the run"


def test_bad_timeout_and_port_values(two_ranks, capsys):
    assert main(["run", str(two_ranks), "--timeout", "0"]) == 2
    assert "--timeout must be positive" in _error(capsys)
    assert main(["run", str(two_ranks), "--master-port", "70000"]) == 2
    assert "--master-port must be <= 65535 (got 70000)" in _error(capsys)


def test_a_world_size_torchrun_did_not_plan(two_ranks, tmp_path, monkeypatch, capsys):
    # launch.sh started by hand with another --nproc-per-node: the rank refuses before any send.
    from hetpart.runtime import worker

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(key, value)
    assert worker.main([str(two_ranks), "--io", str(tmp_path), "--microbatches", "2", "--device", "cpu"]) == 2
    assert "hetpart: rank 0: the plan has 2 ranks but torchrun started 1" in capsys.readouterr().err


def test_every_rank_exits_when_the_launcher_is_killed_or_hung_up(tmp_path):
    """torchrun leads a session of its own: a SIGKILLed (or, before its handler, SIGHUPed) `hetpart
    run` left it and every rank running (NOTE [orphaned ranks] in hetpart/runtime/worker.py).

    Both signals in one test, each to its own launcher on its own copy of one plan, started together:
    each launch is one process at a time (launcher, torchrun, one rank), so on 2 cores the two
    start-ups overlap instead of following each other."""
    plan = tmp_path / "mlp"
    assert main(["partition", "zoo:mlp", "--set", "hidden=64", "--set", "n_blocks=2", "--batch-size", "8",
                 "--microbatches", "2", "--cluster", "preset:cpu-2", "--no-pt2", "--out", str(plan)]) == 0
    world = json.loads((plan / "manifest.json").read_text())["world_size"]
    outs = {sig: tmp_path / f"out-{sig.name}" for sig in (signal.SIGKILL, signal.SIGHUP)}
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    launchers: dict[signal.Signals, subprocess.Popen] = {}
    try:
        for sig, out in outs.items():
            shutil.copytree(plan, out)
            with (tmp_path / f"run-{sig.name}.log").open("w") as f:
                # SIGHUP as a terminal gives it: not ignored, whether or not pytest runs under nohup (whose
                # ignored SIGHUP the launcher keeps, hetpart/cli.py TERMINATING)
                launchers[sig] = subprocess.Popen([sys.executable, "-m", "hetpart", "run", str(out), "--steps",
                                                   "1000000"], env=env, stdout=f, stderr=subprocess.STDOUT,
                                                  preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
        deadline = time.monotonic() + 120
        for sig, out in outs.items():
            launcher, log = launchers[sig], tmp_path / f"run-{sig.name}.log"
            while len(ranks_started_by(launcher.pid)) < world:  # every rank started
                assert launcher.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
            for pid in ranks_started_by(launcher.pid):  # forked from torchrun's forkserver (NOTE [forked ranks])
                assert b"multiprocessing.forkserver" in (Path("/proc") / str(pid) / "cmdline").read_bytes()
            while "step" not in "".join(p.read_text(errors="replace") for p in (out / "logs").rglob("stdout.log")):
                assert launcher.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)  # the ranks past their start, stepping
        for sig, launcher in launchers.items():
            launcher.send_signal(sig)
        # a SIGHUPed launcher cleans up and exits; a SIGKILLed one stays a zombie, not yet reaped
        assert launchers[signal.SIGHUP].wait(timeout=60) == 128 + signal.SIGHUP, \
            (tmp_path / "run-SIGHUP.log").read_text()
        deadline = time.monotonic() + 30  # the watchdog polls each second; torchrun then stops
        while any(started_by(launcher.pid) for launcher in launchers.values()) and time.monotonic() < deadline:
            time.sleep(0.2)
        for sig, launcher in launchers.items():
            assert not started_by(launcher.pid), f"torchrun or ranks outlived the launcher ({sig.name})"
    finally:
        for launcher in launchers.values():
            for pid in started_by(launcher.pid):  # what this test started, if the assertion failed
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for launcher in launchers.values():
            if launcher.poll() is None:
                launcher.kill()
            launcher.wait()


def test_stop_waits_out_and_ends_a_rank_that_outlives_its_torchrun(tmp_path):
    # NOTE [orphaned ranks]: a rank can outlive its torchrun; "every rank was stopped" must be true when said.
    marker = tmp_path / "outlives"
    child = f"import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)  # {marker}"
    leader = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys, time; subprocess.Popen([sys.executable, "
                               f"'-c', {child!r}]); time.sleep(60)"], start_new_session=True)
    try:
        time.sleep(1.0)  # the child runs and ignores SIGTERM
        assert _with_marker(marker)
        launch._stop([leader], grace_s=1)
        assert _with_marker(marker) == []
    finally:
        for pid in _with_marker(marker):  # only what this test started
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_ranks_are_forked_from_torchruns_forkserver_except_under_emulate(tmp_path):
    """NOTE [forked ranks]: `hetpart run` starts torchrun as hetpart.runtime.agent with the forkserver and the worker's
    file; emulated runs (whose mover finds ranks by their /proc environment) keep torchrun's exec'd ranks."""
    manifest = {"world_size": 3, "nodes": [{"node_rank": 0, "ranks": [0, 1]}, {"node_rank": 1, "ranks": [2]}]}
    for as_nodes, port in ((False, None), (True, None), (False, 29999)):
        forked = launch._torchrun_commands(manifest, tmp_path, as_nodes, port, forked=True)
        execd = launch._torchrun_commands(manifest, tmp_path, as_nodes, port, forked=False)
        assert len(forked) == len(execd) == (2 if as_nodes else 1)
        for f, e in zip(forked, execd):
            assert f[1:3] == ["-m", "hetpart.runtime.agent"] and e[1:3] == ["-m", "torch.distributed.run"]
            assert f[-4:-1] == ["--start-method", "forkserver", "--run-path"] and Path(f[-1]) == Path(
                launch.__file__).with_name("worker.py") and Path(f[-1]).is_file()
            same = [a for a in f[3:-4] if port or not a.startswith("--master-port=")]  # a free port each call
            assert e[-2:] == ["-m", "hetpart.runtime.worker"] and same == [
                a for a in e[3:-2] if port or not a.startswith("--master-port=")]  # the same torchrun flags
