"""Writing files where someone else may have put something first: never through a link, never half.

NOTE [safe writes]
An artifacts directory is read and written again after `partition` made it
(`shard-weights` fills weights and the manifest, `run` writes logs/ and
measured.json), and `--dump-ir DIR` is any folder. Whatever is already there
may be a symlink planted to make hetpart overwrite a file elsewhere. So every
such write goes through `AtomicWrites` (or `atomic_write`, one file):

- the bytes go to a fresh temp file in the target's folder, made by
  `tempfile.mkstemp` (O_CREAT | O_EXCL | O_NOFOLLOW, a random name: it is
  never a file or link that was there before);
- on success the temp is renamed onto the target (`os.replace`). rename(2)
  replaces whatever the target name is, a symlink included, and never writes
  to a link's target; a reader sees the old file or the new one, never part;
- on any failure, an interrupt included, every temp is removed and every old
  file is kept. Several files written in one `AtomicWrites` are renamed only
  once all of them are complete (all-or-nothing up to the renames);
- a target that is not a file is refused before anything is written: a device,
  FIFO or socket there or at a link's end, or any name in /dev (`--out /dev/null
  --force` run as root renamed a regular file over the device node, and `--out
  /dev/stdout` over the link to the process's stdout; `special_place`).

A folder hetpart fills whole (logs/) is made fresh by `fresh_dir`, which
refuses a symlink or a file in its place; files in it are created with
`exclusive_file` (O_EXCL | O_NOFOLLOW). Inside a staging directory of
`partition` (`tempfile.mkdtemp`: new, mode 0700, nobody else can create names in
it) plain writes are safe, and the codegen writes there directly. `exclusive_lock`
keeps two writers of one path apart (`partition`'s publish: NOTE [what --force
replaces] in codegen/publish.py).

NOTE [outputs outside the artifacts]
An output the user names (`export --out`, `profile --out`, `--dump-ir`, `partition --out`,
`run --checkpoint-dir`) must not land on a file of an artifacts directory (`export --out
art/manifest.json` wrote a DeepSpeed config over the manifest) nor inside one of its folders
that hetpart owns: `logs/` (every `run` replaces it; its marker once listed whatever was in it
when the torchruns ended, checkpoints included, for the next `run` or `--force` to remove, and
a file there that it does not list now makes them refuse: NOTE [what --force replaces]) and
the folders of its listed files (`rank<k>/`, `ir/`: `run` refuses any file there manifest.json
does not list, and advises removing it). `inside_artifacts` finds such a path through the
`.hetpart` marker of every folder above it (links resolved); the top of an artifacts directory
(`art/titan.toml`, `art/ck/`) is fine: nothing reads or removes a new name there.

NOTE [an output is no input]
An output must not replace what the same command reads: `replan OLD --out OLD --force` replaced the old
plan by the new one (OLD was hetpart's, so --force's rules let it go), losing the plan to go back to, the
`logs/` of the run that died and `measured.json`, while the new plan's `replan.from` named itself; without
--force it advised passing --force. `export DIR --key K --out K --force` wrote the config over the signing
key. `replaces_input` refuses, whatever --force says and before anything runs, an output at an input's
place or a directory holding one (the input's links resolved; a link at the output itself counts as its own
place where the write replaces the link, `follow=False`, as NOTE [safe writes] does).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, TextIO

from hetpart.errors import HetpartError


ARTIFACTS_MARKER = ".hetpart"  # in every artifacts directory: the format version and every file partition wrote
ARTIFACTS_ROOT_FILES = {"manifest.json", "manifest.json.hmac", ARTIFACTS_MARKER}
ARTIFACTS_OWNED_DIRS = {"logs"}  # `run`'s: its whole contents are replaced by the next run

# The checkpoints of `run --checkpoint-dir` (NOTE [checkpoint layout] in runtime/checkpoint.py), named here, below the
# runtime that writes them and codegen's --force, which keeps them (NOTE [what --force replaces]).
CHECKPOINT_FORMAT = "hetpart-checkpoint"  # checkpoint.json's `format`
CHECKPOINT_MANIFEST = "checkpoint.json"
CHECKPOINT_STEP_DIR = re.compile(r"step-(\d{6,})")  # a complete checkpoint's folder
CHECKPOINT_PARTIAL_DIR = re.compile(r"\.step-\d{6,}\..+\.partial")  # one a run did not finish writing


def is_run_checkpoint(path: Path, depth: int = 1) -> bool:
    """Whether the folder `path` is a checkpoint `hetpart run` wrote: a step-<N> folder whose checkpoint.json is a
    hetpart checkpoint's, a .partial one, or (`depth` 1) a --checkpoint-dir holding one."""
    import json

    if path.is_symlink() or not path.is_dir():
        return False
    if CHECKPOINT_PARTIAL_DIR.fullmatch(path.name):
        return True
    if CHECKPOINT_STEP_DIR.fullmatch(path.name):
        try:  # a regular file only (rev25: a FIFO named checkpoint.json hung `partition --force` in its read)
            if not stat.S_ISREG(os.lstat(path / CHECKPOINT_MANIFEST).st_mode):
                return False
            manifest = json.loads((path / CHECKPOINT_MANIFEST).read_text())
        except (OSError, ValueError, RecursionError):
            return False
        return isinstance(manifest, dict) and manifest.get("format") == CHECKPOINT_FORMAT
    try:
        return depth > 0 and any(is_run_checkpoint(p, depth - 1) for p in path.iterdir())
    except OSError:
        return False


def read_artifacts_marker(top: Path) -> tuple[object, frozenset[str]] | None:
    """The `.hetpart` marker of the directory `top`: (its marker_version, the files it lists); None where `top`
    has none (or a link in its place). A ValueError saying why where the marker cannot be read as one."""
    import json

    marker = top / ARTIFACTS_MARKER
    if marker.is_symlink() or not marker.is_file():
        return None
    try:
        data = json.loads(marker.read_text())
        files = data["files"]
        version = data.get("marker_version")
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as err:
        raise ValueError(f"{type(err).__name__}: {err}"[:200]) from None
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        raise ValueError("its 'files' is not a list of paths")
    return version, frozenset(files)


def inside_artifacts(path: Path, follow: bool = True) -> str | None:
    """Why writing `path` would change or break an artifacts directory (NOTE [outputs outside the
    artifacts]): '<a file|inside a folder> of the artifacts directory DIR ...'; None if it would not.
    `follow=False`: a link at `path` itself is replaced, not followed (NOTE [safe writes]), so its own place counts."""
    path = Path(os.path.abspath(path))
    target = path.parent.resolve() / path.name if not follow and path.is_symlink() else path.resolve()
    for top in target.parents:
        try:
            marker = read_artifacts_marker(top)
        except ValueError:  # a damaged marker still marks an artifacts directory
            marker = (None, frozenset())
        if marker is None:
            continue
        listed = marker[1]
        rel = target.relative_to(top)
        if rel.as_posix() in listed | ARTIFACTS_ROOT_FILES:
            return f"a file of the artifacts directory '{top}'"
        folders = {Path(f).parts[0] for f in listed if len(Path(f).parts) > 1} | ARTIFACTS_OWNED_DIRS
        if rel.parts[0] in folders:
            why = ("every `run` of it replaces it" if rel.parts[0] in ARTIFACTS_OWNED_DIRS
                   else "`run` refuses any file there that manifest.json does not list"
                   if f"{rel.parts[0]}/stage.py" in listed else "it holds hetpart's files only")
            where = "" if len(rel.parts) == 1 else "inside "
            return f"{where}'{top / rel.parts[0]}', a folder of the artifacts directory '{top}' ({why})"
    return None


def check_outside_artifacts(path: Path, flag: str, follow: bool = True) -> None:
    """An error if `flag`'s `path` would change or break an artifacts directory (NOTE [outputs outside the
    artifacts])."""
    why = inside_artifacts(path, follow)
    if why is not None:
        raise HetpartError(f"{flag} {path} is {why}: choose a path outside it (beside the artifacts directory, "
                           "or at its top)")


def replaces_input(out: Path, inputs: dict[str, Path | None], follow: bool = True) -> str | None:
    """The name of the first of `inputs` (what the command reads, by the flag naming it) that writing `out` would
    replace: `out`'s own place, or inside it (NOTE [an output is no input]); None where none is."""
    out = Path(os.path.abspath(out))
    place = out.parent.resolve() / out.name if not follow and out.is_symlink() else out.resolve()
    for name, path in inputs.items():
        if path is not None and place in (real := Path(os.path.abspath(path)).resolve(), *real.parents):
            return name
    return None


def special_place(path: Path) -> str | None:
    """Why `path` is no file hetpart may replace (NOTE [safe writes]): 'a character device', 'a FIFO', ... where it,
    or what a link there points to, is one; 'a name in /dev' where its folder is /dev; None otherwise."""
    path = Path(path)
    kinds = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
             (stat.S_ISSOCK, "a socket"))
    for follow in (False, True):
        try:
            mode = os.stat(path, follow_symlinks=follow).st_mode
        except (OSError, ValueError):
            continue
        kind = next((name for test, name in kinds if test(mode)), None)
        if kind is not None:
            return kind if not follow or not path.is_symlink() else f"a link to {kind}"
    try:
        in_dev = Path(os.path.abspath(path)).parent.resolve() == Path("/dev")
    except (OSError, RuntimeError):
        in_dev = False
    return "a name in /dev (a device or a stream, such as /dev/stdout)" if in_dev else None


def check_not_special(path: Path, flag: str, instead: str) -> None:
    """An error if `flag`'s `path` is no file hetpart may replace (`special_place`); `instead`: what to do."""
    why = special_place(path)
    if why is not None:
        raise HetpartError(f"{flag} {path} is {why}, not a file: hetpart writes a file by replacing it whole, and "
                           f"would replace that itself; {instead}")


def _default_mode() -> int:
    """The mode a plain open() gives a new file under this process's umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


class AtomicWrites:
    """Files written to fresh temps and renamed onto their targets together at the end (NOTE [safe writes]).

        with AtomicWrites() as w:
            with w.open(out / "rank0" / "weights.safetensors") as f:
                f.write(data)
            w.write(out / "manifest.json", text)   # renamed last: in the order opened
    """

    def __init__(self) -> None:
        self._pending: list[tuple[Path, Path]] = []  # (temp, target), in the order opened

    def open(self, path: Path) -> BinaryIO:
        """A new binary file whose contents become `path` when the block ends without an error."""
        path = Path(path)
        check_not_special(path, "cannot write:", "name a regular file")
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        except OSError as err:
            raise HetpartError(f"cannot write '{path}': {err.strerror} in '{path.parent}'") from None
        self._pending.append((Path(tmp), path))
        os.fchmod(fd, _default_mode())  # mkstemp's 0600 would hide it from other users
        return os.fdopen(fd, "wb")

    def write(self, path: Path, data: str | bytes) -> None:
        with self.open(path) as f:
            f.write(data.encode() if isinstance(data, str) else data)

    def discard(self) -> None:
        """Remove every temp; the targets stay as they were."""
        for tmp, _ in self._pending:
            with contextlib.suppress(OSError):
                tmp.unlink()
        self._pending.clear()

    def commit(self) -> None:
        """Rename every temp onto its target, in the order they were opened."""
        for tmp, target in self._pending:
            if target.is_dir() and not target.is_symlink():
                raise HetpartError(f"cannot write '{target}': a directory is in its place; remove it")
            try:
                os.replace(tmp, target)
            except OSError as err:
                raise HetpartError(f"cannot write '{target}': {err.strerror}") from None
        self._pending.clear()

    def __enter__(self) -> AtomicWrites:
        return self

    def __exit__(self, kind, value, tb) -> None:
        try:
            if kind is None:
                self.commit()
        finally:
            self.discard()  # after a failure, or what a failed commit left


def atomic_write(path: Path, data: str | bytes) -> None:
    """Write `path` through a fresh temp file and a rename (NOTE [safe writes])."""
    with AtomicWrites() as w:
        w.write(path, data)


def exclusive_file(path: Path) -> TextIO:
    """A new text file at `path` for writing; an error if anything (a file, a link) is there already."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
    except FileExistsError:
        raise HetpartError(f"cannot create '{path}': something is already there; remove it") from None
    except OSError as err:
        raise HetpartError(f"cannot create '{path}': {err.strerror}") from None
    return os.fdopen(fd, "w")


def real_dir(path: Path, what: str, instead: str = "partition again") -> Path:
    """`path` if it is a directory and not a symlink; else an error naming `what` it is for, and what to do
    `instead` of removing it (for a folder of the artifacts: partition again; for a path the user chose: choose
    another)."""
    if path.is_symlink():
        raise HetpartError(f"'{path}' is a symbolic link; hetpart writes {what} there and never follows a link: "
                           "remove the link")
    if not path.is_dir():
        raise HetpartError(f"'{path}' is not a directory; hetpart writes {what} there: remove it or {instead}")
    return path


def unused_name(path: Path) -> Path:
    """`path`, or the first of `path`2, `path`3, ... that does not exist: a name for a command hetpart prints to
    write (the re-plan after a rank died, whose `replan --out` refuses a folder that exists)."""
    n = 1
    while os.path.lexists(path.with_name(path.name + (str(n) if n > 1 else ""))):
        n += 1
    return path.with_name(path.name + (str(n) if n > 1 else ""))


def fresh_dir(path: Path, what: str) -> Path:
    """An empty directory at `path` (a previous one removed): an error if a link or a file is there."""
    if path.is_symlink() or path.exists():
        shutil.rmtree(real_dir(path, what))
    try:
        path.mkdir()
    except OSError as err:
        raise HetpartError(f"cannot create '{path}' for {what}: {err.strerror}") from None
    return path


@contextlib.contextmanager
def exclusive_lock(path: Path, busy: str) -> Iterator[None]:
    """Hold an exclusive flock on the file `path` for the block, then remove it; `busy`: the error
    when another process holds it. An OSError if the file cannot be created.

    The file is opened with O_NOFOLLOW (a link there is an error) and O_CREAT but not O_EXCL: a
    lock file left by a killed run is locked by nobody and is taken over. Only an empty regular file
    is: anything else at `path` is someone's file, which the removal at the end would delete. A holder removes the file
    before it lets go, so a process that opened it just before checks, once locked, that the name
    still points to the file it locked, and tries again if not.
    """
    for _ in range(100):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise HetpartError(f"the lock file '{path}' is a symbolic link; remove it") from None
            raise  # the caller says what it could not create
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise HetpartError(busy) from None
        held = os.fstat(fd)
        try:
            now = os.lstat(path)
        except FileNotFoundError:
            now = None
        if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
            break
        os.close(fd)  # its holder removed it meanwhile: lock the new one
    else:
        raise HetpartError(busy)
    if not stat.S_ISREG(held.st_mode) or held.st_size > 0:  # hetpart's lock files are empty: this one is not its
        os.close(fd)
        raise HetpartError(f"'{path}' is there and is not an (empty) lock file hetpart left; hetpart would remove it "
                           "when done: move it away first")
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
        os.close(fd)
