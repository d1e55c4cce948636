"""What `hetpart run` prints when a training run with checkpoints stops before its last step: a rank died
(the re-plan onto the devices still alive, NOTE [checkpoint layout]) or the user stopped it (Ctrl-C, SIGTERM,
SIGHUP: the same plan resumed from the last complete checkpoint)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from hetpart.errors import HetpartError
from hetpart.fsio import unused_name
from hetpart.runtime.checkpoint import Checkpoint, CheckpointRun, manifest_of, complete_checkpoints, read_checkpoint, shown


def _model_flags(opts: Any) -> str:
    """A file model's consent to import it (`--model`, `--trust-model-file`), which `replan` and `run` both need
    again (NOTE [model files] in artifacts.py; review23: the printed commands failed without it)."""
    return (f"--model {shlex.quote(opts.model)} " if opts.model else "") + \
        ("--trust-model-file " if opts.trust_model_file else "")


def _flags(opts: Any) -> list[str]:
    """The run's own flags that a resume repeats."""
    return [f"--schedule {opts.schedule} "] + [f"{flag} {value} " for flag, value in (
        ("--microbatches", opts.microbatches), ("--batch-size", opts.batch_size), ("--seq-len", opts.seq_len))
        if value is not None] + ([_model_flags(opts)] if _model_flags(opts) else [])


def with_resume_commands(err: HetpartError, out: Path, run: CheckpointRun | None, opts: Any,
                         not_replanned: str | None = None) -> HetpartError:
    """A failed run's error, with the resume commands where a rank died and checkpoints were on."""
    if run is None or getattr(err, "dead_device", None) is None:
        return err
    new = type(err)(str(err) + resume_commands(out, run, err.dead_device, opts.steps, _flags(opts), not_replanned,
                                               _model_flags(opts)))
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


def last_checkpoint(run: CheckpointRun, steps: int) -> tuple[Checkpoint | None, int]:
    """The run's last complete checkpoint (None where none is) and the steps of a `steps`-step run left after it:
    the newest that this run wrote (checkpoint.json's `run` is its token), else the one it resumed from. Another
    run's in the same --checkpoint-dir is never named: it may be of another model or lr, or further along than
    this run got (review23)."""
    found = [p for p in complete_checkpoints(run.save_dir) if (manifest_of(p) or {}).get("run") == run.token] \
        if run.save_dir is not None else []
    path = found[-1] if found else run.resume
    last = read_checkpoint(path, check_tensors=False) if path is not None else None
    return last, run.first_step + steps - (last.step if last is not None else run.first_step)


def resume_line(out: Path, run: CheckpointRun, last: Path, left: int, flags: list[str]) -> str:
    """The `hetpart run OUT ... --resume LAST` that trains the `left` steps after the checkpoint `last`."""
    return (f"hetpart run {shown(out)} --mode training {''.join(flags)}--resume {shown(last)} "
            f"--steps {left} --checkpoint-every {run.every} --checkpoint-dir {shown(run.save_dir)}")


def resume_commands(out: Path, run: CheckpointRun, dead_device: str | None, steps: int, flags: list[str],
                    not_replanned: str | None = None, model_flags: str = "") -> str:
    """What `hetpart run` prints when a rank died: the last complete checkpoint and the commands that re-plan
    onto the devices still alive and resume from it (`flags`: the run's own, repeated). A plan `hetpart replan`
    refuses (`not_replanned` says what it runs: virtual stages, data-parallel pipelines at mixed degrees) gets the
    resume command after a new `partition` instead."""
    if run.save_dir is None:
        return ""
    last, left = last_checkpoint(run, steps)
    if last is None:
        return f"\nno checkpoint was complete before the failure (--checkpoint-dir {run.save_dir}): nothing to resume"
    if left <= 0:
        return f"\nthe last checkpoint, {last.path}, is of the run's last step {last.step}: nothing left to train"
    new = unused_name(out.with_name(out.name + "-replan"))  # one left by an earlier failure is not replaced
    resume = resume_line(new, run, last.path, left, flags)
    if not_replanned is not None:
        without = f" (without {dead_device})" if dead_device else ""
        return (f"\nthe last complete checkpoint is {shown(last.path)} (step {last.step}); this plan runs "
                f"{not_replanned}, which `hetpart replan` does not re-plan: partition the model again for the devices still "
                f"alive{without} with `--out {shown(new)}`, then train the {left} step(s) left:\n  {resume}")
    lose = f" --lose {shlex.quote(dead_device)}" if dead_device else ""
    # --checkpoint: the re-plan counts the bytes to move from what the checkpoint holds (NOTE [bytes from a
    # checkpoint]), which must be one this plan's run wrote: the checkpoint a resumed run started from may be another
    # plan's (the plan it was re-planned from), which `replan --checkpoint` refuses (rev25: the printed command
    # failed after a second failure), so without a checkpoint of its own the re-plan counts as the plan costs them.
    own = (manifest_of(last.path) or {}).get("run") == run.token
    checkpoint = f" --checkpoint {shown(last.path)}" if own else ""
    return (f"\nthe last complete checkpoint is {shown(last.path)} (step {last.step}); to re-plan onto the devices still "
            f"alive and train the {left} step(s) left:\n  hetpart replan {shown(out)}{lose}{checkpoint} "
            f"{model_flags}--out {shown(new)} && {resume}")
