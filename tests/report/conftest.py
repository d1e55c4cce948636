"""One small partition shared by the report and inspect tests (about 3 s)."""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from pathlib import Path

import pytest

from hetpart.cli import main

MLP = ["zoo:mlp", "--set", "hidden=32", "--set", "n_blocks=2"]


@dataclass(frozen=True)
class Partitioned:
    out: Path
    dump_dir: Path  # --dump-ir DIR
    stdout: str


@pytest.fixture(scope="session")
def partitioned(tmp_path_factory) -> Partitioned:
    root = tmp_path_factory.mktemp("partitioned")
    out, dumps = root / "out", root / "dumps"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["partition", *MLP, "--cluster", "preset:mixed-4", "--out", str(out), "--dump-ir", str(dumps),
                     "--verbose"])
    assert code == 0, buf.getvalue()
    return Partitioned(out, dumps, buf.getvalue())
