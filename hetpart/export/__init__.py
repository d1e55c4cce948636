"""`hetpart export DIR --format F`: an artifacts directory's plan as another framework's config.

`layers.py` rounds a plan to whole layers (torch-free, also used by `partition`);
`formats.py` writes each framework's config from plan.json.
"""

from __future__ import annotations

import os
from pathlib import Path

from hetpart.errors import REDO_PARTITION, HetpartError
from hetpart.partitioner.simulate import SCHEDULES, VIRTUAL_SCHEDULES
from hetpart.export.formats import (
    FORMATS, Exported, export_accelerate, export_deepspeed, export_megatron, export_schedule_csv, export_torchtitan,
)

__all__ = ["FORMATS", "Exported", "export_plan", "export_text"]


def export_text(pj: dict, fmt: str, out_file: Path | None = None) -> Exported:
    """The config of format `fmt` for plan.json `pj`; `out_file`: where it will be written (torchtitan
    names its schedule CSV beside it)."""
    known = SCHEDULES + VIRTUAL_SCHEDULES
    if pj["schedule"] not in known:  # each format writes the schedule's order or name (an unknown one was a 1F1B CSV)
        raise HetpartError(f"plan.json's schedule {pj['schedule']!r} is not one hetpart plans ({', '.join(known)}): "
                           f"the plan was edited; {REDO_PARTITION}")
    if fmt == "torchtitan":
        csv_path = None if out_file is None else str(out_file.resolve().with_suffix(".schedule.csv"))
        return export_torchtitan(pj, csv_path)
    if fmt == "megatron":
        return export_megatron(pj)
    if fmt == "deepspeed":
        return export_deepspeed(pj)
    if fmt == "accelerate":
        return export_accelerate(pj)
    if fmt == "schedule-csv":
        return export_schedule_csv(pj, None if out_file is None else out_file.name)
    raise HetpartError(f"--format {fmt}: expected one of {', '.join(FORMATS)}")


def export_plan(out: Path, fmt: str, out_file: Path | None = None, key: Path | None = None,
                force: bool = False) -> Exported:
    """Read `out`'s plan.json through the artifacts' checks (manifest, sha256, `key`'s signature),
    and write the config to `out_file` (and its companions) if given: a file already there only with
    `force`, never one of an artifacts directory (NOTE [outputs outside the artifacts] in fsio.py).
    Nothing is written on an error."""
    from hetpart.fsio import AtomicWrites, check_not_special, check_outside_artifacts, replaces_input
    from hetpart.runtime.artifacts import load_manifest, read_plan
    from hetpart.trust import read_key

    manifest = load_manifest(out, read_key(key, out) if key is not None else None)
    pj = read_plan(out, manifest).to_json()  # checked by the one loader (NOTE [plan.json fields])
    result = export_text(pj, fmt, out_file)
    if out_file is not None:
        if out_file.is_dir():
            raise HetpartError(f"--out {out_file} is a directory; give a file name")
        targets = ({out_file: result.text} if result.main_file else {}) | {
            out_file.with_suffix(suffix): text for suffix, text in result.extra_files.items()}
        for path in targets:
            check_not_special(path, "--out", "leave out --out to print the config to stdout (`> FILE` keeps it)")
            check_outside_artifacts(path, "--out", follow=False)
            if replaces_input(path, {"--key": key}, follow=False):  # NOTE [an output is no input] in fsio.py
                raise HetpartError(f"--out: this export writes '{path}', which is the --key file {key} it reads: "
                                   "writing there would replace the key; nothing was written: choose another --out")
            if os.path.lexists(path) and not force:
                raise HetpartError(f"--out: '{path}' already exists; pass --force to replace it (this export writes "
                                   f"{' and '.join(map(str, targets))}), or choose another --out")
        with AtomicWrites() as w:
            for path, text in targets.items():
                w.write(path, text)
    return result
