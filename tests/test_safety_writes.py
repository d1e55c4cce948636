"""Issue 18, the write side: what --force may replace, concurrent partitions, symlinks planted in an
artifacts directory, all-or-nothing shard-weights, signals, and launch.sh quoting.

NOTE [what --force replaces] in codegen/publish.py, NOTE [safe writes] in fsio.py.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import hetpart
from hetpart.cli import main
from hetpart.codegen import launch_script
from hetpart.codegen.artifacts import FORMAT_VERSION
from hetpart.codegen.publish import MARKER, write_logs_marker
from hetpart.fsio import inside_artifacts
from hetpart.frontend import ModelSpec, load_model
from hetpart.runtime.artifacts import check_rank_files, load_manifest
from tests.launched import ranks_started_by, started_by

MLP = ["zoo:mlp", "--set", "hidden=32", "--set", "n_blocks=2", "--cluster", "preset:cpu-2", "--no-pt2",
       "--time-limit", "5"]
# Big enough that cpu-2's plan has two stages.
MLP_2RANK = ["zoo:mlp", "--set", "hidden=256", "--set", "n_blocks=4", "--batch-size", "64", "--microbatches", "2",
             "--cluster", "preset:cpu-2", "--no-pt2", "--time-limit", "5"]
ROOT = Path(hetpart.__file__).parent.parent
RUN_DIR = "none_k5xhq_qu"  # torchrun's run folder in logs/: <run id>_<mkdtemp's 8 characters>
MEASURED = {"stages": [], "step_time_us": 1.0, "schedule": "gpipe", "microbatches": 4, "predicted_step_time_us": None}


def _error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("hetpart: error: ") and "Traceback" not in err, err
    return err


def _tree(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    """An artifacts directory `partition` wrote."""
    out = tmp_path_factory.mktemp("written") / "out"
    assert main(["partition", *MLP, "--out", str(out)]) == 0
    return out


@pytest.fixture
def copy(written, tmp_path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(written, out)
    return out


# --- 1. --force replaces only what hetpart wrote -----------------------------------------------

def test_every_artifacts_directory_has_a_marker_listing_its_files(written):
    marker = json.loads((written / MARKER).read_text())
    files = {str(p.relative_to(written)) for p in written.rglob("*") if p.is_file()} - {MARKER}
    assert marker["marker_version"] == 1 and marker["format_version"] == FORMAT_VERSION and set(marker["files"]) == files
    assert {"plan.json", "manifest.json", "launch.sh", "rank0/stage.py", "ir/graph.json"} <= files


def test_force_refuses_the_current_directory_of_a_project(tmp_path, monkeypatch, capsys):
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "NOTES.md").write_text("mine")
    (project / "src" / "train.py").write_text("print('mine')")
    before = _tree(tmp_path)
    monkeypatch.chdir(project)
    assert main(["partition", *MLP, "--out", ".", "--force"]) == 2
    assert f"'{project}' has no {MARKER} marker" in _error(capsys)
    assert _tree(tmp_path) == before
    assert main(["partition", *MLP, "--out", "..", "--force"]) == 2  # a parent of the current directory
    assert _tree(tmp_path) == before


def test_force_refuses_the_folder_of_the_model_file(tmp_path, capsys):
    (tmp_path / "models.py").write_text("def build():\n    raise AssertionError('not reached')\n")
    assert main(["partition", f"{tmp_path}/models.py:build", "--cluster", "preset:cpu-2", "--out", str(tmp_path),
                 "--force"]) == 2
    assert "has no .hetpart marker" in _error(capsys)
    assert [p.name for p in tmp_path.iterdir()] == ["models.py"]


@pytest.mark.parametrize("planted, named", [
    ("NOTES.md", "NOTES.md"),
    ("ir/notes.txt", "ir/notes.txt"),
    ("src/train.py", "src"),
    ("rank0/extra.bin", "rank0/extra.bin"),
])
def test_force_refuses_a_hetpart_directory_holding_a_file_of_someone_else(copy, capsys, planted, named):
    (copy / planted).parent.mkdir(parents=True, exist_ok=True)
    (copy / planted).write_text("mine")
    before = _tree(copy)
    assert main(["partition", *MLP, "--out", str(copy), "--force"]) == 2
    assert f"'{copy}' holds '{named}', which hetpart did not write" in _error(capsys)
    assert _tree(copy) == before and sorted(p.name for p in copy.parent.iterdir()) == ["out"]


@pytest.mark.parametrize("marker", [
    "[" * 100_000,  # nested past Python's recursion limit: a traceback before one parser read it
    '{"marker_version": 1, "files": "plan.json"}',  # a string: read once as a set of its letters
    '{"marker_version": 1, "files": [["plan.json"]]}',
    '{"marker_version": 2, "files": []}',
    "[]",
])
def test_force_refuses_a_marker_it_cannot_read_and_outputs_still_stay_outside(copy, tmp_path, capsys, marker):
    (copy / MARKER).write_text(marker)
    before = _tree(copy)
    assert main(["partition", *MLP, "--out", str(copy), "--force"]) == 2
    assert f"'{copy}' has a {MARKER} marker this hetpart cannot read" in _error(capsys)
    assert _tree(copy) == before and sorted(p.name for p in copy.parent.iterdir()) == ["out"]
    # A damaged marker still marks an artifacts directory (NOTE [outputs outside the artifacts]).
    assert "a file of the artifacts directory" in inside_artifacts(copy / "manifest.json")
    assert "a folder of the artifacts directory" in inside_artifacts(copy / "logs" / "x")


def test_force_refuses_a_symlink_or_the_directory_holding_the_current_one(copy, tmp_path, monkeypatch, capsys):
    (tmp_path / "elsewhere").write_text("precious")
    (copy / "report.html").unlink()
    (copy / "report.html").symlink_to(tmp_path / "elsewhere")
    assert main(["partition", *MLP, "--out", str(copy), "--force"]) == 2
    assert "holds 'report.html', a symbolic link" in _error(capsys)
    (copy / "report.html").unlink()
    monkeypatch.chdir(copy / "ir")
    assert main(["partition", *MLP, "--out", str(copy), "--force"]) == 2
    assert "holds the current directory" in _error(capsys)
    assert (tmp_path / "elsewhere").read_text() == "precious" and (copy / "plan.json").exists()


def test_force_replaces_a_hetpart_directory_with_what_run_and_shard_weights_added(copy, tmp_path):
    (copy / "logs" / RUN_DIR / "attempt_0" / "0").mkdir(parents=True)
    (copy / "logs" / RUN_DIR / "attempt_0" / "0" / "stdout.log").write_text("log")
    write_logs_marker(copy / "logs")  # as `run` does once its torchruns end
    (copy / "measured.json").write_text(json.dumps(MEASURED))
    (copy / "plan.json").write_text("old")
    assert main(["partition", *MLP, "--out", str(copy), "--force"]) == 0
    assert (copy / "plan.json").read_text() != "old" and not (copy / "logs").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging, old or lock files


def test_dump_ir_inside_out_is_refused(copy, capsys):
    before = _tree(copy)
    assert main(["partition", *MLP, "--out", str(copy), "--force", "--dump-ir", str(copy / "dumps")]) == 2
    assert "is inside --out" in _error(capsys)
    assert _tree(copy) == before


# --- 2. publishing against concurrent runs --------------------------------------------------

def test_a_second_partition_to_the_same_out_fails_while_the_first_holds_the_lock(tmp_path, capsys):
    out = tmp_path / "out"
    fd = os.open(tmp_path / ".out.lock", os.O_RDWR | os.O_CREAT, 0o600)  # as a running partition holds it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert main(["partition", *MLP, "--out", str(out)]) == 2
        assert f"another `hetpart partition` is writing '{out}' now" in _error(capsys)
        assert [p.name for p in tmp_path.iterdir()] == [".out.lock"]
    finally:
        os.close(fd)
    assert main(["partition", *MLP, "--out", str(out)]) == 0  # a lock nobody holds is taken over
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("theirs", [{}, {"NOTES.md": "mine"}], ids=["empty", "with-a-file"])
def test_a_directory_created_at_out_during_the_run_survives(tmp_path, monkeypatch, capsys, theirs):
    import hetpart.compile

    out = tmp_path / "out"
    real = hetpart.compile.write_report

    def someone_else_creates_out(*args, **kwargs):
        out.mkdir()
        for name, text in theirs.items():
            (out / name).write_text(text)
        return real(*args, **kwargs)

    monkeypatch.setattr(hetpart.compile, "write_report", someone_else_creates_out)
    assert main(["partition", *MLP, "--out", str(out)]) == 2
    assert f"'{out}' was created by another program while this partition ran" in _error(capsys)
    assert {p.name: p.read_text() for p in out.iterdir()} == theirs
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # our staging directory and lock are gone


# --- 3. never write through a link planted in an artifacts directory ------------------------

@pytest.fixture(scope="module")
def meta_plan(tmp_path_factory) -> tuple[Path, Path, Path]:
    """A two-rank plan traced without weights, a checkpoint for it, and one with other values."""
    root = tmp_path_factory.mktemp("meta")
    out = root / "out"
    assert main(["partition", *MLP_2RANK, "--meta", "--out", str(out)]) == 0
    assert load_manifest(out)["world_size"] == 2
    module, _ = load_model(ModelSpec.from_json(json.loads((out / "plan.json").read_text())["model"]))
    state = {k: v.contiguous() for k, v in module.state_dict().items()}
    save_file(state, str(root / "ckpt.safetensors"))
    save_file({k: v + 1 for k, v in state.items()}, str(root / "other.safetensors"))
    return out, root / "ckpt.safetensors", root / "other.safetensors"


@pytest.fixture
def meta_copy(meta_plan, tmp_path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(meta_plan[0], out)
    return out


def test_shard_weights_never_writes_through_planted_links(meta_plan, meta_copy, tmp_path):
    victims = {name: tmp_path / f"victim-{name}" for name in ("tmp", "weights", "manifest")}
    for victim in victims.values():
        victim.write_text("precious")
    (meta_copy / "rank0" / ".weights.safetensors.tmp").symlink_to(victims["tmp"])  # the old fixed temp name
    (meta_copy / "rank1" / "weights.safetensors").symlink_to(victims["weights"])
    (meta_copy / ".manifest.json.tmp").symlink_to(victims["manifest"])
    # Links in a rank directory are files the manifest does not list: refused, as `run` refuses them.
    assert main(["shard-weights", str(meta_copy), str(meta_plan[1])]) == 2
    assert all(v.read_text() == "precious" for v in victims.values())
    (meta_copy / "rank0" / ".weights.safetensors.tmp").unlink()
    (meta_copy / "rank1" / "weights.safetensors").unlink()
    # A link beside the manifest is not read: the write goes to a fresh temp, never through it.
    assert main(["shard-weights", str(meta_copy), str(meta_plan[1])]) == 0
    assert all(v.read_text() == "precious" for v in victims.values())
    for entry in load_manifest(meta_copy)["ranks"]:
        check_rank_files(meta_copy, entry)  # what `run` checks


def test_shard_weights_refuses_a_rank_dir_run_refuses(meta_plan, meta_copy, tmp_path, capsys):
    manifest = json.loads((meta_copy / "manifest.json").read_text())
    outside = tmp_path / "outside"
    shutil.copytree(meta_copy / "rank1", outside)
    manifest["ranks"][1]["dir"] = str(outside)
    (meta_copy / "manifest.json").write_text(json.dumps(manifest))
    before = _tree(tmp_path)
    assert main(["shard-weights", str(meta_copy), str(meta_plan[1])]) == 2
    assert f"ranks[1].dir '{outside}' must be a directory inside" in _error(capsys)
    assert main(["run", str(meta_copy)]) == 2  # the same check
    assert f"ranks[1].dir '{outside}' must be a directory inside" in _error(capsys)
    assert _tree(tmp_path) == before


def _fake_torchruns(monkeypatch) -> None:
    """`run` without torchrun: what the ranks leave in --io and in logs/, a fixed measured.json."""
    from hetpart.runtime import launch

    def fake_torchruns(cmds, manifest, log_dir, opts):
        io_dir = Path(cmds[0][cmds[0].index("--io") + 1])
        plan_out = manifest["ranks"][-1]["outputs"]
        save_file({o["name"]: torch.zeros(2) for o in plan_out}, str(io_dir / "outputs.safetensors"))
        (io_dir / "step_seconds").write_text("0.01\n")
        (log_dir / RUN_DIR / "attempt_0" / "0").mkdir(parents=True)
        (log_dir / RUN_DIR / "attempt_0" / "0" / "stdout.log").write_text("log")

    monkeypatch.setattr(launch, "_run_torchruns", fake_torchruns)
    monkeypatch.setattr(launch, "measurement", lambda *args: MEASURED)


def test_run_replaces_symlinked_logs_and_measured_json_and_never_writes_through_them(written, copy, tmp_path,
                                                                                     monkeypatch):
    (tmp_path / "victim").mkdir()
    (tmp_path / "victim" / "keep").write_text("precious")
    (copy / "logs").symlink_to(tmp_path / "victim")
    _fake_torchruns(monkeypatch)
    (tmp_path / "victim.json").write_text("precious")
    (copy / "measured.json").symlink_to(tmp_path / "victim.json")
    assert main(["run", str(copy), "--measure"]) == 0
    assert (tmp_path / "victim.json").read_text() == "precious"
    assert not (copy / "measured.json").is_symlink() and json.loads((copy / "measured.json").read_text())["stages"] == []
    assert [p.name for p in (tmp_path / "victim").iterdir()] == ["keep"] and not (copy / "logs").is_symlink()


# --- 4. shard-weights is all or nothing -------------------------------------------------------

def test_a_failed_reshard_keeps_every_old_file(meta_plan, meta_copy, tmp_path, capsys):
    out, ckpt, other = meta_copy, meta_plan[1], meta_plan[2]
    assert main(["shard-weights", str(out), str(ckpt)]) == 0
    before = _tree(out)
    # The other values as two shards, rank 1's alone in the second, which is cut short after its header:
    # every check passes, and the failure comes while rank 1 is written, after rank 0.
    manifest = load_manifest(out)
    rank0_keys = {k for e in json.loads((out / "rank0" / "weights.json").read_text())["tensors"]
                  for k in e["checkpoint_keys"]}
    full = load_file(str(other))
    shards = tmp_path / "shards"
    shards.mkdir()
    parts = {"a.safetensors": {k: v for k, v in full.items() if k in rank0_keys},
             "b.safetensors": {k: v for k, v in full.items() if k not in rank0_keys}}
    assert parts["b.safetensors"], "rank 1 needs tensors rank 0 does not"
    for name, part in parts.items():
        save_file(part, str(shards / name))
    (shards / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: name for name, part in parts.items() for k in part}}))
    with (shards / "b.safetensors").open("r+b") as f:
        f.truncate(os.path.getsize(shards / "b.safetensors") - 16)
    assert main(["shard-weights", str(out), str(shards)]) == 2
    err = _error(capsys)
    assert "rank 1: checkpoint file" in err and "is cut short" in err and "nothing was changed" in err
    assert _tree(out) == before  # no temp left, rank 0's file and the manifest as they were
    for entry in manifest["ranks"]:
        check_rank_files(out, entry)  # `run` finds no rank corrupted


def test_shard_weights_checks_every_rank_before_writing(meta_plan, meta_copy, capsys):
    (meta_copy / "rank1" / "constants.safetensors").unlink()
    before = _tree(meta_copy)
    assert main(["shard-weights", str(meta_copy), str(meta_plan[1])]) == 2
    assert f"rank 1: '{meta_copy / 'rank1' / 'constants.safetensors'}' is missing" in _error(capsys)
    assert _tree(meta_copy) == before and not (meta_copy / "rank0" / "weights.safetensors").exists()


def _fail_rename(monkeypatch, n: int, then=None) -> None:
    """The n-th os.replace from now raises EIO (as a rename error partway through a commit); with
    `then`, it renames and calls `then` instead."""
    real, count = os.replace, [0]

    def replace(src, dst):
        count[0] += 1
        if count[0] == n and then is None:
            raise OSError(5, "Input/output error")
        real(src, dst)
        if count[0] == n:
            then()

    monkeypatch.setattr("hetpart.fsio.os.replace", replace)


def _check_as_run_does(out: Path, key: Path | None = None) -> None:
    from hetpart.trust import read_key

    for entry in load_manifest(out, read_key(key) if key else None)["ranks"]:
        check_rank_files(out, entry)


@pytest.mark.parametrize("resharding", [False, True])
@pytest.mark.parametrize("n", [1, 2, 3])  # renames: rank 0's weights, rank 1's, the manifest
def test_shard_weights_repairs_an_interrupted_commit(meta_plan, meta_copy, monkeypatch, capsys, resharding, n):
    out, ckpt, other = meta_copy, meta_plan[1], meta_plan[2]
    if resharding:
        assert main(["shard-weights", str(out), str(ckpt)]) == 0
    with monkeypatch.context() as patch:
        _fail_rename(patch, n)
        assert main(["shard-weights", str(out), str(other)]) == 2
    assert "cannot write" in (err := _error(capsys))
    assert f"run `hetpart shard-weights {out} {other}` again to finish them" in err
    # Rank 0's new weights beside the old manifest (n=2) is what `run` must refuse, and what
    # shard-weights repairs: the weights it is about to replace are not checked (NOTE [shard-weights commit]).
    assert main(["shard-weights", str(out), str(other)]) == 0
    _check_as_run_does(out)
    want = load_file(str(other))
    got = load_file(str(out / "rank0" / "weights.safetensors"))
    assert got and all(torch.equal(t, want[k]) for k, t in got.items())


def test_shard_weights_still_checks_what_it_reads_besides_the_weights(meta_plan, meta_copy, capsys):
    out = meta_copy
    assert main(["shard-weights", str(out), str(meta_plan[1])]) == 0
    (out / "rank0" / "weights.safetensors").write_bytes(b"half")  # an output: replaced, not checked
    with (out / "rank1" / "weights.json").open("a") as f:
        f.write(" ")  # an input: checked
    assert main(["shard-weights", str(out), str(meta_plan[1])]) == 2
    assert "rank 1: " in (err := _error(capsys)) and "weights.json' does not match its sha256" in err


@pytest.fixture
def sign_key(tmp_path) -> Path:
    key = tmp_path / "key"
    key.write_text("ab" * 32 + "\n")
    return key


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])  # the two-line signature, 2 weights, the manifest, the signature
def test_a_signed_directory_verifies_through_an_interrupted_commit_and_is_repaired(
        meta_plan, meta_copy, sign_key, monkeypatch, capsys, n):
    out, ckpt, other = meta_copy, meta_plan[1], meta_plan[2]
    assert main(["shard-weights", str(out), str(ckpt), "--sign-key", str(sign_key)]) == 0
    _check_as_run_does(out, sign_key)
    with monkeypatch.context() as patch:
        _fail_rename(patch, n)
        assert main(["shard-weights", str(out), str(other), "--sign-key", str(sign_key)]) == 2
    assert "--sign-key KEY` again to finish them" in _error(capsys)
    from hetpart.trust import read_key

    load_manifest(out, read_key(sign_key))  # whichever manifest is in place, its signature matches
    assert main(["shard-weights", str(out), str(other), "--sign-key", str(sign_key)]) == 0
    _check_as_run_does(out, sign_key)
    assert (out / "manifest.json.hmac").read_text().count("\n") == 1  # one line again


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 128 + signal.SIGTERM), (signal.SIGINT, 130)])
@pytest.mark.parametrize("signed", [False, True])
def test_a_signal_during_the_renames_lands_after_them(meta_plan, meta_copy, sign_key, monkeypatch, capsys, sigint,
                                                      sig, code, signed):
    out, ckpt, other = meta_copy, meta_plan[1], meta_plan[2]
    key = ["--sign-key", str(sign_key)] if signed else []
    sigint(signal.default_int_handler)  # as in a terminal, however the suite was started
    assert main(["shard-weights", str(out), str(ckpt), *key]) == 0
    _fail_rename(monkeypatch, 2, then=lambda: signal.raise_signal(sig))  # as /tmp/redteam/sw/partial.py
    assert main(["shard-weights", str(out), str(other), *key]) == code
    _check_as_run_does(out, sign_key if signed else None)  # every rename was made
    got = load_file(str(out / "rank1" / "weights.safetensors"))
    want = load_file(str(other))
    assert got and all(torch.equal(t, want[k]) for k, t in got.items())


def test_a_sigint_the_shell_ignores_stays_ignored_through_the_renames(meta_plan, meta_copy, monkeypatch, sigint):
    out, ckpt, other = meta_copy, meta_plan[1], meta_plan[2]
    sigint(signal.SIG_IGN)  # as under `nohup` or `cmd &` in a script
    assert main(["shard-weights", str(out), str(ckpt)]) == 0
    _fail_rename(monkeypatch, 2, then=lambda: signal.raise_signal(signal.SIGINT))
    assert main(["shard-weights", str(out), str(other)]) == 0  # held, then handed to SIG_IGN: nothing stops
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # and the disposition is the caller's again
    _check_as_run_does(out)


# shard-weights whose renames each touch `marker` and then pause, so that a signal from outside lands among them.
SLOW_RENAMES = """
import os, sys, time
from pathlib import Path
import hetpart.fsio
real = os.replace
def replace(src, dst):
    real(src, dst)
    Path(sys.argv[1]).touch()
    time.sleep(0.5)
hetpart.fsio.os.replace = replace
from hetpart.cli import main
sys.exit(main(sys.argv[2:]))
"""


def test_a_sigterm_from_another_process_lands_after_the_renames(meta_plan, meta_copy, tmp_path):
    out, other, marker = meta_copy, meta_plan[2], tmp_path / "renamed"
    assert main(["shard-weights", str(out), str(meta_plan[1])]) == 0
    proc = _python("-c", SLOW_RENAMES, str(marker), "shard-weights", str(out), str(other))
    try:
        _wait_for(marker.exists)  # rank 0's weights renamed, the rest to come
        proc.send_signal(signal.SIGTERM)  # to the process: any of its threads (torch's too) may take it
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM and "hetpart: terminated" in err, err
    _check_as_run_does(out)


# --- 5. signals ---------------------------------------------------------------------------

def _python(*args: str, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, **kwargs)


def _wait_for(what, timeout_s: float = 120):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = what()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError("timed out waiting")


def test_sigterm_during_partition_leaves_nothing(tmp_path, capsys):
    # A model file whose build blocks: the signal comes while the staging directory exists.
    models = tmp_path / "models"
    models.mkdir()
    (models / "slow.py").write_text("import time\n\ndef build():\n    time.sleep(120)\n")
    work = tmp_path / "work"
    out = work / "new" / "dirs" / "out"
    proc = _python("-m", "hetpart", "partition", f"{models}/slow.py:build", "--cluster", "preset:cpu-2",
                   "--out", str(out))
    try:
        _wait_for(lambda: list(out.parent.glob(".out.tmp-*")) if out.parent.exists() else [])
        # Meanwhile a second partition to the same --out, in another process: it fails at once.
        assert main(["partition", *MLP, "--out", str(out)]) == 2
        assert f"another `hetpart partition` is writing '{out}' now" in _error(capsys)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM and "hetpart: terminated" in err, err
    assert not work.exists(), "no staging directory, no lock, no parent folder it created"


def test_a_staging_directory_a_killed_partition_left_is_removed_by_the_next_one(tmp_path, capsys):
    """A SIGKILL during `partition` left `.out.tmp-*` beside --out, and nothing removed it. The next `partition` to the
    same --out removes it, once it holds the lock; look-alikes someone made stay (NOTE [stale staging directories])."""
    models = tmp_path / "models"
    models.mkdir()
    (models / "slow.py").write_text("import time\n\ndef build():\n    time.sleep(120)\n")
    work = tmp_path / "work"
    out = work / "out"
    proc = _python("-m", "hetpart", "partition", f"{models}/slow.py:build", "--cluster", "preset:cpu-2",
                   "--out", str(out))
    try:
        (staging,) = _wait_for(lambda: list(work.glob(".out.tmp-*")) if work.exists() else [])
        (staging / "plan.json").write_text("{}")  # as the codegen would, part way
        assert main(["partition", *MLP, "--out", str(out)]) == 2  # while it lives: its lock, its staging dir
        assert f"another `hetpart partition` is writing '{out}' now" in _error(capsys)
        assert staging.is_dir()
        proc.kill()
        proc.wait(timeout=60)
    finally:
        proc.kill()
    assert staging.is_dir() and (work / ".out.lock").exists()
    owner = json.loads((staging / ".hetpart-staging").read_text())
    theirs = {".out.tmp-mine1234": None,  # a look-alike without hetpart's file
              ".out.tmp-othr5678": {**owner, "staging_for": "other"},  # another --out's
              ".out.tmp-live0000": {**owner, "pid": os.getpid()},  # a process that runs
              ".out.tmp-mine": {**owner}}  # not a name mkdtemp makes
    for name, record in theirs.items():
        (work / name).mkdir()
        (work / name / "notes.txt").write_text("precious")
        if record is not None:
            (work / name / ".hetpart-staging").write_text(json.dumps(record))
    (work / ".out.tmp-link5678").symlink_to(staging)  # a link to a stale one: neither it nor its target's files
    before = {name: _tree(work / name) for name in theirs}
    assert main(["partition", *MLP, "--out", str(out)]) == 0
    assert not staging.exists() and (work / ".out.tmp-link5678").is_symlink()
    assert {name: _tree(work / name) for name in theirs} == before
    assert sorted(p.name for p in work.iterdir()) == sorted(["out", ".out.tmp-link5678", *theirs])
    assert not (out / ".hetpart-staging").exists()  # removed before the artifacts marker: it lists no such file


def test_sigterm_to_run_stops_torchrun_and_every_rank(tmp_path):
    """... and names the last complete checkpoint and the command that trains the steps left (ux21)."""
    from hetpart.runtime.checkpoint import complete_checkpoints

    out, ck = tmp_path / "out", tmp_path / "ck"
    assert main(["partition", *MLP_2RANK, "--out", str(out)]) == 0
    proc = _python("-m", "hetpart", "run", str(out), "--mode", "training", "--steps", "1000000", "--checkpoint-every",
                   "1", "--checkpoint-dir", str(ck))
    try:
        _wait_for(lambda: len(ranks_started_by(proc.pid)) >= 2)  # both ranks started
        _wait_for(lambda: ck.is_dir() and complete_checkpoints(ck))  # a checkpoint to resume from
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        _, err = proc.communicate(timeout=60)
        left = started_by(proc.pid)
        while left and time.monotonic() < signalled + 10:  # the bound
            time.sleep(0.2)
            left = started_by(proc.pid)
    finally:
        proc.kill()
        for pid in started_by(proc.pid):  # what an old hetpart would leave running
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert left == [], "torchrun and its ranks end with hetpart"
    assert "hetpart: terminated; the last complete checkpoint is " in err, err
    last = complete_checkpoints(ck)[-1]
    assert f"--resume {last} " in err and f"hetpart run {out} --mode training " in err, err


# --- 6. launch.sh quotes every value ------------------------------------------------------------

def test_launch_sh_stays_inert_with_a_hostile_machine_name(tmp_path):
    names = ["a\nrm -rf x", "b'; touch pwned; '", "$(touch pwned)"]
    man = {"world_size": 3, "backend": "gloo",
           "nodes": [{"node_rank": i, "machine": name, "ranks": [i]} for i, name in enumerate(names)]}
    script = tmp_path / "launch.sh"
    script.write_text(launch_script(man))
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text('#!/bin/sh\necho "$@" >> "$CALLS"\n')
    (bin_dir / "torchrun").chmod(0o755)
    (tmp_path / "x").write_text("keep")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(tmp_path / "calls")}
    for node in range(3):
        proc = subprocess.run(["bash", str(script), str(node), "--io", "io"], cwd=tmp_path, env=env,
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    assert [c.split("--node-rank ")[1].split()[0] for c in calls] == ["0", "1", "2"]
    assert all(c.endswith("-m hetpart.runtime.worker " + str(tmp_path) + " --io io") for c in calls), calls
    assert (tmp_path / "x").read_text() == "keep" and not (tmp_path / "pwned").exists()


# --- 5. profile --out, partition --out, --dump-ir: never through a link, never over a user's file ----

def test_profile_out_replaces_a_planted_link_and_never_writes_its_target(tmp_path, capsys):
    from hetpart.profiler.table import Profile

    (tmp_path / "victim").write_text("precious")
    (tmp_path / "link").symlink_to(tmp_path / "victim")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere" / "x" / "y")
    (tmp_path / f".link.tmp-{os.getpid()}").symlink_to(tmp_path / "victim")  # the old fixed temp name
    prof = Profile("cpu", 1, {"aten.relu.default": 5})
    for name in ("link", "dangling"):
        prof.save(tmp_path / name)
        assert not (tmp_path / name).is_symlink() and json.loads((tmp_path / name).read_text())["forward_ns"]
    assert (tmp_path / "victim").read_text() == "precious" and not (tmp_path / "nowhere").exists()
    (tmp_path / "adir").mkdir()
    for out, says in [(tmp_path / "adir", "is a directory"), (tmp_path / "no" / "dir" / "p.json", "does not exist")]:
        assert main(["profile", "zoo:mlp", "--out", str(out)]) == 2
        assert says in _error(capsys)
    assert not (tmp_path / "no").exists()


def test_partition_refuses_a_symlink_at_out_and_creates_no_folder_through_one(copy, tmp_path, capsys):
    (tmp_path / "victim").mkdir()
    links = {"a2link": copy, "dangling": tmp_path / "victim" / "deep" / "new", "dirlink": tmp_path / "victim",
             "deadparent": tmp_path / "victim" / "gone"}
    for name, target in links.items():
        (tmp_path / name).symlink_to(target)
    before = _tree(tmp_path)
    for out, says in [("a2link", "is a symbolic link"), ("dangling", "is a symbolic link"),
                      ("dirlink/deep/out", "/dirlink' is a symbolic link"),
                      ("deadparent/out", "/deadparent' is a symbolic link")]:
        for force in ([], ["--force"]):
            assert main(["partition", *MLP, "--out", str(tmp_path / out), *force]) == 2
            assert says in _error(capsys)
            assert _tree(tmp_path) == before
    assert main(["partition", *MLP, "--out", str(tmp_path / "dirlink" / "out")]) == 0  # only `out` is made there
    assert (tmp_path / "victim" / "out" / MARKER).is_file()


@pytest.mark.parametrize("when", ["after-moving-the-old-aside", "after-making-the-new-out"])
def test_a_signal_during_the_force_swap_puts_the_old_directory_back(copy, tmp_path, monkeypatch, capsys, when):
    import hetpart.codegen.publish as publish

    before = _tree(copy)
    real = os.rename
    staged = []

    def interrupted(src, dst):  # Ctrl-C (SIGTERM's exception is a BaseException too) in the swap's window
        if when == "after-making-the-new-out" and Path(dst) == copy and not staged:
            staged.append(src)
            assert copy.is_dir() and not any(copy.iterdir())  # the empty directory _publish_new made
            raise KeyboardInterrupt
        real(src, dst)
        if when == "after-moving-the-old-aside" and str(dst).endswith("/x"):
            raise KeyboardInterrupt

    monkeypatch.setattr(publish.os, "rename", interrupted)
    assert main(["partition", *MLP, "--out", str(copy), "--force"]) == 130
    monkeypatch.undo()
    assert _tree(copy) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no .out.old-*, staging or lock left


@pytest.mark.parametrize("theirs, named", [
    ({"logs/mynotes.txt": "precious"}, "logs/mynotes.txt"),
    ({f"logs/{RUN_DIR}/attempt_0/0/mine.txt": "precious"}, f"logs/{RUN_DIR}/attempt_0/0/mine.txt"),
    ({"measured.json": '{"my": "numbers"}'}, "measured.json"),
    ({"measured.json": "precious"}, "measured.json"),
])
def test_force_and_run_replace_only_the_logs_and_measured_json_run_wrote(copy, monkeypatch, capsys, theirs, named):
    _fake_torchruns(monkeypatch)
    assert main(["run", str(copy), "--measure"]) == 0  # logs/ with its marker, measured.json
    marker = json.loads((copy / "logs" / ".hetpart-logs").read_text())
    assert list(marker["files"]) == [f"{RUN_DIR}/attempt_0/0/stdout.log"]
    for name, text in theirs.items():
        (copy / name).write_text(text)
    before = _tree(copy)
    assert main(["partition", *MLP, "--out", str(copy), "--force"]) == 2
    assert f"holds '{named}', which hetpart did not write" in _error(capsys)
    assert main(["run", str(copy), "--measure"]) == 2
    assert named.removeprefix("logs/") in _error(capsys)
    assert _tree(copy) == before


def test_force_refuses_a_logs_folder_a_user_made(copy, capsys):
    (copy / "logs").mkdir()
    (copy / "logs" / "mynotes.txt").write_text("precious")
    assert main(["partition", *MLP, "--out", str(copy), "--force"]) == 2
    assert "holds 'logs/mynotes.txt', which hetpart did not write" in _error(capsys)
    assert (copy / "logs" / "mynotes.txt").read_text() == "precious"
    (copy / "logs" / "mynotes.txt").unlink()
    assert main(["partition", *MLP, "--out", str(copy), "--force"]) == 0  # an empty one holds nothing of theirs



@pytest.mark.parametrize("where", ["step-000002", "ck/step-000002", "ck/.step-000004.t.partial"])
def test_force_names_a_runs_checkpoint_in_the_directory_as_one_and_keeps_it(copy, capsys, where):
    """review23: `run --checkpoint-dir` may write at the top of the artifacts directory, and `partition --force` of it
    then refused, rightly, but said "holds 'step-000001', which hetpart did not write": it names the checkpoint as
    `hetpart run`'s now, and says to move it out (NOTE [what --force replaces])."""
    from hetpart.runtime.checkpoint import finish_checkpoint, save_rank

    ck = copy / where.rpartition("/")[0]
    ck.mkdir(exist_ok=True)
    entry = {"planned_device": "local/0", "machine": "local"}
    save_rank(ck, 2, "t", 0, entry, {"weight/w": torch.ones(2)}, {"type": None, "param_groups": [], "state": {}})
    if where.endswith(".partial"):  # a run killed before its checkpoint was complete
        (ck / ".step-000002.t.partial").rename(ck / ".step-000004.t.partial")
    else:
        finish_checkpoint(ck, 2, "t", 1, {"batch_size": 2}, {"model": "zoo:mlp"}, keep=None)
    top = where.split("/")[0]
    before = _tree(copy)
    assert main(["partition", *MLP, "--out", str(copy), "--force"]) == 2
    err = _error(capsys)
    assert f"holds '{top}', a run's checkpoint(s) that `hetpart run --checkpoint-dir` wrote (--force never removes " \
        f"one); nothing was changed: move '{top}' out of '{copy}' (`run --resume` reads it from any place)" in err, err
    assert "which hetpart did not write" not in err
    assert _tree(copy) == before
    shutil.rmtree(copy / top)
    (copy / "step-000009").mkdir()  # a folder of the user's by that name, no checkpoint in it: as before
    assert main(["partition", *MLP, "--out", str(copy), "--force"]) == 2
    assert "holds 'step-000009', which hetpart did not write" in _error(capsys)


def test_force_does_not_hang_on_a_fifo_named_like_a_checkpoints_manifest(copy, capsys):
    """rev25: `is_run_checkpoint` read a step-<N> folder's checkpoint.json whatever it was: a FIFO there (a user's
    folder, or a checkpoint tampered with) blocked `partition --force` in the read, for good. Only a regular file is
    read now, and the folder is the user's as before."""
    import os
    import threading

    (copy / "step-000001").mkdir()
    fifo = copy / "step-000001" / "checkpoint.json"
    os.mkfifo(fifo)
    codes: list[int] = []
    worker = threading.Thread(target=lambda: codes.append(main(["partition", *MLP, "--out", str(copy), "--force"])),
                              daemon=True)
    worker.start()
    worker.join(60)
    blocked = worker.is_alive()
    if blocked:  # the old code: open the FIFO's other end, so the blocked read ends and the test process can
        open(fifo, "w").close()
        worker.join(10)
    assert not blocked, "partition --force blocked reading a FIFO named checkpoint.json"
    assert codes == [2]
    assert "holds 'step-000001', which hetpart did not write" in _error(capsys)


@pytest.mark.parametrize("theirs", ["mynotes.txt", f"{RUN_DIR}/attempt_0/0/mine.txt", "mine/torchrun0.log",
                                    "mine/attempt_0/0/stdout.log"])
def test_a_file_written_into_logs_during_a_run_is_never_listed_nor_removed(copy, monkeypatch, capsys, theirs):
    """The logs marker listed every file in logs/ when the torchruns ended, so a file another program wrote there
    meanwhile was removed by the next `run` or `partition --force` (NOTE [what --force replaces])."""
    from hetpart.runtime import launch

    _fake_torchruns(monkeypatch)
    fake = launch._run_torchruns

    def torchruns_while_someone_writes(cmds, manifest, log_dir, opts):
        fake(cmds, manifest, log_dir, opts)
        (log_dir / theirs).parent.mkdir(parents=True, exist_ok=True)
        (log_dir / theirs).write_text("precious")

    monkeypatch.setattr(launch, "_run_torchruns", torchruns_while_someone_writes)
    assert main(["run", str(copy)]) == 0
    marker = json.loads((copy / "logs" / ".hetpart-logs").read_text())
    assert list(marker["files"]) == [f"{RUN_DIR}/attempt_0/0/stdout.log"]
    before = _tree(copy)
    assert main(["run", str(copy)]) == 2
    assert f"holds '{theirs}', which hetpart did not write" in _error(capsys)
    assert main(["partition", *MLP, "--out", str(copy), "--force"]) == 2
    assert f"holds 'logs/{theirs}', which hetpart did not write" in _error(capsys)
    assert _tree(copy) == before and (copy / "logs" / theirs).read_text() == "precious"


@pytest.mark.parametrize("change", ["edit", "old marker"])
def test_a_listed_log_someone_changed_since_is_never_removed(copy, monkeypatch, capsys, change):
    """A file the marker lists goes only while its sha256 is the listed one; a marker without digests (an earlier
    hetpart's, which listed whatever was in logs/) lists nothing."""
    _fake_torchruns(monkeypatch)
    assert main(["run", str(copy)]) == 0
    log = copy / "logs" / RUN_DIR / "attempt_0" / "0" / "stdout.log"
    if change == "edit":
        log.write_text("log\nmy own notes on this run\n")
    else:
        (copy / "logs" / ".hetpart-logs").write_text(json.dumps({"marker_version": 1, "files": [
            f"{RUN_DIR}/attempt_0/0/stdout.log"]}))
    before = _tree(copy)
    assert main(["run", str(copy)]) == 2
    assert f"holds '{RUN_DIR}/attempt_0/0/stdout.log', which hetpart did not write" in _error(capsys)
    assert main(["partition", *MLP, "--out", str(copy), "--force"]) == 2
    assert _tree(copy) == before


class _Launched(Exception):
    """The checks before torchrun passed."""


def _no_launch(monkeypatch) -> None:
    from hetpart.runtime import launch

    def launched(*args, **kwargs):
        raise _Launched

    monkeypatch.setattr(launch, "_run_torchruns", launched)


@pytest.mark.parametrize("flag, where", [("--checkpoint-dir", "logs"), ("--checkpoint-dir", "logs/deeper"),
                                         ("--checkpoint-dir", "rank0/ck"), ("--checkpoint-dir", "ir"),
                                         ("--resume", "logs/step-000002")])
def test_checkpoints_inside_the_folders_run_owns_are_refused(copy, tmp_path, monkeypatch, capsys, flag, where):
    """NOTE [outputs outside the artifacts] in fsio.py: in logs/ the logs marker listed the checkpoints and the next
    `run` (or `partition --force`) removed them, the one it resumed from included; in a rank folder `run` refuses
    the directory. Refused before anything is made; a folder beside the artifacts, or at their top, is fine."""
    _no_launch(monkeypatch)
    if flag == "--resume":  # a checkpoint that an earlier run (before this check) left in logs/
        (copy / "logs" / "step-000002").mkdir(parents=True)
        (copy / "logs" / "step-000002" / "checkpoint.json").write_text("{}")
        write_logs_marker(copy / "logs")
    extra = [] if flag == "--resume" else ["--checkpoint-every", "1"]
    before = _tree(tmp_path)
    assert main(["run", str(copy), "--mode", "training", flag, str(copy / where), *extra]) == 2
    top = where.split("/")[0]
    inside = "inside " if "/" in where else ""
    assert f"{flag} {copy / where} is {inside}'{copy.resolve() / top}', a folder of the artifacts" in _error(capsys)
    assert _tree(tmp_path) == before  # no folder made, the checkpoint in logs/ kept
    if flag == "--resume":  # a file in logs/ no logs marker lists (nor ever did, now): `run` keeps it, refusing
        assert main(["run", str(copy)]) == 2
        assert "holds 'step-000002/checkpoint.json', which hetpart did not write" in _error(capsys)
        shutil.rmtree(copy / "logs")
    for ck in (tmp_path / "ck", copy / "ck"):
        with pytest.raises(_Launched):
            main(["run", str(copy), "--mode", "training", "--checkpoint-dir", str(ck), "--checkpoint-every", "1"])


def test_outputs_never_land_on_or_inside_an_artifacts_directory(copy, tmp_path, capsys):
    """`export --out art/manifest.json` wrote a config over the manifest; `profile --out art/plan.json`,
    `partition --out art/rank0/x` and `--dump-ir art/ir/d` broke the directory too. Each is refused, nothing
    written (NOTE [outputs outside the artifacts] in fsio.py)."""
    prof = ["profile", "zoo:mlp", "--set", "hidden=32", "--set", "n_blocks=2", "--repeats", "1", "--warmup", "0"]
    cases = [(["export", str(copy), "--format", "deepspeed", "--force", "--out", str(copy / "manifest.json")],
              f"--out {copy / 'manifest.json'} is a file of the artifacts directory"),
             (["export", str(copy), "--format", "deepspeed", "--out", str(copy / "rank0" / "ds.json")],
              "a folder of the artifacts directory"),
             ([*prof, "--out", str(copy / "plan.json")], "is a file of the artifacts directory"),
             (["partition", *MLP, "--out", str(copy / "rank0" / "x")], "`run` refuses any file there"),
             (["partition", *MLP, "--out", str(tmp_path / "new"), "--dump-ir", str(copy / "ir" / "d")],
              f"--dump-ir {copy / 'ir' / 'd'} is inside '{copy.resolve() / 'ir'}'")]
    for argv, expect in cases:
        before = _tree(tmp_path)
        assert main(argv) == 2, argv
        assert expect in _error(capsys)
        assert _tree(tmp_path) == before, argv


def test_export_and_profile_replace_no_file_of_the_users(copy, tmp_path, capsys):
    """An existing --out is replaced by `export` only with --force (torchtitan's companion CSV too), by `profile`
    only if it is a profile hetpart wrote."""
    (tmp_path / "titan.schedule.csv").write_text("mine")
    argv = ["export", str(copy), "--format", "torchtitan", "--out", str(tmp_path / "titan.toml")]
    assert main(argv) == 2
    assert f"'{tmp_path / 'titan.schedule.csv'}' already exists; pass --force" in _error(capsys)
    assert not (tmp_path / "titan.toml").exists() and (tmp_path / "titan.schedule.csv").read_text() == "mine"
    assert main([*argv, "--force"]) == 0
    assert (tmp_path / "titan.schedule.csv").read_text() != "mine"
    capsys.readouterr()
    (tmp_path / "prof.json").write_text("precious")
    prof = ["profile", "zoo:mlp", "--set", "hidden=32", "--set", "n_blocks=2", "--repeats", "1", "--warmup", "0",
            "--out", str(tmp_path / "prof.json")]
    assert main(prof) == 2
    assert "is not a profile `hetpart profile` wrote" in _error(capsys)
    assert (tmp_path / "prof.json").read_text() == "precious"
    (tmp_path / "prof.json").unlink()
    assert main(prof) == 0 and main(prof) == 0  # its own profile is replaced
