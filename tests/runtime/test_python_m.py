"""`python -m hetpart` imports nothing from the working directory (NOTE [python -m and the working
directory] in hetpart/__main__.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_python_m_hetpart_does_not_import_a_torch_py_from_the_working_directory(tmp_path):
    canary = tmp_path / "PWNED"
    for name in ("torch", "numpy", "rich"):
        (tmp_path / f"{name}.py").write_text(f"open({str(canary)!r}, 'a').write({name!r})\nraise SystemExit(9)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYTHONSAFEPATH", None)
    done = subprocess.run([sys.executable, "-m", "hetpart", "inspect", "--help"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert not canary.exists(), f"imported from the working directory: {canary.read_text()}"
    assert done.returncode == 0 and "usage" in done.stdout, done.stderr


def test_python_m_hetpart_still_works_from_the_repository_root():
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    done = subprocess.run([sys.executable, "-m", "hetpart", "--help"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and "usage" in done.stdout, done.stderr
