"""hetpart/fsio.py (NOTE [safe writes]): temps and renames, never through a link, all or nothing."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from hetpart.errors import HetpartError
from hetpart.fsio import AtomicWrites, atomic_write, exclusive_file, exclusive_lock, fresh_dir


def test_a_link_at_the_target_is_replaced_and_its_target_kept(tmp_path):
    (tmp_path / "victim").write_text("precious")
    (tmp_path / "measured.json").symlink_to(tmp_path / "victim")
    atomic_write(tmp_path / "measured.json", "{}")
    assert (tmp_path / "victim").read_text() == "precious"
    assert not (tmp_path / "measured.json").is_symlink() and (tmp_path / "measured.json").read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["measured.json", "victim"]  # no temp left


def test_new_files_get_the_mode_of_the_umask(tmp_path):
    umask = os.umask(0o022)
    try:
        atomic_write(tmp_path / "plain", "x")
    finally:
        os.umask(umask)
    assert (tmp_path / "plain").stat().st_mode & 0o777 == 0o644  # not mkstemp's 0600


@pytest.mark.parametrize("failure", [HetpartError("bad tensor"), KeyboardInterrupt()])
def test_nothing_is_renamed_unless_every_file_is_complete(tmp_path, failure):
    (tmp_path / "a").write_text("old a")
    with pytest.raises(type(failure)):
        with AtomicWrites() as w:
            w.write(tmp_path / "a", "new a")
            with w.open(tmp_path / "b") as f:
                f.write(b"half of b")
                raise failure
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"] and (tmp_path / "a").read_text() == "old a"


def test_a_directory_in_the_targets_place_is_an_error_and_leaves_no_temp(tmp_path):
    (tmp_path / "manifest.json").mkdir()
    with pytest.raises(HetpartError, match="a directory is in its place"):
        atomic_write(tmp_path / "manifest.json", "{}")
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]


def test_exclusive_file_and_fresh_dir_refuse_links(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "torchrun0.log").symlink_to(tmp_path / "elsewhere" / "log")
    with pytest.raises(HetpartError, match="something is already there"):
        exclusive_file(tmp_path / "torchrun0.log")
    assert not (tmp_path / "elsewhere" / "log").exists()
    (tmp_path / "logs").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(HetpartError, match="is a symbolic link"):
        fresh_dir(tmp_path / "logs", "the run's logs")
    (tmp_path / "logs").unlink()
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "old.log").write_text("old")
    assert list(fresh_dir(tmp_path / "logs", "the run's logs").iterdir()) == []


def test_a_held_lock_is_busy_and_a_left_one_is_taken_over(tmp_path):
    lock = tmp_path / ".out.lock"
    with exclusive_lock(lock, "busy"):
        with pytest.raises(HetpartError, match="busy"):
            with exclusive_lock(lock, "busy"):
                pass
    assert not lock.exists()  # removed by its holder
    lock.write_text("")  # left by a killed run: nobody holds it
    with exclusive_lock(lock, "busy"):
        fd = os.open(lock, os.O_RDWR)
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(fd)
    lock.write_text("mine")  # a user's file of that name: never taken over, so never removed
    with pytest.raises(HetpartError, match="is not an \\(empty\\) lock file hetpart left"):
        with exclusive_lock(lock, "busy"):
            pass
    assert lock.read_text() == "mine"
    lock.unlink()
    os.mkfifo(lock)
    with pytest.raises(HetpartError, match="is not an \\(empty\\) lock file hetpart left"):
        with exclusive_lock(lock, "busy"):
            pass
    assert lock.exists()
    lock.unlink()
    (tmp_path / "elsewhere").write_text("")
    lock.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(HetpartError, match="is a symbolic link"):
        with exclusive_lock(lock, "busy"):
            pass


def test_dump_ir_dir_never_writes_through_a_planted_link(tmp_path):
    import torch
    import torch.fx as fx

    from hetpart.passes import PassContext, PassManager

    dumps = tmp_path / "dumps"
    gm = fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()))
    PassManager([], extra_dump_dir=dumps).run(gm, PassContext())  # a folder of hetpart's dumps
    (tmp_path / "victim").write_text("precious")
    (dumps / "graph.json").unlink()
    (dumps / "graph.json").symlink_to(tmp_path / "victim")
    PassManager([], extra_dump_dir=dumps).run(gm, PassContext())
    assert (tmp_path / "victim").read_text() == "precious"
    assert not (dumps / "graph.json").is_symlink() and (dumps / "00-export.txt").is_file()


@pytest.mark.parametrize("theirs", ["graph.json", "00-export.txt", "partition.dot", "notes.txt"])
def test_dump_ir_writes_only_into_a_new_empty_or_hetpart_dumps_folder(tmp_path, capsys, theirs):
    from hetpart.cli import main

    mlp = ["zoo:mlp", "--set", "hidden=32", "--set", "n_blocks=2", "--cluster", "preset:cpu-2", "--no-pt2",
           "--time-limit", "5"]
    dumps = tmp_path / "dumps"
    assert main(["partition", *mlp, "--out", str(tmp_path / "a"), "--dump-ir", str(dumps)]) == 0  # new
    assert (dumps / "graph.json").is_file() and (dumps / ".hetpart-dumps").is_file()
    assert main(["partition", *mlp, "--out", str(tmp_path / "b"), "--dump-ir", str(dumps)]) == 0  # its own
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / theirs).write_text("precious")
    capsys.readouterr()
    assert main(["partition", *mlp, "--out", str(tmp_path / "c"), "--dump-ir", str(mine)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hetpart: error: --dump-ir") and f"holds '{theirs}', which hetpart's dumps" in err, err
    (dumps / "notes.txt").write_text("precious")  # a user's file in hetpart's dumps folder
    assert main(["partition", *mlp, "--out", str(tmp_path / "c"), "--dump-ir", str(dumps)]) == 2
    assert "holds 'notes.txt', which hetpart's dumps did not write" in capsys.readouterr().err
    assert (mine / theirs).read_text() == "precious" and not (tmp_path / "c").exists()
    assert [p.name for p in mine.iterdir()] == [theirs]


def test_a_device_fifo_or_name_in_dev_is_refused_not_replaced(tmp_path):
    """review22: `export --out /dev/null --force`, run as root, renamed a regular file over the device node (and
    `--out /dev/stdout` over the link to the process's stdout). A FIFO stands in for a device here (no root needed)."""
    import stat

    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "link").symlink_to(tmp_path / "fifo")
    for target, what in (("fifo", "is a FIFO"), ("link", "is a link to a FIFO")):
        with pytest.raises(HetpartError, match=what):
            atomic_write(tmp_path / target, "{}")
    assert stat.S_ISFIFO((tmp_path / "fifo").lstat().st_mode) and (tmp_path / "link").is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "link"]  # no temp left
    from hetpart.fsio import special_place

    assert special_place(Path("/dev/stdout")) is not None and special_place(Path("/dev/null")) is not None
    assert special_place(tmp_path / "new.json") is None
