"""NOTE [an output is no input] (hetpart/fsio.py): an output never lands on what the same command reads, --force
or not: `replan OLD --out OLD`, `export --key K --out K`, and `partition --out` inside `--dump-ir`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hetpart.cli import main
from hetpart.codegen.publish import write_logs_marker
from hetpart.fsio import replaces_input

MLP = ["zoo:mlp", "--set", "hidden=64", "--set", "n_blocks=3", "--batch-size", "8", "--microbatches", "2", "--no-pt2",
       "--cluster", "preset:cpu-4", "--time-limit", "3"]
KEY = "0123456789abcdef" * 4 + "\n"


def _tree(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() and not p.is_symlink() else None
            for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="module")
def old(tmp_path_factory) -> Path:
    """A signed plan, with what a `run` of it adds (logs/ and measured.json): what a replan onto it would delete."""
    top = tmp_path_factory.mktemp("old")
    (top / "key").write_text(KEY)
    out = top / "old"
    assert main(["partition", *MLP, "--out", str(out), "--sign-key", str(top / "key")]) == 0
    (out / "logs").mkdir()
    (out / "logs" / "torchrun0.log").write_text("the run that died")
    write_logs_marker(out / "logs")
    (out / "measured.json").write_text(json.dumps({"stages": [], "step_time_us": 1.0}))
    return out


@pytest.mark.parametrize("force", [[], ["--force"]])
@pytest.mark.parametrize("how", ["same", "dot", "link", "parent"])
def test_replan_refuses_to_write_over_the_plan_it_reads(old, tmp_path, monkeypatch, capsys, force, how):
    """`replan OLD --out OLD --force` replaced the old plan (exit 0), its run's logs/ and measured.json gone;
    without --force it advised --force. Now exit 2 before anything is re-planned or printed, OLD as it was,
    however OLD and --out are spelled (a link to OLD, OLD/., a folder holding OLD)."""
    monkeypatch.chdir(old.parent)
    if how == "link":
        (tmp_path / "latest").symlink_to(old)
    src, out, verb = {"same": ("old", "old", "is"), "dot": ("old", "old/.", "is"),
                      "link": (str(tmp_path / "latest"), "old", "is"), "parent": ("old/ir/..", ".", "holds")}[how]
    before = _tree(old.parent)
    capsys.readouterr()
    assert main(["replan", src, "--lose", "local/1", "--out", out, "--time-limit", "2", *force]) == 2
    got = capsys.readouterr()
    assert not got.out and got.err.startswith(f"hetpart: error: --out {Path(out)} {verb} OLD_DIR {src}, the plan "), got
    assert "nothing was changed: pass a new --out" in got.err and "Traceback" not in got.err
    assert _tree(old.parent) == before


def test_export_refuses_to_write_over_its_key(old, tmp_path, capsys):
    """`export DIR --key K --out K --force` wrote the DeepSpeed config over the signing key; so would torchtitan's
    companion FILE.schedule.csv. Now exit 2, the key as it was; another --out is written (the negative control)."""
    key = old.parent / "key"
    companion = tmp_path / "titan.schedule.csv"
    companion.write_text(KEY)
    for fmt, k, out in (("deepspeed", key, key), ("torchtitan", companion, tmp_path / "titan.toml")):
        assert main(["export", str(old), "--format", fmt, "--key", str(k), "--out", str(out), "--force"]) == 2
        err = capsys.readouterr().err
        assert f"which is the --key file {k} it reads" in err and "nothing was written" in err, err
        assert k.read_text() == KEY and not (tmp_path / "titan.toml").exists()
    assert main(["export", str(old), "--format", "deepspeed", "--key", str(key), "--out", str(tmp_path / "ds.json"),
                 "--force"]) == 0
    assert key.read_text() == KEY and (tmp_path / "ds.json").is_file()


def test_partition_refuses_an_out_inside_the_dump_dir_before_it_traces(tmp_path, capsys, monkeypatch):
    """`partition --out D/out --dump-ir D` traced the model and then refused D for the staging lock it had put there
    itself ("holds '.out.lock'"); now it is refused first, with the reason, and D is never made."""
    import hetpart.compile as compile_

    def traced(*args, **kwargs):
        raise AssertionError("traced before the options were refused")

    monkeypatch.setattr(compile_, "trace_model", traced)
    dumps = tmp_path / "d"
    assert main(["partition", *MLP, "--out", str(dumps / "out"), "--dump-ir", str(dumps)]) == 2
    err = capsys.readouterr().err
    assert f"--out {dumps / 'out'} is inside --dump-ir {dumps}" in err and ".lock" not in err, err
    assert not dumps.exists()


def test_replaces_input_by_place(tmp_path):
    """The rule on its own: an output at an input's place or holding it; a link at the output is its own place only
    where the write replaces the link (`follow=False`); beside it, nothing."""
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f").write_text("x")
    (tmp_path / "to_f").symlink_to(tmp_path / "a" / "f")
    inputs = {"--in": tmp_path / "a" / "f", "--none": None}
    assert replaces_input(tmp_path / "a" / "f", inputs) == "--in"
    assert replaces_input(tmp_path / "a", inputs) == replaces_input(tmp_path, inputs) == "--in"
    assert replaces_input(tmp_path / "a" / "g", inputs) is None and replaces_input(tmp_path / "b", inputs) is None
    assert replaces_input(tmp_path / "to_f", inputs) == "--in"  # written through: the input
    assert replaces_input(tmp_path / "to_f", inputs, follow=False) is None  # the link is replaced, not f
    assert replaces_input(tmp_path / "a" / "f", {"--in": tmp_path / "to_f"}) == "--in"  # the input by a link
    assert replaces_input(Path(os.path.relpath(tmp_path / "a" / ".", Path.cwd())), inputs) == "--in"
