"""benchmarks/idle_audit.py (idle19), the route README names for checking a plan's idle reasons: it must run on a
plan whose idle devices sit inside a used machine (no whole machine idle: the pair family had none to pair and
raised IndexError), recost the chosen plan to plan.json's step, and refuse a directory it cannot audit (exit 2)."""

import json
import subprocess
import sys
from pathlib import Path

from hetpart.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _audit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "idle_audit.py"), *args, "--limit-s", "1"],
                          capture_output=True, text=True, timeout=300)


def test_idle_audit_runs_on_a_plan_with_idle_devices_in_a_used_machine(tmp_path):
    out = tmp_path / "ia"
    assert main(["partition", "zoo:mlp", "--cluster", "preset:cpu-4", "--parallel", "data", "--mode", "training",
                 "--no-pt2", "--time-limit", "5", "--out", str(out)]) == 0
    pj = json.loads((out / "plan.json").read_text())
    assert pj["devices_idle"], "the test needs idle devices"
    got = _audit(str(out))
    assert got.returncode == 0, got.stderr
    chosen = next(line for line in got.stdout.splitlines() if line.startswith("| chosen |"))
    step_ms = float(chosen.split("|")[8])
    assert abs(step_ms - pj["iteration_us"] / 1000) < 0.05 + 1e-9, (chosen, pj["iteration_us"])


def test_idle_audit_refuses_a_directory_partition_did_not_write(tmp_path):
    got = _audit(str(tmp_path))
    assert got.returncode == 2 and "Traceback" not in got.stderr
    assert "give a directory `hetpart partition ... --parallel data --out DIR` wrote" in got.stderr
