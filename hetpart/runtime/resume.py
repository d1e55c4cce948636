"""What `hetpart run` prints when a training run with checkpoints stops before its last step: a rank died
(the re-plan onto the devices still alive, NOTE [checkpoint layout]) or the user stopped it (Ctrl-C, SIGTERM,
SIGHUP: the same plan resumed from the last complete checkpoint)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hetpart.errors import HetpartError
from hetpart.runtime.checkpoint import CheckpointRun, last_checkpoint, resume_commands, resume_line, shown


def _flags(opts: Any) -> list[str]:
    """The run's own flags that a resume repeats."""
    return [f"--schedule {opts.schedule} "] + [f"{flag} {value} " for flag, value in (
        ("--microbatches", opts.microbatches), ("--batch-size", opts.batch_size), ("--seq-len", opts.seq_len))
        if value is not None]


def with_resume_commands(err: HetpartError, out: Path, run: CheckpointRun | None, opts: Any,
                         not_replanned: str | None = None) -> HetpartError:
    """A failed run's error, with the resume commands where a rank died and checkpoints were on."""
    if run is None or getattr(err, "dead_device", None) is None:
        return err
    new = type(err)(str(err) + resume_commands(out, run, err.dead_device, opts.steps, _flags(opts), not_replanned))
    new.exit_code = err.exit_code
    return new


def stopped_resume(out: Path, run: CheckpointRun | None, opts: Any) -> str:
    """A training run the user stopped (Ctrl-C, SIGTERM, SIGHUP) with checkpoints on: the last complete checkpoint
    and the command that trains the steps left on the same plan ("" without checkpoints, or with none complete:
    then nothing can be resumed and the run's own message says enough)."""
    last, left = last_checkpoint(run, opts.steps) if run is not None else (None, 0)
    if last is None:
        return ""
    if left <= 0:
        return f"; the last checkpoint, {shown(last.path)}, is of the run's last step {last.step}"
    return (f"; the last complete checkpoint is {shown(last.path)} (step {last.step}); to train the {left} step(s) "
            f"left:\n  {resume_line(out, run, last.path, left, _flags(opts))}")
