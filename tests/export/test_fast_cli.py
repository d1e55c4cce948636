"""Argument errors answer before torch is imported (NOTE [arguments before torch] in cli.py), with
"did you mean" suggestions; `hetpart check` validates and prints a cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hetpart.cli import main
from hetpart.models import ZOO
from hetpart.names import ZOO_NAMES

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, sys
from hetpart.cli import main
codes = [main(argv) for argv in json.loads(sys.argv[1])]
print(json.dumps({"codes": codes, "torch": sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))}))
"""


def run_without_torch(tmp_path: Path, *argvs: list[str]) -> tuple[dict, str]:
    """Each argv through `main` in one fresh interpreter; its exit codes, the torch modules it
    imported, and its stderr."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(list(argvs))], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1]), proc.stderr


def test_mistyped_names_fail_with_a_suggestion_before_torch_is_imported(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[[nodes]]\nname = "x"\ndevices = ["a100"]\n')
    out = str(tmp_path / "out")
    result, err = run_without_torch(
        tmp_path,
        ["partition", "zoo:gpt-small", "--cluster", "preset:mixed4", "--out", out],
        ["partition", "zoo:gpt-smal", "--cluster", "preset:mixed-4", "--out", out],
        ["partition", "zoo:gpt-small", "--cluster", str(bad), "--out", out],
        ["profile", "zoo:mlpp", "--out", str(tmp_path / "p.json")],
        ["check", "preset:cpu4"],
    )
    assert result == {"codes": [2, 2, 2, 2, 2], "torch": []}
    lines = err.splitlines()
    assert len(lines) == 5 and all(line.startswith("hetpart: error: ") for line in lines)
    assert "did you mean preset:mixed-4?" in lines[0]
    assert "did you mean zoo:gpt-small?" in lines[1]
    assert "bad.toml:3: unknown device type 'a100'" in lines[2] and "did you mean a100-80g or a100-40g?" in lines[2]
    assert "did you mean zoo:mlp?" in lines[3]
    assert "did you mean preset:cpu-4 or preset:cpu-8 or preset:cpu-6?" in lines[4]  # the closest first
    assert not (tmp_path / "out").exists() and not (tmp_path / "p.json").exists()


def test_zoo_names_match_the_zoo():
    assert ZOO_NAMES == tuple(ZOO)


def test_check_prints_devices_links_and_totals(tmp_path, capsys):
    path = tmp_path / "c.toml"
    path.write_text('[network]\nbandwidth_GBps = 12.5\nlatency_us = 10\n'
                    '[[nodes]]\nname = "a"\ndevices = ["h100-80g", {type = "t4-16g", mem_GiB = 8}]\n'
                    'link = { bandwidth_GBps = 64, latency_us = 3 }\n'
                    '[[nodes]]\nname = "b"\ndevices = ["cpu"]\n')
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    for text in ("a/0", "h100-80g", "a/1", "t4-16g", "b/0", "inside machine a", "machines (network)", "12.5",
                 "3 device(s) on 2 machine(s): 1 x h100-80g, 1 x t4-16g, 1 x cpu; 343.2 GiB of memory"):
        assert text in out, text
