"""Where `partition`'s output goes: built in a staging directory beside --out and renamed into place;
what `--force` may replace (the `.hetpart` marker, `run`'s logs marker and measured.json); what a
killed `partition` left. NOTE [what --force replaces], NOTE [stale staging directories].
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from hetpart.codegen.artifacts import FORMAT_VERSION, sha256, write_json
from hetpart.errors import HetpartError
from hetpart.fsio import (ARTIFACTS_MARKER, ARTIFACTS_OWNED_DIRS, check_outside_artifacts, exclusive_lock,
                          is_run_checkpoint, read_artifacts_marker)
from hetpart.procs import running
from hetpart.trust import NotAPlainFile

MARKER = ARTIFACTS_MARKER  # in every artifacts directory: the format version and every file partition wrote

# NOTE [what --force replaces]
# `partition --force` replaces a directory only if hetpart wrote everything in it. Every
# artifacts directory holds `.hetpart`, written last: the format version and the path of
# every file `partition` put there. `--force` checks that the marker is there and that each
# entry of the old directory is a listed file, a folder holding listed files, or what later
# commands add (`run`'s logs/ and measured.json, `shard-weights`' weights.safetensors in a
# rank folder); no symlink, no other file. Anything else (`.`, the folder of the model
# file, a project with NOTES.md, a directory without the marker or holding the current
# directory) is refused, naming the entry, and nothing is touched; a checkpoint of `run
# --checkpoint-dir` there (allowed at the top: NOTE [outputs outside the artifacts]) is named as
# one, with where to move it (`is_run_checkpoint`). It is checked before the run and again at
# publish time.
# The swap happens under an exclusive lock on `.<name>.lock` beside `--out`, taken before
# the first check and held to the rename (NOTE [safe writes] in fsio.py), so a second
# `partition` to the same --out fails at once instead of losing one result. A directory
# another program creates at --out meanwhile survives: the new output is published only
# into a directory this run just made with mkdir (rename(2) replaces an empty directory,
# and refuses a non-empty one), and an --out that appeared during the run is an error.
# The old directory is moved aside (`.<name>.old-*/x`) for the swap and put back on any
# failure, a signal included (`_swap`); a signal after that mkdir removes the empty directory.
# The marker's own format, apart from the manifest's: a later manifest format must not make
# --force refuse the directories earlier versions wrote.
#
# NOTE [stale staging directories]
# `partition` builds its output in `.<name>.tmp-XXXXXXXX` beside --out (mkdtemp: mode 0700, a
# random suffix), made only while it holds the lock `.<name>.lock` and removed before it lets go.
# A SIGKILL leaves it. Right after mkdtemp, `partition` writes `.hetpart-staging` into it (the
# --out name, its pid and host), and removes it before the artifacts marker is written. The next
# `partition` to the same --out, once it holds the lock (so no other live `partition` to that
# --out exists: each made its staging directory under it), removes every `.<name>.tmp-<8
# mkdtemp characters>` beside --out that is a real directory of this user holding that file,
# naming this --out, written on this host by a process that no longer runs (one that runs, a
# reused pid, or another host's: it is left, the safe side). A look-alike someone made (no such
# file), or a staging directory of an older hetpart, is left as it is; so is `.<name>.old-*`, which
# after a SIGKILL during --force's swap holds the only copy of the old artifacts (README, "Trust model").
#
# What later commands add must be theirs too. `run` writes `logs/.hetpart-logs` when it makes
# logs/ (listing nothing yet) and again once its torchruns end (success, failure, timeout,
# SIGTERM and Ctrl-C alike: a `finally`), listing with its sha256 each file then in logs/ whose
# path is one hetpart or torchrun makes (`LOG_NAME`: torchrun<i>.log, which `run` creates, and
# torchrun's [node<k>/]<run id>_<8 mkdtemp characters>/attempt_<n>/[<local rank>/]<stdout.log,
# stderr.log, error.json, filtered_std*.log>). A file another program wrote into logs/ during the
# run under any other name is not listed (the marker once listed every file there, and the next
# run or --force deleted it). logs/ may go only if the marker is there and lists every file in it
# with the sha256 it has now: a listed file someone changed since is theirs. A marker without
# digests (hetpart before this rule) lists nothing. A run killed with SIGKILL leaves its
# torchrun's files unlisted: they are refused too (the safe side; the user removes logs/).
# measured.json may go only if it is a JSON object with `stages` (a list) and `step_time_us`,
# the shape `run --measure` writes: it has no room for a marker, and a user's own file of that
# name is, with all but certainty, not of that shape. The same checks guard the next `run`,
# which replaces logs/ and measured.json in the same way (hetpart/runtime/launch.py).
MARKER_VERSION = 1
LATER_FILES = {"measured.json"}  # written by `run --measure`
LOGS_MARKER = ".hetpart-logs"  # in logs/: every file `run` (its torchruns) wrote there


# The paths inside logs/ that `run` (torchrun<i>.log) and its torchruns (--log-dir, one per node with
# --as-nodes) create: NOTE [what --force replaces]. torchrun names its run folder with mkdtemp.
LOG_NAME = re.compile(r"torchrun\d+\.log|(node\d+/)?[^/]+_[a-z0-9_]{8}/attempt_\d+/"
                      r"(\d+/(stdout\.log|stderr\.log|error\.json)|filtered_std(out|err)\.log)")


def write_logs_marker(log_dir: Path) -> None:
    """`log_dir`/.hetpart-logs, listing with its sha256 every file in `log_dir` now whose path is one
    hetpart or torchrun makes (NOTE [what --force replaces])."""
    files = {}
    for p in sorted(log_dir.rglob("*")):
        entry = p.relative_to(log_dir).as_posix()
        digest = _digest(p) if LOG_NAME.fullmatch(entry) else None  # unreadable: unlisted, never removed
        if digest is not None:
            files[entry] = digest
    write_json(log_dir / LOGS_MARKER, {"marker_version": MARKER_VERSION, "files": files})


def foreign_log(log_dir: Path) -> str | None:
    """The first entry of `log_dir` that `run` did not write (its path inside), or None: one the marker
    does not list, or whose sha256 is no longer the listed one. Without a readable marker no file is `run`'s."""
    marker = log_dir / LOGS_MARKER
    try:
        listed = json.loads(marker.read_text())["files"] if not marker.is_symlink() else {}
        listed = {k: v for k, v in listed.items() if isinstance(v, str)}  # a list: hetpart before digests
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        listed = {}
    for p in sorted(log_dir.rglob("*")):
        entry = p.relative_to(log_dir).as_posix()
        if p.is_symlink():
            return entry
        if p.is_dir() or entry == LOGS_MARKER:
            continue
        if entry not in listed or not LOG_NAME.fullmatch(entry) or _digest(p) != listed[entry]:
            return entry
    return None


def _digest(path: Path) -> str | None:
    """The sha256 of a plain file, None for a link, a folder or one that cannot be read."""
    try:
        return sha256(path)
    except (OSError, NotAPlainFile):
        return None


def is_measured_json(path: Path) -> bool:
    """Whether `path` holds what `run --measure` writes (NOTE [what --force replaces])."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(data, dict) and isinstance(data.get("stages"), list) and "step_time_us" in data


def _refuse(out: Path, why: str, todo: str = "remove it yourself") -> HetpartError:
    return HetpartError(f"--force replaces only a directory that hetpart wrote, and '{out}' {why}; nothing was "
                        f"changed: {todo}, or choose another --out")


def check_replaceable(out: Path) -> None:
    """An error unless every entry of `out` is one hetpart writes (NOTE [what --force replaces])."""
    try:
        marker = read_artifacts_marker(out)
    except ValueError as err:
        raise _refuse(out, f"has a {MARKER} marker this hetpart cannot read ({err})") from None
    if marker is None:
        raise _refuse(out, f"has no {MARKER} marker (it was not written by `hetpart partition`, or by a "
                           "version before markers)")
    version, listed = marker
    if version != MARKER_VERSION:
        raise _refuse(out, f"has a {MARKER} marker this hetpart cannot read (marker_version {version!r})")
    try:
        cwd = Path.cwd().resolve()
    except OSError:  # the current directory was removed: it is in no directory
        cwd = None
    if cwd is not None and (cwd == out or out in cwd.parents):
        raise _refuse(out, "holds the current directory", "run hetpart from outside it")
    folders = {str(parent) for f in listed for parent in Path(f).parents if str(parent) != "."}
    for root, dirs, files in os.walk(out):
        rel = Path(root).relative_to(out)
        for name in sorted(dirs + files):
            entry = (rel / name).as_posix()
            path = out / entry
            if path.is_symlink():
                raise _refuse(out, f"holds '{entry}', a symbolic link (hetpart writes none)", "remove the link")
            if name in dirs:
                ok = entry in folders or entry in ARTIFACTS_OWNED_DIRS
                foreign = foreign_log(path) if entry in ARTIFACTS_OWNED_DIRS and entry not in folders else None
                if foreign is not None:
                    raise _refuse(out, f"holds '{entry}/{foreign}', which hetpart did not write",
                                  f"move '{entry}/{foreign}' out of it")
            else:
                ok = path.is_file() and (entry in listed or entry == MARKER
                                         or (entry in LATER_FILES and is_measured_json(path))
                                         or (name == "weights.safetensors" and rel.as_posix() in folders))
            if not ok and name in dirs and is_run_checkpoint(path):  # a run's checkpoints: kept
                raise HetpartError(f"--force replaces only what `hetpart partition` wrote, and '{out}' holds "
                                   f"'{entry}', a run's checkpoint(s) that `hetpart run --checkpoint-dir` wrote "
                                   f"(--force never removes one); nothing was changed: move '{entry}' out of '{out}' "
                                   "(`run --resume` reads it from any place), or choose another --out")
            if not ok:
                raise _refuse(out, f"holds '{entry}', which hetpart did not write", f"move '{entry}' out of it")
        dirs[:] = [d for d in dirs if (rel / d).as_posix() not in ARTIFACTS_OWNED_DIRS]


def check_out(out: Path, force: bool) -> None:
    """What `staging_dir` checks of `out` before it makes anything: an error where it would refuse `out`; for a
    command that works a while before it writes (`replan` re-plans first, and printed a plan it then did not write)."""
    _checked_out(out, force)


def _checked_out(out: Path, force: bool) -> tuple[Path, bool]:
    """`out` as written to (absolute, no link: `_no_link`), and whether it exists (then replaceable: `_check_out`)."""
    out = _no_link(out)
    check_outside_artifacts(out, "--out")  # NOTE [outputs outside the artifacts] in fsio.py
    return out, _check_out(out, force)


def _check_out(out: Path, force: bool) -> bool:
    """Whether `out` exists (then --force was given and hetpart wrote it); an error otherwise."""
    if not out.exists():
        return False
    if not out.is_dir():  # before --force's advice: --force replaces no file
        raise HetpartError(f"output path '{out}' exists and is not a directory; choose another --out")
    if not force:
        raise HetpartError(f"output directory '{out}' already exists; pass --force to replace it")
    check_replaceable(out)
    return True


def _write_marker(tmp: Path) -> None:
    files = sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file())
    man = tmp / "manifest.json"  # its version (a plan of mixed TP degrees: 3, NOTE [mixed-degree pipeline])
    version = json.loads(man.read_text()).get("format_version", FORMAT_VERSION) if man.is_file() else FORMAT_VERSION
    write_json(tmp / MARKER, {"marker_version": MARKER_VERSION, "format_version": version, "files": files})


def _publish_new(tmp: Path, out: Path) -> None:
    """Rename `tmp` to `out`, which must not exist: into an empty directory made here first, as rename(2)
    would silently replace an empty directory someone else created (NOTE [what --force replaces])."""
    try:
        out.mkdir()
    except FileExistsError:
        raise _appeared(out) from None
    try:
        os.rename(tmp, out)
    except OSError:  # someone wrote into the directory just made: it is theirs now
        raise _appeared(out) from None
    except BaseException:  # a signal before the rename: the directory made here goes (if still empty)
        with contextlib.suppress(OSError):
            out.rmdir()
        raise


def _swap(tmp: Path, out: Path, parent: Path) -> None:
    """Replace `out` by `tmp`: the old one is moved aside, and put back on any failure, a signal
    (KeyboardInterrupt, SIGTERM's exception) included, so `out` is never left missing or empty."""
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=parent))
    try:
        os.rename(out, old / "x")
        _publish_new(tmp, out)
    except BaseException:
        if os.path.lexists(old / "x"):
            with contextlib.suppress(OSError):
                os.rename(old / "x", out)
        raise
    finally:
        if not os.path.lexists(old / "x"):  # never remove the old artifacts that could not be put back
            with contextlib.suppress(OSError):
                old.rmdir()
    shutil.rmtree(old, ignore_errors=True)


def _appeared(out: Path) -> HetpartError:
    return HetpartError(f"'{out}' was created by another program while this partition ran; it was left as it is "
                        "and this run's output discarded: run again with another --out")


def _no_link(out: Path) -> Path:
    """`out` made absolute; an error if it is a symbolic link (dangling or not) or if a folder it needs
    would be created inside one: hetpart never writes, creates or replaces through a link."""
    out = Path(os.path.abspath(out))
    if out.is_symlink():
        raise HetpartError(f"--out {out} is a symbolic link; hetpart never writes through a link: pass the directory "
                           "it points to, or remove the link")
    missing = out.parent
    while not os.path.lexists(missing) and missing != missing.parent:
        missing = missing.parent
    if missing.is_symlink() and (missing != out.parent or not missing.is_dir()):  # a dangling one: its target
        raise HetpartError(f"--out {out}: '{missing}' is a symbolic link, and hetpart creates no folder through a "
                           "link: create the folders yourself, or choose another --out")
    return out.resolve()  # the links above it that exist: only the last name matters to the checks


# In a staging directory of `partition` while it builds: NOTE [stale staging directories].
STAGING_MARKER = ".hetpart-staging"
STAGING_SUFFIX = re.compile(r"[a-z0-9_]{8}")  # mkdtemp's


def _remove_stale_staging(parent: Path, name: str) -> None:
    """Remove what a killed `partition` to `parent/name` left (NOTE [stale staging directories]); call
    only while holding its lock."""
    prefix = f".{name}.tmp-"
    for entry in sorted(os.listdir(parent)):
        path = parent / entry
        if not entry.startswith(prefix) or not STAGING_SUFFIX.fullmatch(entry[len(prefix):]):
            continue
        try:
            st = os.lstat(path)
            marker = os.lstat(path / STAGING_MARKER)
            owner = json.loads((path / STAGING_MARKER).read_text())
        except (OSError, ValueError, RecursionError):
            continue
        if (not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or not stat.S_ISREG(marker.st_mode)
                or not isinstance(owner, dict) or owner.get("staging_for") != name
                or not isinstance(owner.get("pid"), int) or owner.get("host") != socket.gethostname()
                or running(owner["pid"])):
            continue
        shutil.rmtree(path, ignore_errors=True)  # never follows a link inside


@contextlib.contextmanager
def staging_dir(out: Path, force: bool) -> Iterator[Path]:
    """A fresh directory beside `out`, renamed to `out` only if the block succeeds.

    On failure nothing is left: not the directory, nor the parent directories it created.
    With `force`, an existing `out` is replaced only if hetpart wrote it (NOTE [what --force replaces]).
    """
    out, existed = _checked_out(out, force)
    parent = out.parent
    created = [p for p in (parent, *parent.parents) if not p.exists()]  # deepest first
    done = False
    try:
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            blocker = next((p for p in (parent, *parent.parents) if p.exists() and not p.is_dir()), None)
            why = f"'{blocker}' is a file, not a directory" if blocker else f"{err.strerror} in '{parent}'"
            raise HetpartError(f"cannot create the output directory '{out}': {why}; choose another --out") from None
        lock = parent / f".{out.name}.lock"
        with contextlib.ExitStack() as held:
            try:
                held.enter_context(exclusive_lock(lock, f"another `hetpart partition` is writing '{out}' now (it "
                                                        f"holds {lock}); wait for it to end or choose another --out"))
                existed = _check_out(out, force)  # again, now that no other hetpart can change it
                _remove_stale_staging(parent, out.name)  # NOTE [stale staging directories]
                tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=parent))
                write_json(tmp / STAGING_MARKER, {"staging_for": out.name, "pid": os.getpid(),
                                                  "host": socket.gethostname()})
            except OSError as err:
                raise HetpartError(f"cannot create the output directory '{out}': {err.strerror} in '{parent}'; "
                                   "choose another --out") from None
            try:
                yield tmp
                (tmp / STAGING_MARKER).unlink()
                _write_marker(tmp)
                umask = os.umask(0)
                os.umask(umask)
                tmp.chmod(0o777 & ~umask)  # mkdtemp's 0700 would hide the artifacts from other users
                if not (out.exists() or out.is_symlink()):
                    _publish_new(tmp, out)
                elif not existed or out.is_symlink():
                    raise _appeared(out)
                else:
                    check_replaceable(out)  # as it is now
                    _swap(tmp, out, parent)
                done = True
            finally:
                if tmp.exists():
                    shutil.rmtree(tmp, ignore_errors=True)
    finally:
        for p in created if not done else []:
            with contextlib.suppress(OSError):  # not empty: someone else wrote there meanwhile
                p.rmdir()
